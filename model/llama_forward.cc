#include "model/llama_forward.h"

#include <cmath>

#include "absl/strings/str_format.h"
#include "model/cpu_ops.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

// Elementwise work split across the pool from this many values on (a hand-off costs about
// as much as ~1000 exp evaluations).
constexpr int64_t kMinParallelElementwise = 1024;
// RoPE is split across the pool from this many tokens on.
constexpr int64_t kMinParallelRopeTokens = 4;

}  // namespace

LlamaForward::LlamaForward(const LlamaConfig& config, const LlamaWeights& weights, ThreadPool* pool,
                           PartialSumReducer* reducer)
    : config_(config), w_(weights), pool_(pool), reducer_(reducer) {}

absl::StatusOr<int64_t> ValidateBatch(std::span<const BatchEntry> batch, int32_t vocab_size) {
  int64_t n = 0;
  for (const BatchEntry& e : batch) {
    if (e.tokens.empty()) return absl::InvalidArgumentError("batch entry without tokens");
    for (int32_t t : e.tokens) {
      if (t < 0 || t >= vocab_size) {
        return absl::InvalidArgumentError(
            absl::StrFormat("token id %d outside the vocabulary [0, %d)", t, vocab_size));
      }
    }
    for (const BatchEntry& other : batch) {
      if (&other != &e && other.seq == e.seq) {
        return absl::InvalidArgumentError(
            absl::StrFormat("sequence %d appears twice in one batch", e.seq));
      }
    }
    n += static_cast<int64_t>(e.tokens.size());
  }
  return n;
}

std::vector<int64_t> LogitRows(std::span<const BatchEntry> batch) {
  std::vector<int64_t> rows;
  int64_t row = 0;
  for (const BatchEntry& e : batch) {
    const int64_t count = static_cast<int64_t>(e.tokens.size());
    if (e.all_logits) {
      for (int64_t j = 0; j < count; ++j) rows.push_back(row + j);
    } else {
      rows.push_back(row + count - 1);
    }
    row += count;
  }
  return rows;
}

absl::Status LlamaForward::Forward(std::span<const BatchEntry> batch, KvCache* cache,
                                   std::vector<float>* logits) {
  SPECNODE_ASSIGN_OR_RETURN(const int64_t n, ValidateBatch(batch, config_.vocab_size));
  // Reserve everything first; undo on failure so the cache is unchanged.
  std::vector<int32_t> pos0(batch.size());
  for (size_t i = 0; i < batch.size(); ++i) {
    pos0[i] = cache->Length(batch[i].seq);
    absl::Status s = cache->Reserve(batch[i].seq, static_cast<int32_t>(batch[i].tokens.size()));
    if (!s.ok()) {
      for (size_t j = 0; j < i; ++j) {
        if (pos0[j] == 0) cache->Free(batch[j].seq);
      }
      if (pos0[i] == 0) cache->Free(batch[i].seq);
      return s;
    }
  }

  const int d = config_.d_model;
  x_.resize(n * d);
  positions_.resize(n);
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    for (size_t j = 0; j < batch[i].tokens.size(); ++j, ++row) {
      EmbeddingRow(w_.token_embd, batch[i].tokens[j], x_.data() + row * d);
      positions_[row] = pos0[i] + static_cast<int32_t>(j);
    }
  }
  // RoPE angles depend on the position only: once per pass, not per layer and head.
  rope_table_.resize(static_cast<size_t>(n) * config_.rope_dim);
  RopeAngles(positions_.data(), n, config_.rope_dim, config_.rope_base, rope_table_.data());
  reduce_status_ = absl::OkStatus();
  for (int l = 0; l < static_cast<int>(w_.layers.size()); ++l) {
    Layer(l, batch, pos0, cache);
    if (!reduce_status_.ok()) return reduce_status_;
  }

  // Final norm and head over the rows that need logits only (none when the caller wants
  // no logits: tensor-parallel shards other than TP rank 0).
  if (logits == nullptr) {
    for (size_t i = 0; i < batch.size(); ++i) {
      cache->Commit(batch[i].seq, pos0[i] + static_cast<int32_t>(batch[i].tokens.size()));
    }
    return absl::OkStatus();
  }
  const std::vector<int64_t> out_rows = LogitRows(batch);
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  h_.resize(n_out * d);
  for (int64_t r = 0; r < n_out; ++r) {
    RmsNorm(x_.data() + out_rows[r] * d, w_.output_norm, 1, d, config_.rms_eps, h_.data() + r * d);
  }
  logits->resize(n_out * config_.vocab_size);
  MatMul(w_.output, h_.data(), n_out, logits->data(), pool_, &scratch_, w_.activations);
  for (size_t i = 0; i < batch.size(); ++i) {
    cache->Commit(batch[i].seq, pos0[i] + static_cast<int32_t>(batch[i].tokens.size()));
  }
  return absl::OkStatus();
}

void LlamaForward::Layer(int l, std::span<const BatchEntry> batch, const std::vector<int32_t>& pos0,
                         KvCache* cache) {
  const LayerWeights& lw = w_.layers[l];
  const int64_t n = static_cast<int64_t>(positions_.size());
  const int d = config_.d_model;
  const int hd = config_.head_dim;
  const int nh = w_.n_heads_local;
  const int nkv = w_.n_kv_heads_local;
  const int ff = w_.d_ff_local;

  // Attention block.
  h_.resize(n * d);
  RmsNorm(x_.data(), lw.attn_norm, n, d, config_.rms_eps, h_.data());
  q_.resize(n * nh * hd);
  k_.resize(n * nkv * hd);
  v_.resize(n * nkv * hd);
  {
    const WeightView ws[] = {lw.wq, lw.wk, lw.wv};
    float* const ys[] = {q_.data(), k_.data(), v_.data()};
    MatMulShared(ws, h_.data(), n, ys, pool_, &scratch_, w_.activations);
  }
  // The pass's angles were computed once (Forward); split tokens across the pool for
  // verification passes and prefill.
  const int rd = config_.rope_dim;
  auto rope = [&](int64_t t0, int64_t t1, int) {
    RopeApply(q_.data() + t0 * nh * hd, rope_table_.data() + t0 * rd, t1 - t0, nh, hd, rd);
    RopeApply(k_.data() + t0 * nkv * hd, rope_table_.data() + t0 * rd, t1 - t0, nkv, hd, rd);
  };
  if (pool_ != nullptr && n >= kMinParallelRopeTokens) {
    pool_->ParallelFor(n, 1, rope);
  } else {
    rope(0, n, 0);
  }

  // Row offset of each entry's first token.
  std::vector<int64_t> first(batch.size());
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    first[i] = row;
    row += static_cast<int64_t>(batch[i].tokens.size());
  }
  // K/V into the cache (rotation and encoding per row): entries are different sequences,
  // which KvCache lets us write concurrently.
  auto write = [&](int64_t begin, int64_t end, int) {
    for (int64_t i = begin; i < end; ++i) {
      const int32_t count = static_cast<int32_t>(batch[i].tokens.size());
      cache->Write(batch[i].seq, l, pos0[i], count, k_.data() + first[i] * nkv * hd,
                   v_.data() + first[i] * nkv * hd);
    }
  };
  if (pool_ != nullptr && batch.size() > 1) {
    pool_->ParallelFor(static_cast<int64_t>(batch.size()), 1, write);
  } else {
    write(0, static_cast<int64_t>(batch.size()), 0);
  }
  attn_.resize(n * nh * hd);
  const float scale = 1.0f / std::sqrt(static_cast<float>(hd));
  const int64_t n_jobs = static_cast<int64_t>(batch.size()) * nkv;
  auto attend = [&](int64_t begin, int64_t end, int) {
    for (int64_t job = begin; job < end; ++job) {
      const size_t i = static_cast<size_t>(job / nkv);
      const int kv_head = static_cast<int>(job % nkv);
      const int32_t count = static_cast<int32_t>(batch[i].tokens.size());
      cache->Attend(batch[i].seq, l, pos0[i], count, kv_head, q_.data() + first[i] * nh * hd, scale,
                    attn_.data() + first[i] * nh * hd);
    }
  };
  if (pool_ != nullptr) {
    pool_->ParallelFor(n_jobs, 1, attend);
  } else {
    attend(0, n_jobs, 0);
  }
  MatMul(lw.wo, attn_.data(), n, h_.data(), pool_, &scratch_, w_.activations);
  if (reducer_ != nullptr) {
    absl::Status s = reducer_->AllReduceSum(h_.data(), n * d);
    if (!s.ok()) reduce_status_ = s;
  }
  AddInPlace(x_.data(), h_.data(), n * d);

  // Feed-forward block.
  RmsNorm(x_.data(), lw.ffn_norm, n, d, config_.rms_eps, h_.data());
  gate_.resize(n * ff);
  up_.resize(n * ff);
  {
    const WeightView ws[] = {lw.w_gate, lw.w_up};
    float* const ys[] = {gate_.data(), up_.data()};
    MatMulShared(ws, h_.data(), n, ys, pool_, &scratch_, w_.activations);
  }
  // Elementwise, so split across the pool: serial, SwiGLU's exp would leave the workers
  // idle for ~3% of a verification step.
  const int64_t act = n * ff;
  auto swiglu = [&](int64_t b, int64_t e, int) {
    SwiGlu(gate_.data() + b, up_.data() + b, e - b, gate_.data() + b);
  };
  if (pool_ != nullptr && act >= kMinParallelElementwise) {
    pool_->ParallelFor(act, 64, swiglu);
  } else {
    swiglu(0, act, 0);
  }
  MatMul(lw.w_down, gate_.data(), n, h_.data(), pool_, &scratch_, w_.activations);
  if (reducer_ != nullptr) {
    absl::Status s = reducer_->AllReduceSum(h_.data(), n * d);
    if (!s.ok()) reduce_status_ = s;
  }
  AddInPlace(x_.data(), h_.data(), n * d);
}

}  // namespace specnode
