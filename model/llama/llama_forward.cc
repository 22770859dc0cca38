#include "model/llama/llama_forward.h"

#include <algorithm>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/cpu/finite.h"
#include "model/llama/sampling.h"
#include "model/status_macros.h"

namespace specnode {

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
    if (!e.parents.empty()) {
      if (e.parents.size() != e.tokens.size()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("batch entry of sequence %d: %d parents for %d tokens", e.seq,
                            e.parents.size(), e.tokens.size()));
      }
      for (size_t r = 0; r < e.parents.size(); ++r) {
        if (e.parents[r] < -1 || e.parents[r] >= static_cast<int32_t>(r)) {
          return absl::InvalidArgumentError(absl::StrFormat(
              "batch entry of sequence %d: row %d has parent %d (must be in [-1, %d))", e.seq, r,
              e.parents[r], r));
        }
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

LlamaForward::LlamaForward(const LlamaConfig& config, std::shared_ptr<const LlamaWeights> weights,
                           Backend* backend, PartialSumReducer* reducer)
    : config_(config),
      w_(std::move(weights)),
      backend_(backend),
      reducer_(reducer),
      n_heads_(w_->n_heads_local),
      n_kv_heads_(w_->n_kv_heads_local),
      d_ff_(w_->d_ff_local) {}

LlamaForward::~LlamaForward() = default;

absl::Status LlamaForward::Forward(std::span<const BatchEntry> batch, KvCache* cache,
                                   std::vector<float>* logits) {
  return Pass(batch, cache, HeadOut{logits, nullptr});
}

absl::Status LlamaForward::ForwardArgMax(std::span<const BatchEntry> batch, KvCache* cache,
                                         std::vector<int32_t>* ids) {
  return Pass(batch, cache, HeadOut{nullptr, ids});
}

absl::Status LlamaForward::ForwardTopK(std::span<const BatchEntry> batch, KvCache* cache, int k,
                                       std::vector<int32_t>* ids, std::vector<float>* values) {
  SPECNODE_RETURN_IF_ERROR(ValidateHeadK(k, config_.vocab_size));
  return Pass(batch, cache, HeadOut{nullptr, ids, k, values});
}

absl::Status LlamaForward::ForwardDrawn(std::span<const BatchEntry> batch, KvCache* cache,
                                        std::span<const sample::DrawParams> draws,
                                        std::vector<int32_t>* ids) {
  const size_t rows = LogitRows(batch).size();
  SPECNODE_RETURN_IF_ERROR(CheckDrawCount("ForwardDrawn", draws.size(), rows));
  if (rows == 0) {
    return Pass(batch, cache, HeadOut{nullptr, ids});  // nothing to draw: lengths only
  }
  return Pass(batch, cache, HeadOut{nullptr, ids, 0, nullptr, draws});
}

absl::Status LlamaForward::Pass(std::span<const BatchEntry> batch, KvCache* cache, HeadOut out) {
  SPECNODE_ASSIGN_OR_RETURN(const int64_t n, ValidateBatch(batch, config_.vocab_size));
  if (cache->device() != backend_->device()) {
    return absl::FailedPreconditionError(absl::StrCat("the KV cache is on ", cache->device().name(),
                                                      " but the forward pass runs on ",
                                                      backend_->device().name()));
  }
  for (const BatchEntry& e : batch) {
    if (!e.parents.empty() && !cache->tree_passes()) {
      return absl::UnimplementedError(absl::StrCat("this KV cache (", cache->device().name(),
                                                   ") does not take draft-tree passes"));
    }
  }
  if (n == 0) {
    if (out.logits != nullptr) out.logits->clear();
    if (out.ids != nullptr) out.ids->clear();
    if (out.values != nullptr) out.values->clear();
    return absl::OkStatus();
  }
  // Reserve everything first; undo on failure so that no sequence changes.
  std::vector<int32_t> pos0(batch.size());
  auto undo = [&](size_t upto) {
    for (size_t j = 0; j < upto; ++j) {
      if (pos0[j] == 0) {
        cache->Free(batch[j].seq);
      } else {
        (void)cache->Truncate(batch[j].seq, pos0[j]);
      }
    }
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    pos0[i] = cache->Length(batch[i].seq);
    absl::Status s = cache->Reserve(batch[i].seq, static_cast<int32_t>(batch[i].tokens.size()));
    if (!s.ok()) {
      undo(i);
      if (pos0[i] == 0) cache->Free(batch[i].seq);
      return s;
    }
  }
  absl::Status s = Run(batch, pos0, n, cache, out);
  if (!s.ok()) {
    undo(batch.size());
    return s;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    cache->Commit(batch[i].seq, pos0[i] + static_cast<int32_t>(batch[i].tokens.size()));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::Run(std::span<const BatchEntry> batch, const std::vector<int32_t>& pos0,
                               int64_t n, KvCache* cache, HeadOut out) {
  ids_.resize(n);
  positions_.resize(n);
  entries_.resize(batch.size());
  int64_t row = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const int32_t count = static_cast<int32_t>(batch[i].tokens.size());
    const std::span<const int32_t> parents = batch[i].parents;
    entries_[i] = KvPassEntry{batch[i].seq, pos0[i], count, parents};
    // A tree row sits at its depth's position.
    const std::vector<int32_t> depth = TreeRowDepths(parents);
    for (int32_t j = 0; j < count; ++j, ++row) {
      ids_[row] = batch[i].tokens[j];
      positions_[row] = pos0[i] + (parents.empty() ? j : depth[j]);
    }
  }
  // The backend stages the pass's ids and positions, then the cache its tables: a device
  // uploads them all in one copy before the first kernel that reads them.
  SPECNODE_RETURN_IF_ERROR(backend_->BeginPass(ids_, positions_));
  SPECNODE_RETURN_IF_ERROR(cache->BeginPass(entries_, backend_->host_threads()));

  const int d = config_.d_model;
  const int hd = config_.head_dim;
  Buffers b;
  SPECNODE_ASSIGN_OR_RETURN(b.x, backend_->Buffer(kX, n * d));
  SPECNODE_ASSIGN_OR_RETURN(b.h, backend_->Buffer(kH, n * d));
  SPECNODE_ASSIGN_OR_RETURN(b.q, backend_->Buffer(kQ, n * n_heads_ * hd));
  SPECNODE_ASSIGN_OR_RETURN(b.k, backend_->Buffer(kK, n * n_kv_heads_ * hd));
  SPECNODE_ASSIGN_OR_RETURN(b.v, backend_->Buffer(kV, n * n_kv_heads_ * hd));
  SPECNODE_ASSIGN_OR_RETURN(b.attn, backend_->Buffer(kAttn, n * n_heads_ * hd));
  SPECNODE_ASSIGN_OR_RETURN(b.gate, backend_->Buffer(kGate, n * d_ff_));
  SPECNODE_ASSIGN_OR_RETURN(b.up, backend_->Buffer(kUp, n * d_ff_));

  // The head's rows and buffers are set before the body, so that its ops (norm, matmul, a
  // greedy or top-k selection) are recorded with the layers; only the fetch (and a drawn
  // head's draw) follows.
  const bool head = out.logits != nullptr || out.ids != nullptr;
  HeadBuffers hb;
  if (head) SPECNODE_RETURN_IF_ERROR(PrepareHead(batch, out, &hb));
  auto body = [&]() -> absl::Status {
    SPECNODE_RETURN_IF_ERROR(Body(n, b, cache));
    return head ? HeadOps(b.x, hb, out) : absl::OkStatus();
  };
  if (reducer_ == nullptr) {
    // Everything the body bakes into its ops besides n: the buffers, the cache's tables and
    // the head (which rows, into which buffers, which selection).
    uint64_t sig = cache->PassSignature();
    for (const float* p : {b.x, b.h, b.q, b.k, b.v, b.attn, b.gate, b.up, hb.normed, hb.logits}) {
      sig = MixSignature(sig, reinterpret_cast<uintptr_t>(p));
    }
    // Drawn heads record no selection (FinishDraws runs after the body).
    const uint64_t head_kind = !head                ? 0
                               : out.ids == nullptr ? 1
                               : !out.draws.empty() ? uint64_t{1} << 40
                                                    : 2 + static_cast<uint64_t>(out.top_k);
    sig = MixSignature(sig, head_kind);
    for (int64_t r : hb.rows) sig = MixSignature(sig, static_cast<uint64_t>(r));
    SPECNODE_RETURN_IF_ERROR(backend_->Record(n, sig, body));
  } else {
    // An all-reduce runs host code between ops: nothing to record.
    SPECNODE_RETURN_IF_ERROR(body());
  }
  if (!head) return backend_->Sync();
  return FinishHead(hb, out);
}

absl::Status LlamaForward::Body(int64_t n, const Buffers& b, KvCache* cache) {
  SPECNODE_RETURN_IF_ERROR(backend_->EmbeddingRows(w_->token_embd, b.x));
  if (config_.arch.embed_scale) {  // gemma3
    const float s = std::sqrt(static_cast<float>(config_.d_model));
    SPECNODE_RETURN_IF_ERROR(backend_->Scale(b.x, n * config_.d_model, s));
  }
  if (w_->layers.empty()) return absl::OkStatus();
  // Each layer starts with h = its attention norm of x: here for the first, fused into the
  // previous layer's last residual add for the others.
  SPECNODE_RETURN_IF_ERROR(
      backend_->RmsNorm(b.x, w_->layers[0].attn_norm, n, config_.d_model, config_.rms_eps, b.h));
  for (int l = 0; l < static_cast<int>(w_->layers.size()); ++l) {
    SPECNODE_RETURN_IF_ERROR(Layer(l, n, b, cache));
  }
  return absl::OkStatus();
}

absl::Status LlamaForward::Layer(int l, int64_t n, const Buffers& b, KvCache* cache) {
  const LayerWeights& lw = w_->layers[l];
  const int d = config_.d_model;
  const int hd = config_.head_dim;
  const float eps = config_.rms_eps;

  // Attention block; h = attention norm of x already.
  {
    const WeightView ws[] = {lw.wq, lw.wk, lw.wv};
    float* const ys[] = {b.q, b.k, b.v};
    SPECNODE_RETURN_IF_ERROR(backend_->MatMulShared(ws, b.h, n, ys));
  }
  if (lw.bq != nullptr) {  // qwen2
    SPECNODE_RETURN_IF_ERROR(backend_->AddBias(b.q, lw.bq, n, n_heads_ * hd));
    SPECNODE_RETURN_IF_ERROR(backend_->AddBias(b.k, lw.bk, n, n_kv_heads_ * hd));
    SPECNODE_RETURN_IF_ERROR(backend_->AddBias(b.v, lw.bv, n, n_kv_heads_ * hd));
  }
  if (lw.q_norm != nullptr) {  // qwen3: each head of q and k normalised on its own
    SPECNODE_RETURN_IF_ERROR(backend_->RmsNorm(b.q, lw.q_norm, n * n_heads_, hd, eps, b.q));
    SPECNODE_RETURN_IF_ERROR(backend_->RmsNorm(b.k, lw.k_norm, n * n_kv_heads_, hd, eps, b.k));
  }
  SPECNODE_RETURN_IF_ERROR(backend_->RopePair(
      b.q, b.k, n, n_heads_, n_kv_heads_, hd, config_.rope_dim, config_.LayerRopeBase(l),
      config_.arch.rope, config_.LayerRopeScale(l) != 1.0f ? w_->rope_linear : w_->rope_freqs));
  if (lw.k_offset != nullptr) {
    // The cache stores K less its bias, taken after RoPE: each query's scores all shift by the
    // same q·bk, which softmax ignores, so attention is unchanged (up to f32 rounding) while
    // the stored keys lose the large constant channels a bias gives them (Qwen2.5: |bk| up
    // to ~456 on slow RoPE pairs, beside values of ~1) that a quantised row's one scale
    // cannot carry (docs/kvstore.md "Keys with a bias").
    SPECNODE_RETURN_IF_ERROR(backend_->AddBias(b.k, lw.k_offset, n, n_kv_heads_ * hd));
  }
  SPECNODE_RETURN_IF_ERROR(cache->Write(l, b.k, b.v));
  // FromGguf sets the scale; a config made by hand (tests) keeps the usual one.
  const float scale =
      config_.attn_scale > 0.0f ? config_.attn_scale : 1.0f / std::sqrt(static_cast<float>(hd));
  SPECNODE_RETURN_IF_ERROR(cache->Attend(l, b.q, scale, config_.LayerWindow(l), b.attn));
  SPECNODE_RETURN_IF_ERROR(backend_->MatMul(lw.wo, b.attn, n, b.h));
  SPECNODE_RETURN_IF_ERROR(backend_->AllReduce(reducer_, b.h, n * d));
  if (lw.post_attn_norm != nullptr) {  // gemma3: the sum of the shards, normalised
    SPECNODE_RETURN_IF_ERROR(backend_->RmsNorm(b.h, lw.post_attn_norm, n, d, eps, b.h));
  }
  SPECNODE_RETURN_IF_ERROR(backend_->AddRmsNorm(b.x, b.h, lw.ffn_norm, n, d, eps, b.h));

  // Feed-forward block.
  {
    const WeightView ws[] = {lw.w_gate, lw.w_up};
    float* const ys[] = {b.gate, b.up};
    SPECNODE_RETURN_IF_ERROR(backend_->MatMulShared(ws, b.h, n, ys));
  }
  if (config_.arch.ffn == FfnActivation::kGeluTanh) {
    SPECNODE_RETURN_IF_ERROR(backend_->GeGlu(b.gate, b.up, n * d_ff_, b.gate));
  } else {
    SPECNODE_RETURN_IF_ERROR(backend_->SwiGlu(b.gate, b.up, n * d_ff_, b.gate));
  }
  SPECNODE_RETURN_IF_ERROR(backend_->MatMul(lw.w_down, b.gate, n, b.h));
  SPECNODE_RETURN_IF_ERROR(backend_->AllReduce(reducer_, b.h, n * d));
  if (lw.post_ffn_norm != nullptr) {
    SPECNODE_RETURN_IF_ERROR(backend_->RmsNorm(b.h, lw.post_ffn_norm, n, d, eps, b.h));
  }
  // Residual add, fused with the next layer's attention norm where there is one.
  if (l + 1 < static_cast<int>(w_->layers.size())) {
    return backend_->AddRmsNorm(b.x, b.h, w_->layers[l + 1].attn_norm, n, d, eps, b.h);
  }
  return backend_->Add(b.x, b.h, n * d);
}

absl::Status LlamaForward::PrepareHead(std::span<const BatchEntry> batch, HeadOut out,
                                       HeadBuffers* hb) {
  hb->rows = LogitRows(batch);
  const int64_t n_out = static_cast<int64_t>(hb->rows.size());
  SPECNODE_ASSIGN_OR_RETURN(hb->normed, backend_->Buffer(kNormed, n_out * config_.d_model));
  hb->host = out.logits != nullptr ? out.logits : &argmax_host_;
  SPECNODE_ASSIGN_OR_RETURN(hb->logits,
                            backend_->LogitsBuffer(n_out * config_.vocab_size, hb->host));
  return absl::OkStatus();
}

absl::Status LlamaForward::HeadOps(const float* x, const HeadBuffers& hb, HeadOut out) {
  // Final norm and head over the rows that need logits only; then, for a greedy or top-k
  // consumer, the selection queued where the logits are.
  const int d = config_.d_model;
  const int64_t n_out = static_cast<int64_t>(hb.rows.size());
  SPECNODE_RETURN_IF_ERROR(
      backend_->RmsNormRows(x, hb.rows, w_->output_norm, d, config_.rms_eps, hb.normed));
  SPECNODE_RETURN_IF_ERROR(backend_->MatMul(w_->output, hb.normed, n_out, hb.logits));
  if (out.ids == nullptr || !out.draws.empty()) return absl::OkStatus();  // draws: after the pass
  return backend_->SelectHead(hb.logits, n_out, config_.vocab_size, out.top_k);
}

absl::Status LlamaForward::FinishHead(const HeadBuffers& hb, HeadOut out) {
  const int64_t vocab = config_.vocab_size;
  const int64_t n_out = static_cast<int64_t>(hb.rows.size());
  // A model whose weights overflow gives NaN / Inf logits: an error naming it, never text
  // sampled from garbage (the pass is undone like any failed pass).
  auto non_finite = [&](int64_t r) {
    return absl::DataLossError(
        absl::StrCat("the model produced non-finite logits (NaN or Inf) for batch row ", hb.rows[r],
                     ": its weights or activations overflow"));
  };
  if (!out.draws.empty()) {
    SPECNODE_RETURN_IF_ERROR(
        backend_->FinishDraws(hb.logits, n_out, vocab, out.draws, hb.host, out.ids));
    for (int64_t r = 0; r < n_out; ++r) {
      if ((*out.ids)[r] < 0) return non_finite(r);
    }
    return absl::OkStatus();
  }
  if (out.ids != nullptr) {
    const int k = std::max(out.top_k, 1);
    SPECNODE_RETURN_IF_ERROR(out.top_k > 0
                                 ? backend_->FinishTopK(hb.logits, n_out, vocab, k, hb.host,
                                                        out.ids, out.values,
                                                        /*selected=*/true)
                                 : backend_->FinishArgMax(hb.logits, n_out, vocab, hb.host, out.ids,
                                                          /*selected=*/true));
    for (int64_t r = 0; r < n_out; ++r) {
      if ((*out.ids)[r * k] < 0) return non_finite(r);
    }
    return absl::OkStatus();
  }
  SPECNODE_RETURN_IF_ERROR(backend_->FinishLogits(hb.logits, n_out * vocab, out.logits));
  for (int64_t r = 0; r < n_out; ++r) {
    if (!AllFinite(out.logits->data() + r * vocab, vocab)) return non_finite(r);
  }
  return absl::OkStatus();
}

}  // namespace specnode
