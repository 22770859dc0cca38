// Backend: the device a forward pass computes on. The Llama graph (llama_forward.h) is
// written once over these ops, as ggml's graphs are over its backends; CpuBackend
// (cpu_backend.h) is the reference implementation, CudaBackend (cuda/cuda_backend.h) runs
// the same ops as CUDA kernels. A backend implements ops; it never re-implements the model
// or the KV cache (KV writes and paged attention go through the KvCache the graph is given,
// whose pages live on the same device: kv_cache.h).
//
// Memory. Every float* an op takes or returns is this backend's memory (host memory for the
// CPU, device memory for CUDA) and is never dereferenced by the graph: activations come
// from Buffer(), weights from UploadWeights(). Host data enters a pass only through
// BeginPass (token ids and positions) and leaves it only through the logits
// (LogitsBuffer + FinishLogits).
//
// A pass, as the graph runs it:
//   BeginPass(ids, positions)                 this pass's rows: [n] token ids, positions
//   kv->BeginPass(...)                        the cache's per-pass tables
//   EmbeddingRows / RmsNorm / MatMul ...      ops over rows [0, n)
//   LogitsBuffer, MatMul, FinishLogits        (or SelectHead + FinishArgMax / FinishTopK for
//                                              greedy and top-k consumers, or Sync when
//                                              nobody reads logits)
// Ops are queued in order (a CUDA stream) and may complete asynchronously; an error can
// surface at a later op, at FinishLogits or at Sync. After an error the pass is abandoned.
//
// Batch invariance (what makes greedy speculation equal plain decoding): every op computes
// a row's result with an instruction sequence that depends only on that row (and, for RoPE,
// its position), never on n or on the other rows. Each implementation documents how it
// keeps this; tests compare every op with the CPU reference.
//
// Shapes are row-major f32 unless said otherwise; n is the number of rows of the pass.
// Not thread-safe: one pass at a time, driven by one thread.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/cpu/act_quant.h"
#include "model/gguf/weight_view.h"
#include "model/llama/device.h"
#include "model/llama/llama_weights.h"
#include "model/llama/sample_math.h"

namespace specnode {

class ThreadPool;

// Hook for tensor parallelism: sums partial [n, d_model] activations across shards after
// the row-parallel O and down projections (data in the backend's memory). Null for a
// single shard. Called with the backend synchronised (Backend::AllReduce), so an
// implementation may read the buffer from host code.
class PartialSumReducer {
 public:
  virtual ~PartialSumReducer() = default;
  virtual absl::Status AllReduceSum(float* data, int64_t count) = 0;
};

class Backend {
 public:
  virtual ~Backend() = default;

  // The device whose memory the ops use (its name(): "cpu", "cuda:N"). A KvCache must report
  // the same device (KvCache::device()) to be used with this backend.
  virtual Device device() const = 0;
  // For logs: "cpu (avx512-vnni kernels, int16 activations)", "cuda:0 (NVIDIA H200)".
  virtual std::string Describe() const = 0;

  // `weights` as this backend computes with them: the same views, pointing at this
  // backend's memory. The CPU returns `weights` itself (shared, not copied: `weights` must
  // outlive the result); CUDA copies every matrix and norm to the device once (a shard's
  // slices only), after which the host mapping may go. InvalidArgument for a model this
  // backend cannot run (naming why), Internal / ResourceExhausted when memory is short.
  virtual absl::StatusOr<std::shared_ptr<const LlamaWeights>> UploadWeights(
      std::shared_ptr<const LlamaWeights> weights) = 0;

  // Activation buffer `slot` (a small integer the caller chooses; at most kMaxSlots) with
  // room for `floats` f32 values. The buffer keeps its address and contents while it does
  // not grow; growing may move it and drops its contents.
  static constexpr int kMaxSlots = 16;
  virtual absl::StatusOr<float*> Buffer(int slot, int64_t floats) = 0;

  // Starts a pass over ids.size() == positions.size() rows: copies the token ids and
  // positions to the device. EmbeddingRows and RopePair read them.
  virtual absl::Status BeginPass(std::span<const int32_t> ids,
                                 std::span<const int32_t> positions) = 0;

  // out [n, table.cols] = rows ids[0..n) of the embedding matrix `table` (any weight type),
  // dequantised; n = the pass's rows.
  virtual absl::Status EmbeddingRows(const WeightView& table, float* out) = 0;
  // y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight. x, y: [n, dim] (may alias exactly).
  virtual absl::Status RmsNorm(const float* x, const float* weight, int64_t n, int dim, float eps,
                               float* y) = 0;
  // x += h, then y = RmsNorm(x) * weight: bit-identical to Add followed by RmsNorm.
  // x: [n, dim] (updated); h, y: [n, dim], y may alias h exactly (not x).
  virtual absl::Status AddRmsNorm(float* x, const float* h, const float* weight, int64_t n, int dim,
                                  float eps, float* y) = 0;
  // RmsNorm of the rows `rows` (ascending row indices of x) into y [rows.size(), dim].
  virtual absl::Status RmsNormRows(const float* x, std::span<const int64_t> rows,
                                   const float* weight, int dim, float eps, float* y) = 0;
  // y[i] += x[i] for count values.
  virtual absl::Status Add(float* y, const float* x, int64_t count) = 0;
  // y [n, w.rows] = x [n, w.cols] · Wᵀ with W in its storage type (w: a view from
  // UploadWeights). Batch-invariant.
  virtual absl::Status MatMul(const WeightView& w, const float* x, int64_t n, float* y) = 0;
  // ys[i] [n, ws[i].rows] = x · ws[i]ᵀ for 1..3 matrices of the same cols (Q/K/V, gate/up):
  // each bit-identical to its own MatMul; one activation pass / launch where possible.
  virtual absl::Status MatMulShared(std::span<const WeightView> ws, const float* x, int64_t n,
                                    std::span<float* const> ys) = 0;
  // RoPE in place on q [n, n_heads, head_dim] and k [n, n_kv_heads, head_dim] at the pass's
  // positions: pair i < rope_dim/2 — dims (2i, 2i+1) in RopeMode::kNorm, (i, i + rope_dim/2)
  // in kNeox — turns by position * base^(-2i / rope_dim); dims past rope_dim are untouched.
  // freq_factors [rope_dim / 2] (backend memory; null: none) divide pair i's angle (Llama
  // 3.1's rope_freqs.weight). A backend without a kernel for `mode` or for frequency
  // factors refuses them (Unimplemented).
  virtual absl::Status RopePair(float* q, float* k, int64_t n, int n_heads, int n_kv_heads,
                                int head_dim, int rope_dim, float base, RopeMode mode,
                                const float* freq_factors) = 0;
  // y[r] += bias for each of n rows: y [n, dim], bias [dim].
  virtual absl::Status AddBias(float* y, const float* bias, int64_t n, int dim) = 0;
  // out[i] = silu(gate[i]) * up[i] for count values; out may alias gate or up exactly.
  virtual absl::Status SwiGlu(const float* gate, const float* up, int64_t count, float* out) = 0;
  // out[i] = gelu_tanh(gate[i]) * up[i] (GeGLU, cpu_ops.h GeGlu); out may alias gate or up.
  virtual absl::Status GeGlu(const float* gate, const float* up, int64_t count, float* out) = 0;
  // x[i] *= s for count values (Gemma's embedding scale).
  virtual absl::Status Scale(float* x, int64_t count, float s) = 0;
  // Sums data [count] over the shards through `reducer` (no-op when null), the backend
  // synchronised first so the reducer sees finished partial sums.
  virtual absl::Status AllReduce(PartialSumReducer* reducer, float* data, int64_t count) = 0;

  // Logits out: LogitsBuffer returns where a pass writes `floats` logits (the CPU: host's
  // own storage, resized; a device: its buffer); FinishLogits brings them into *host
  // (resized to `floats`) and returns when the pass has completed.
  virtual absl::StatusOr<float*> LogitsBuffer(int64_t floats, std::vector<float>* host) = 0;
  virtual absl::Status FinishLogits(const float* logits, int64_t floats,
                                    std::vector<float>* host) = 0;
  // Greedy heads: (*ids)[r] = the index of row r's largest logit, lowest on ties (ArgMax
  // of model/llama/sampling.h), or -1 when the row holds a NaN or an infinity, for `rows`
  // rows of `vocab` logits at `logits` (LogitsBuffer's, which was given `host`); returns
  // when the pass has completed. A device computes it where the logits are and moves `rows`
  // ints, not the logits. The default brings the logits into *host (FinishLogits) and takes
  // the arg max there (backend.cc).
  // `selected`: SelectHead queued this selection (same arguments) earlier in the pass, maybe
  // inside a recorded body: only its result is brought back.
  virtual absl::Status FinishArgMax(const float* logits, int64_t rows, int64_t vocab,
                                    std::vector<float>* host, std::vector<int32_t>* ids,
                                    bool selected);
  // Sampled heads: row r's `k` largest logits in TopK's order (model/llama/sampling.h), ids
  // at (*ids)[r * k + i] and logits at (*values)[r * k + i] (both resized to rows * k), or
  // (*ids)[r * k] = -1 when the row holds a NaN or an infinity; 0 < k <= vocab. What a
  // top-k sampler draws from (Sampler::SampleTopK), so a device moves rows * k pairs, not
  // the logits. The default brings the logits into *host and selects there (backend.cc).
  virtual absl::Status FinishTopK(const float* logits, int64_t rows, int64_t vocab, int k,
                                  std::vector<float>* host, std::vector<int32_t>* ids,
                                  std::vector<float>* values, bool selected);
  // Drawn heads: (*ids)[r] = DrawRows' token for row r with draws[r] (model/llama/sampling.h:
  // what Sampler::Sample draws for a sampler that prunes nothing), or -1 when the row holds
  // a NaN or an infinity; draws.size() == rows. A device draws where the logits are and
  // moves `rows` ints (and the draws' 16 bytes a row up); not recorded (each step's noise
  // keys differ), it runs after the pass. The default brings the logits into *host and
  // draws there (backend.cc).
  virtual absl::Status FinishDraws(const float* logits, int64_t rows, int64_t vocab,
                                   std::span<const sample::DrawParams> draws,
                                   std::vector<float>* host, std::vector<int32_t>* ids);
  // Queues a greedy (k == 0) or top-k (k > 0) selection over `rows` rows of `vocab` logits as
  // an op (no host synchronisation; Record may capture it), whose result the FinishArgMax /
  // FinishTopK with the same arguments and selected = true brings back. The default does
  // nothing: the host selects in the finish.
  virtual absl::Status SelectHead(const float* logits, int64_t rows, int64_t vocab, int k);
  // Returns when every queued op has completed (a pass without logits ends here).
  virtual absl::Status Sync() = 0;

  // Runs `body` — ops only, over `rows` rows, no host synchronisation inside — possibly by
  // replaying a recording of an earlier run with the same rows and `signature` (everything
  // the ops bake in besides the rows: buffer addresses, table strides; the backend adds its
  // own). Results are bit-identical to running `body`. The CPU runs it; CUDA replays CUDA
  // graphs (cuda/cuda_graph_cache.h).
  virtual absl::Status Record(int64_t rows, uint64_t signature,
                              const std::function<absl::Status()>& body) {
    return body();
  }

  // Host threads this backend computes with (the CPU's pool; null for a device): a KvCache
  // on the CPU splits a pass's attention across them.
  virtual ThreadPool* host_threads() const { return nullptr; }
};

// Mixes `v` into a pass signature (Backend::Record).
inline uint64_t MixSignature(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  return h * 0xbf58476d1ce4e5b9ULL;
}

}  // namespace specnode
