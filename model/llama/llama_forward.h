// The Llama forward pass — the one graph of the model, written once over a Backend
// (backend.h): the CPU reference and CUDA run the same sequence of ops. A batch is several
// sequences, each contributing one or more new tokens (prefill chunks, single decode
// tokens, or a last token + K speculative drafts).
//
// All tokens of the batch share every matmul (weights are read once per step); Q/K/V and
// gate/up, which read the same normed input, run as one MatMulShared each, and each
// residual add is fused with the norm that follows it (AddRmsNorm). KV writes and
// attention go through the KvCache (its pages on the backend's device). Rows are
// batch-invariant: a token's logits do not depend on what else is in the batch (backend.h),
// so verifying K drafts in one pass gives bit-identical logits to decoding them one at a
// time.
//
// Per pass, in this order:
//   embedding rows; h = attention norm of x (layer 0)
//   per layer: Q,K,V = h·W (shared); RoPE on Q, K; KV write; attention; h = attn·Wo;
//              all-reduce h (TP); x += h, h = ffn norm of x; gate, up = h·W (shared);
//              SwiGLU; h = ·Wdown; all-reduce h; x += h, h = next layer's attention norm
//   final norm of the rows that need logits; logits = ·Woutput; to the host
// Everything before the final norm is one Backend::Record body when the pass has no
// all-reduce (a device may replay it as a recording, e.g. a CUDA graph).
//
// Not thread-safe: one Forward() at a time per LlamaForward. The weights, backend and reducer
// must outlive it.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/llama/backend.h"
#include "model/llama/kv_cache.h"
#include "model/llama/llama_config.h"
#include "model/llama/llama_weights.h"

namespace specnode {

// New tokens of one sequence in a batch. They take cache slots [cache.Length(seq), +n):
// positions [Length, +n) for a chain; for a draft tree (parents: [n] parent rows, each in
// [-1, r), -1 = the cached context) row r is position Length + depth(r) and sees only the
// context and its own path (KvPassEntry, kv_cache.h), and KvCache::KeepRows keeps one path
// afterwards.
struct BatchEntry {
  SeqId seq = 0;
  std::span<const int32_t> tokens;
  bool all_logits = false;  // logits for every token (verification) or only the last
  std::span<const int32_t> parents = {};  // empty: a chain
};

// Checks a batch before anything runs: every entry has tokens, every id is in
// [0, vocab_size), no sequence appears twice, parents (when given) has a row per token,
// each in [-1, r). Returns the total token count.
absl::StatusOr<int64_t> ValidateBatch(std::span<const BatchEntry> batch, int32_t vocab_size);

// The batch rows whose logits a pass returns, in order: every token of an all_logits
// entry, else the entry's last token (rows numbered over the whole batch).
std::vector<int64_t> LogitRows(std::span<const BatchEntry> batch);

class LlamaForward {
 public:
  // The graph over `backend` with `weights` in its memory (Backend::UploadWeights).
  // `reducer`: a tensor-parallel shard's all-reduce (null for a whole model).
  LlamaForward(const LlamaConfig& config, std::shared_ptr<const LlamaWeights> weights,
               Backend* backend, PartialSumReducer* reducer = nullptr);
  // The CPU reference over a CpuBackend of its own: CpuLlamaForward (cpu_forward.h).
  virtual ~LlamaForward();

  // Runs the batch and fills `logits` with [n_rows, vocab] rows: for each entry in order,
  // every token's row when all_logits, else the last token's. Checks token ids, that the
  // cache is on the backend's device and that it can take the tokens (Reserve) before
  // computing anything; on error no sequence's length changes (reservations are undone).
  // DataLoss when the logits are not finite (a model whose weights overflow).
  // `logits` may be null: the final norm and head are skipped (a tensor-parallel shard
  // whose logits nobody reads; the cache is updated as usual).
  absl::Status Forward(std::span<const BatchEntry> batch, KvCache* cache,
                       std::vector<float>* logits);
  // Forward for greedy consumers: (*ids)[r] = ArgMax of logits row r (rows as Forward orders
  // them), the same tokens greedy sampling of Forward's logits gives; a device backend keeps
  // the logits where it computed them (Backend::FinishArgMax). Errors as Forward.
  absl::Status ForwardArgMax(std::span<const BatchEntry> batch, KvCache* cache,
                             std::vector<int32_t>* ids);
  // Forward for top-k samplers: each row's k largest logits, ids [n_rows * k] and values
  // [n_rows * k] in TopK's order (model/llama/sampling.h); a device backend moves only those
  // (Backend::FinishTopK). 0 < k <= vocab. Errors as Forward.
  absl::Status ForwardTopK(std::span<const BatchEntry> batch, KvCache* cache, int k,
                           std::vector<int32_t>* ids, std::vector<float>* values);

  // Forward for samplers that prune nothing (Sampler::DrawsWithParams): (*ids)[r] = the
  // token row r draws with draws[r] (DrawRows of model/llama/sampling.h), the token
  // Sampler::Sample gives from Forward's row r; a device draws where the logits are
  // (Backend::FinishDraws). draws: [n_rows] (LogitRows(batch).size()), else InvalidArgument
  // before anything runs. Other errors as Forward.
  absl::Status ForwardDrawn(std::span<const BatchEntry> batch, KvCache* cache,
                            std::span<const sample::DrawParams> draws, std::vector<int32_t>* ids);

  const LlamaConfig& config() const { return config_; }
  Backend& backend() { return *backend_; }

 private:
  // Activation buffers (Backend::Buffer slots).
  enum Slot : int { kX, kH, kQ, kK, kV, kAttn, kGate, kUp, kNormed };
  struct Buffers {
    float *x, *h, *q, *k, *v, *attn, *gate, *up;
  };
  // What a pass returns: logits rows, each row's arg max (ids, top_k 0), each row's top_k
  // largest (ids and values), each row's draw (ids, draws non-empty), or nothing (Sync only).
  struct HeadOut {
    std::vector<float>* logits = nullptr;
    std::vector<int32_t>* ids = nullptr;
    int top_k = 0;
    std::vector<float>* values = nullptr;
    std::span<const sample::DrawParams> draws = {};
  };
  absl::Status Pass(std::span<const BatchEntry> batch, KvCache* cache, HeadOut out);
  absl::Status Run(std::span<const BatchEntry> batch, const std::vector<int32_t>& pos0, int64_t n,
                   KvCache* cache, HeadOut out);
  // Embedding + every layer over the pass's n rows: ops only (a Record body).
  absl::Status Body(int64_t n, const Buffers& b, KvCache* cache);
  absl::Status Layer(int l, int64_t n, const Buffers& b, KvCache* cache);
  // The head in three steps: its rows and buffers (before the recorded body), its ops (in
  // the body: final norm, output matmul, SelectHead) and the fetch with its checks.
  struct HeadBuffers {
    std::vector<int64_t> rows;  // LogitRows of the batch
    float* normed = nullptr;    // [rows, d_model]
    float* logits = nullptr;    // [rows, vocab] (LogitsBuffer's)
    std::vector<float>* host = nullptr;
  };
  absl::Status PrepareHead(std::span<const BatchEntry> batch, HeadOut out, HeadBuffers* hb);
  absl::Status HeadOps(const float* x, const HeadBuffers& hb, HeadOut out);
  absl::Status FinishHead(const HeadBuffers& hb, HeadOut out);

  LlamaConfig config_;
  std::shared_ptr<const LlamaWeights> w_;
  Backend* backend_;
  PartialSumReducer* reducer_;
  int n_heads_, n_kv_heads_, d_ff_;
  // Per-pass host staging.
  std::vector<int32_t> ids_, positions_;
  std::vector<KvPassEntry> entries_;
  std::vector<float> argmax_host_;  // ForwardArgMax/TopK's logits where the backend is the host
};

}  // namespace specnode
