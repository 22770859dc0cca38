#include "model/llama/llama_weights.h"

#include <cmath>
#include <cstdlib>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/gguf_reader.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

// A 2-D matrix tensor [cols (contiguous), rows] as a WeightView.
absl::StatusOr<WeightView> Matrix(const GgufFile& file, const std::string& name, int64_t rows,
                                  int64_t cols) {
  const GgufTensorInfo* t = file.FindTensor(name);
  if (t == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
  if (t->dims.size() != 2 || t->dims[0] != cols || t->dims[1] != rows) {
    std::string dims;
    for (int64_t d : t->dims) absl::StrAppend(&dims, dims.empty() ? "" : ", ", d);
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor %s has dims [%s], expected [%d, %d]", name, dims, cols, rows));
  }
  WeightView w;
  w.type = t->type;
  w.data = file.TensorData(*t);
  w.rows = rows;
  w.cols = cols;
  w.row_stride = GgmlRowBytes(t->type, cols);
  return w;
}

// Output rows [begin, begin + count) of w.
WeightView RowSlice(const WeightView& w, int64_t begin, int64_t count) {
  WeightView s = w;
  s.data = static_cast<const uint8_t*>(w.data) + begin * w.row_stride;
  s.rows = count;
  return s;
}

// Input columns [begin, begin + count) of w; both must be multiples of the block size.
absl::StatusOr<WeightView> ColSlice(const WeightView& w, int64_t begin, int64_t count,
                                    const std::string& name) {
  const int block = GgmlBlockSize(w.type);
  if (begin % block != 0 || count % block != 0) {
    return absl::InvalidArgumentError(
        absl::StrFormat("tensor %s: column slice [%d, %d) is not aligned to its %d-value blocks",
                        name, begin, begin + count, block));
  }
  WeightView s = w;
  s.data = static_cast<const uint8_t*>(w.data) + GgmlRowBytes(w.type, begin);
  s.cols = count;
  return s;
}

}  // namespace

WeightView ConvertToComputeType(const WeightView& v,
                                std::vector<std::unique_ptr<std::vector<uint8_t>>>* owned) {
  if (!IsConvertedType(v.type)) return v;
  WeightView c = v;
  c.type = ComputeTypeOf(v.type);
  c.row_stride = GgmlRowBytes(c.type, v.cols);
  c.packed = nullptr;
  auto buffer = std::make_unique<std::vector<uint8_t>>(c.row_stride * v.rows);
  const auto* src = static_cast<const uint8_t*>(v.data);
  for (int64_t r = 0; r < v.rows; ++r) {
    ConvertRowToComputeType(v.type, src + r * v.row_stride, buffer->data() + r * c.row_stride,
                            v.cols);
  }
  c.data = buffer->data();
  owned->push_back(std::move(buffer));
  return c;
}

absl::StatusOr<ShardHeads> HeadsOfShard(const LlamaConfig& config, ShardSpec shard) {
  const int t = shard.size;
  if (t < 1 || shard.rank < 0 || shard.rank >= t) {
    return absl::InvalidArgumentError(
        absl::StrFormat("invalid shard %d of %d", shard.rank, shard.size));
  }
  const int n_kv = config.n_kv_heads;
  if (n_kv < 1 || config.n_heads % t != 0 || config.d_ff % t != 0 ||
      (n_kv % t != 0 && t % n_kv != 0)) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "tensor-parallel size %d must divide head_count %d and feed_forward_length %d, and "
        "divide head_count_kv %d or be a multiple of it",
        t, config.n_heads, config.d_ff, n_kv));
  }
  ShardHeads h;
  h.q_count = config.n_heads / t;
  h.q_begin = shard.rank * h.q_count;
  if (n_kv % t == 0) {
    h.kv_count = n_kv / t;
    h.kv_begin = shard.rank * h.kv_count;
  } else {
    // Each kv head's query heads span t / n_kv ranks: rank r's all belong to kv head
    // r / (t / n_kv) (heads [g k, g (k + 1)) use kv head k, g = n_heads / n_kv).
    h.kv_replicas = t / n_kv;
    h.kv_count = 1;
    h.kv_begin = shard.rank / h.kv_replicas;
  }
  return h;
}

namespace {

// Whether a K bias is also taken off the keys after RoPE (LayerWeights::k_offset): on unless
// SPECNODE_KEY_OFFSET=0 (the A/B of docs/kvstore.md); read once per process.
bool KeyOffsetEnabled() {
  static const bool on = [] {
    const char* v = std::getenv("SPECNODE_KEY_OFFSET");
    return v == nullptr || std::string_view(v) != "0";
  }();
  return on;
}

}  // namespace

absl::StatusOr<LlamaWeights> LoadLlamaWeights(const GgufFile& file, const LlamaConfig& config,
                                              ShardSpec shard, int n_layers) {
  SPECNODE_ASSIGN_OR_RETURN(const ShardHeads heads, HeadsOfShard(config, shard));
  const int t = shard.size;
  if (n_layers < 0) n_layers = config.n_layers;
  if (n_layers == 0 || n_layers > config.n_layers) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot load %d layers of a %d-layer model", n_layers, config.n_layers));
  }
  LlamaWeights w;
  w.shard = shard;
  w.n_heads_local = heads.q_count;
  w.n_kv_heads_local = heads.kv_count;
  w.d_ff_local = config.d_ff / t;
  const int64_t hd = config.head_dim;
  const int64_t d = config.d_model;

  // Vectors (norms, biases): values [begin, begin + count) of a 1-D tensor of `len`
  // values, as f32 views or converted copies for other storage types.
  auto vec = [&](const std::string& name, int64_t len, int64_t begin,
                 int64_t count) -> absl::StatusOr<const float*> {
    const GgufTensorInfo* info = file.FindTensor(name);
    if (info == nullptr) return absl::InvalidArgumentError(absl::StrCat("missing tensor ", name));
    if (info->dims.size() != 1 || info->dims[0] != len) {
      return absl::InvalidArgumentError(absl::StrCat("tensor ", name, " is not [", len, "]"));
    }
    const auto* data = static_cast<const uint8_t*>(file.TensorData(*info));
    if (info->type == GgmlType::kF32) return reinterpret_cast<const float*>(data) + begin;
    const int block = GgmlBlockSize(info->type);
    if (begin % block != 0 || count % block != 0) {
      return absl::InvalidArgumentError(
          absl::StrFormat("tensor %s: slice [%d, %d) is not aligned to its %d-value blocks", name,
                          begin, begin + count, block));
    }
    std::vector<float>& owned = w.owned_norms.emplace_back(count);
    DequantizeRow(info->type, data + GgmlRowBytes(info->type, begin), owned.data(), count);
    return static_cast<const float*>(owned.data());
  };
  auto norm = [&](const std::string& name) { return vec(name, d, 0, d); };
  // Moving an inner vector keeps its buffer, so views stay valid as owned_norms grows.
  w.owned_norms.reserve(9 * n_layers + 1);
  w.head_dim = config.head_dim;

  // Input columns [begin, begin + count) of v; a storage type whose blocks the range cuts
  // (a K-quant's 256 values; a shard's range need only be whole 32-value blocks) is
  // converted first, as a whole, to its 32-value compute type.
  auto col_slice = [&](const WeightView& v, int64_t begin, int64_t count,
                       const std::string& name) -> absl::StatusOr<WeightView> {
    const int block = GgmlBlockSize(v.type);
    const bool cut = begin % block != 0 || count % block != 0;
    return ColSlice(cut && IsConvertedType(v.type) ? ConvertToComputeType(v, &w.owned_matrices) : v,
                    begin, count, name);
  };
  SPECNODE_ASSIGN_OR_RETURN(w.token_embd, Matrix(file, "token_embd.weight", config.vocab_size, d));
  SPECNODE_ASSIGN_OR_RETURN(w.output_norm, norm("output_norm.weight"));
  if (config.rope_scale != 1.0f) {
    if (file.FindTensor("rope_freqs.weight") != nullptr) {
      return absl::UnimplementedError(
          "rope_freqs.weight together with linear rope scaling is not supported");
    }
    w.rope_freqs_len = config.rope_dim / 2;
    std::vector<float>& f = w.owned_norms.emplace_back(w.rope_freqs_len, config.rope_scale);
    w.rope_linear = f.data();
  }
  if (file.FindTensor("rope_freqs.weight") != nullptr) {
    w.rope_freqs_len = config.rope_dim / 2;
    SPECNODE_ASSIGN_OR_RETURN(w.rope_freqs,
                              vec("rope_freqs.weight", w.rope_freqs_len, 0, w.rope_freqs_len));
    for (int i = 0; i < w.rope_freqs_len; ++i) {
      if (!(w.rope_freqs[i] > 0.0f) || !std::isfinite(w.rope_freqs[i])) {
        return absl::InvalidArgumentError(
            absl::StrCat("rope_freqs.weight[", i, "] = ", w.rope_freqs[i], " is not positive"));
      }
    }
  }
  if (config.tied_embeddings) {
    w.output = w.token_embd;
  } else {
    SPECNODE_ASSIGN_OR_RETURN(w.output, Matrix(file, "output.weight", config.vocab_size, d));
  }
  const int64_t q_begin = heads.q_begin * hd;
  const int64_t q_count = heads.q_count * hd;
  const int64_t kv_begin = heads.kv_begin * hd;
  const int64_t kv_count = heads.kv_count * hd;
  const int64_t ff_begin = shard.rank * w.d_ff_local;
  const int64_t ff_count = w.d_ff_local;
  for (int l = 0; l < n_layers; ++l) {
    const std::string p = absl::StrCat("blk.", l, ".");
    LayerWeights lw;
    SPECNODE_ASSIGN_OR_RETURN(lw.attn_norm, norm(p + "attn_norm.weight"));
    SPECNODE_ASSIGN_OR_RETURN(lw.ffn_norm, norm(p + "ffn_norm.weight"));
    SPECNODE_ASSIGN_OR_RETURN(WeightView wq, Matrix(file, p + "attn_q.weight", config.q_dim(), d));
    SPECNODE_ASSIGN_OR_RETURN(WeightView wk, Matrix(file, p + "attn_k.weight", config.kv_dim(), d));
    SPECNODE_ASSIGN_OR_RETURN(WeightView wv, Matrix(file, p + "attn_v.weight", config.kv_dim(), d));
    SPECNODE_ASSIGN_OR_RETURN(WeightView wo,
                              Matrix(file, p + "attn_output.weight", d, config.q_dim()));
    SPECNODE_ASSIGN_OR_RETURN(WeightView wg, Matrix(file, p + "ffn_gate.weight", config.d_ff, d));
    SPECNODE_ASSIGN_OR_RETURN(WeightView wu, Matrix(file, p + "ffn_up.weight", config.d_ff, d));
    SPECNODE_ASSIGN_OR_RETURN(WeightView wd, Matrix(file, p + "ffn_down.weight", d, config.d_ff));
    if (config.arch.qkv_bias) {
      SPECNODE_ASSIGN_OR_RETURN(lw.bq, vec(p + "attn_q.bias", config.q_dim(), q_begin, q_count));
      SPECNODE_ASSIGN_OR_RETURN(lw.bk, vec(p + "attn_k.bias", config.kv_dim(), kv_begin, kv_count));
      SPECNODE_ASSIGN_OR_RETURN(lw.bv, vec(p + "attn_v.bias", config.kv_dim(), kv_begin, kv_count));
      if (KeyOffsetEnabled()) {
        std::vector<float>& offset = w.owned_norms.emplace_back(lw.bk, lw.bk + kv_count);
        for (float& x : offset) x = -x;
        lw.k_offset = offset.data();
      }
    }
    if (config.arch.post_norms) {
      SPECNODE_ASSIGN_OR_RETURN(lw.post_attn_norm, norm(p + "post_attention_norm.weight"));
      SPECNODE_ASSIGN_OR_RETURN(lw.post_ffn_norm, norm(p + "post_ffw_norm.weight"));
    }
    if (config.arch.qk_norm) {
      SPECNODE_ASSIGN_OR_RETURN(lw.q_norm, vec(p + "attn_q_norm.weight", hd, 0, hd));
      SPECNODE_ASSIGN_OR_RETURN(lw.k_norm, vec(p + "attn_k_norm.weight", hd, 0, hd));
    }
    lw.wq = RowSlice(wq, q_begin, q_count);
    lw.wk = RowSlice(wk, kv_begin, kv_count);
    lw.wv = RowSlice(wv, kv_begin, kv_count);
    lw.w_gate = RowSlice(wg, ff_begin, ff_count);
    lw.w_up = RowSlice(wu, ff_begin, ff_count);
    SPECNODE_ASSIGN_OR_RETURN(lw.wo, col_slice(wo, q_begin, q_count, p + "attn_output.weight"));
    SPECNODE_ASSIGN_OR_RETURN(lw.w_down, col_slice(wd, ff_begin, ff_count, p + "ffn_down.weight"));
    w.layers.push_back(lw);
  }
  return w;
}

absl::StatusOr<LlamaWeights> MapWeightViews(const LlamaWeights& w, const WeightMatrixMap& matrix,
                                            const WeightNormMap& norm) {
  const int64_t dm = w.token_embd.cols;
  LlamaWeights v;
  v.shard = w.shard;
  v.n_heads_local = w.n_heads_local;
  v.n_kv_heads_local = w.n_kv_heads_local;
  v.d_ff_local = w.d_ff_local;
  v.head_dim = w.head_dim;
  v.activations = w.activations;
  SPECNODE_ASSIGN_OR_RETURN(v.token_embd, matrix(w.token_embd));
  if (w.output.data == w.token_embd.data) {
    v.output = v.token_embd;  // tied: one copy
  } else {
    SPECNODE_ASSIGN_OR_RETURN(v.output, matrix(w.output));
  }
  SPECNODE_ASSIGN_OR_RETURN(v.output_norm, norm(w.output_norm, dm));
  v.rope_freqs_len = w.rope_freqs_len;
  if (w.rope_linear != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(v.rope_linear, norm(w.rope_linear, w.rope_freqs_len));
  }
  if (w.rope_freqs != nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(v.rope_freqs, norm(w.rope_freqs, w.rope_freqs_len));
  }
  for (const LayerWeights& lw : w.layers) {
    LayerWeights l;
    SPECNODE_ASSIGN_OR_RETURN(l.attn_norm, norm(lw.attn_norm, dm));
    SPECNODE_ASSIGN_OR_RETURN(l.ffn_norm, norm(lw.ffn_norm, dm));
    // Optional vectors stay null when absent.
    auto opt = [&](const float* p, int64_t len) -> absl::StatusOr<const float*> {
      if (p == nullptr) return nullptr;
      return norm(p, len);
    };
    const int64_t q_rows = lw.wq.rows, kv_rows = lw.wk.rows;
    SPECNODE_ASSIGN_OR_RETURN(l.bq, opt(lw.bq, q_rows));
    SPECNODE_ASSIGN_OR_RETURN(l.bk, opt(lw.bk, kv_rows));
    SPECNODE_ASSIGN_OR_RETURN(l.bv, opt(lw.bv, kv_rows));
    SPECNODE_ASSIGN_OR_RETURN(l.k_offset, opt(lw.k_offset, kv_rows));
    SPECNODE_ASSIGN_OR_RETURN(l.q_norm, opt(lw.q_norm, w.head_dim));
    SPECNODE_ASSIGN_OR_RETURN(l.k_norm, opt(lw.k_norm, w.head_dim));
    SPECNODE_ASSIGN_OR_RETURN(l.post_attn_norm, opt(lw.post_attn_norm, dm));
    SPECNODE_ASSIGN_OR_RETURN(l.post_ffn_norm, opt(lw.post_ffn_norm, dm));
    SPECNODE_ASSIGN_OR_RETURN(l.wq, matrix(lw.wq));
    SPECNODE_ASSIGN_OR_RETURN(l.wk, matrix(lw.wk));
    SPECNODE_ASSIGN_OR_RETURN(l.wv, matrix(lw.wv));
    SPECNODE_ASSIGN_OR_RETURN(l.wo, matrix(lw.wo));
    SPECNODE_ASSIGN_OR_RETURN(l.w_gate, matrix(lw.w_gate));
    SPECNODE_ASSIGN_OR_RETURN(l.w_up, matrix(lw.w_up));
    SPECNODE_ASSIGN_OR_RETURN(l.w_down, matrix(lw.w_down));
    v.layers.push_back(l);
  }
  return v;
}

}  // namespace specnode
