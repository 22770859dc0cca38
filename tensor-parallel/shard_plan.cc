#include "tensor-parallel/shard_plan.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/gguf/ggml_types.h"
#include "model/gguf/gguf_reader.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

std::string ModelName(const LlamaConfig& c) {
  if (c.name.empty()) return "the model's";
  // "SmolLM2 135M Instruct" -> "SmolLM2's" reads better than the whole name.
  const std::string first = c.name.substr(0, c.name.find(' '));
  return absl::StrCat(first, "'s");
}

// Why `t` is not a valid size for `c`, or "" when it is.
std::string Problem(const LlamaConfig& c, int t) {
  const std::string who = ModelName(c);
  if (t < 1) return absl::StrCat("tensor parallelism must be at least 1, got ", t);
  if (t > c.n_kv_heads && t % c.n_kv_heads != 0) {
    return absl::StrFormat(
        "tensor parallelism %d exceeds %s %d KV heads and is not a multiple of them (each KV "
        "head is replicated on T / %d ranks)",
        t, who, c.n_kv_heads, c.n_kv_heads);
  }
  if (t < c.n_kv_heads && c.n_kv_heads % t != 0) {
    return absl::StrFormat("tensor parallelism %d does not divide %s %d KV heads", t, who,
                           c.n_kv_heads);
  }
  if (c.n_heads % t != 0) {
    return absl::StrFormat("tensor parallelism %d does not divide %s %d attention heads", t, who,
                           c.n_heads);
  }
  if (c.d_ff % t != 0) {
    return absl::StrFormat("tensor parallelism %d does not divide %s feed-forward size %d", t, who,
                           c.d_ff);
  }
  const int q_slice = c.q_dim() / t;
  if (q_slice % ShardPlan::kColumnBlock != 0) {
    return absl::StrFormat(
        "tensor parallelism %d gives %s attention-output slices of %d columns, not a multiple "
        "of the %d-value quantisation block",
        t, who, q_slice, ShardPlan::kColumnBlock);
  }
  const int ff_slice = c.d_ff / t;
  if (ff_slice % ShardPlan::kColumnBlock != 0) {
    return absl::StrFormat(
        "tensor parallelism %d gives %s feed-forward slices of %d units, not a multiple of "
        "the %d-value quantisation block",
        t, who, ff_slice, ShardPlan::kColumnBlock);
  }
  return "";
}

}  // namespace

std::vector<int> ShardPlan::ValidSizes(const LlamaConfig& config) {
  std::vector<int> sizes;
  for (int t = 1; t <= std::max(1, config.n_heads); ++t) {
    if (Problem(config, t).empty()) sizes.push_back(t);
  }
  if (sizes.empty()) sizes.push_back(1);
  return sizes;
}

absl::StatusOr<ShardPlan> ShardPlan::Create(const LlamaConfig& config, int tp_size) {
  if (config.n_heads <= 0 || config.n_kv_heads <= 0 || config.head_dim <= 0 || config.d_ff <= 0 ||
      config.d_model <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cannot plan tensor parallelism for an incomplete config: ", config.Summary()));
  }
  // TP 1 is always valid (nothing is sliced), whatever the block rules say.
  if (tp_size != 1) {
    if (const std::string problem = Problem(config, tp_size); !problem.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat(problem, "; use ", absl::StrJoin(ValidSizes(config), " or ")));
    }
  }
  ShardPlan plan;
  plan.config_ = config;
  const int t = tp_size;
  const int ff = config.d_ff / t;
  for (int r = 0; r < t; ++r) {
    // The loader's slicing, so the plan and the shards agree by construction.
    SPECNODE_ASSIGN_OR_RETURN(const ShardHeads h, HeadsOfShard(config, ShardSpec{r, t}));
    RankShard s;
    s.rank = r;
    s.heads = {h.q_begin, h.q_begin + h.q_count};
    s.kv_heads = {h.kv_begin, h.kv_begin + h.kv_count};
    s.ffn = {r * ff, (r + 1) * ff};
    s.q_cols = {h.q_begin * config.head_dim, (h.q_begin + h.q_count) * config.head_dim};
    plan.kv_replicas_ = h.kv_replicas;
    plan.ranks_.push_back(s);
  }
  return plan;
}

absl::StatusOr<ShardPlan> ShardPlan::ForFile(const GgufFile& file, const LlamaConfig& config,
                                             int tp_size) {
  auto plan = Create(config, tp_size);
  if (!plan.ok()) return plan.status();
  const int t = tp_size;
  // The share of K and V rows a rank holds: its kv heads of all (1 / t, or one head of
  // n_kv_heads under replication).
  const int64_t kv_held = plan->rank(0).kv_heads.count(), kv_all = config.n_kv_heads;
  int64_t sharded = 0, replicated = 0;
  for (const GgufTensorInfo& info : file.tensors()) {
    const std::string& n = info.name;
    const bool kv = n.ends_with("attn_k.weight") || n.ends_with("attn_v.weight") ||
                    n.ends_with("attn_k.bias") || n.ends_with("attn_v.bias");
    // Q/K/V biases (qwen2) follow their matrices' rows; a vector's "rows" are its values.
    if (n.ends_with("attn_q.bias")) {
      sharded += static_cast<int64_t>(info.n_bytes) / t;
      continue;
    }
    if (kv && n.ends_with(".bias")) {
      sharded += static_cast<int64_t>(info.n_bytes) * kv_held / kv_all;
      continue;
    }
    const bool row_split = n.ends_with("attn_q.weight") || n.ends_with("attn_k.weight") ||
                           n.ends_with("attn_v.weight") || n.ends_with("ffn_gate.weight") ||
                           n.ends_with("ffn_up.weight");
    const bool col_split = n.ends_with("attn_output.weight") || n.ends_with("ffn_down.weight");
    if (!(row_split || col_split)) {
      replicated += static_cast<int64_t>(info.n_bytes);
      continue;
    }
    if (info.dims.size() != 2) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", n, " is not a matrix"));
    }
    const int64_t cols = info.dims[0], rows = info.dims[1];
    if (kv) {
      sharded += static_cast<int64_t>(GgmlRowBytes(info.type, cols)) * (rows * kv_held / kv_all);
    } else if (row_split) {
      sharded += static_cast<int64_t>(GgmlRowBytes(info.type, cols)) * (rows / t);
    } else {
      sharded += static_cast<int64_t>(GgmlRowBytes(info.type, cols / t)) * rows;
    }
  }
  for (int r = 0; r < t; ++r) {
    plan->ranks_[r].sharded_bytes = sharded;
    plan->ranks_[r].replicated_bytes = replicated;
  }
  return plan;
}

std::string ShardPlan::Summary() const {
  const RankShard& s = ranks_[0];
  return absl::StrFormat(
      "TP %d over %s: per rank %d heads, %d kv heads%s, %d ffn units", size(), config_.Summary(),
      s.heads.count(), s.kv_heads.count(),
      kv_replicas_ > 1 ? absl::StrCat(" (each on ", kv_replicas_, " ranks)") : std::string(),
      s.ffn.count());
}

}  // namespace specnode
