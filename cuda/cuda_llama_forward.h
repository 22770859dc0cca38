// CudaLlamaForward: the Llama forward pass of model/llama_forward.h on one GPU, over its own
// paged f16 KV cache (cuda_kv_cache.h). Same batch contract: entries are sequences each
// adding one or more tokens; logits come back to the host as [n_rows, vocab] (every token of
// an all_logits entry, else its last token); on error no sequence changes.
//
// Weights are copied to the device once at Create (each matrix compacted to its own rows, in
// its GGUF storage type; norms as f32), so the host mapping may be dropped afterwards.
// Matmuls use CudaMatMul's fused kernel (batch-invariant, f32 activations), attention the
// paged kernel of cuda_attention.h, norms / RoPE / SwiGLU / residual adds cuda_ops.h: a
// token's logits do not depend on what else is in the batch, so speculative verification
// gives exactly the tokens of one-at-a-time decoding, as on the CPU.
//
// Differences from the CPU pass, bounded by tests against it (cuda/tests/
// cuda_forward_test.cc): activations stay f32 into the matmuls (the CPU rounds them to int16
// or int8 blocks), KV is f16 (the CPU's "full" mode; no mixed precision or host tier yet),
// and a tensor-parallel shard all-reduces through a synchronous reducer (the stream waits).
//
// CUDA graphs: the embedding + layers part of a pass (everything but the head) is replayed
// as a CUDA graph once a pass shape (its number of token rows, up to 64: decode batches and
// verification passes, not prefill chunks) recurs (cuda_graph_cache.h):
// per-step tables go to the device in one copy before the replay, and the page table has a
// fixed row stride (context_length / page_tokens pages) so it does not change the shape.
// Graphs run exactly the kernels of the eager pass, so results are bit-identical (tested).
// Off with CudaForwardOptions::cuda_graphs = false or SPECNODE_CUDA_GRAPHS=0 in the
// environment; never used for a tensor-parallel shard (its all-reduce synchronises the host).
//
// Not thread-safe. Create() and every call with the same device current; all work runs on
// the forward's own stream, and Forward returns after the logits reached the host.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/cuda_graph_cache.h"
#include "cuda/cuda_kv_cache.h"
#include "cuda/cuda_matmul.h"
#include "cuda/device_buffer.h"
#include "model/llama_config.h"
#include "model/llama_forward.h"
#include "model/llama_weights.h"

namespace specnode {

struct CudaForwardOptions {
  int device = 0;
  int64_t kv_capacity_bytes = int64_t{1} << 30;
  int kv_page_tokens = 16;
  // A tensor-parallel shard's all-reduce over DEVICE buffers (a CommunicatorReducer over an
  // NcclCommunicator on `device`), called after the O and down projections with the
  // forward's stream synchronised; null for a whole model. Borrowed.
  PartialSumReducer* reducer = nullptr;
  // Replay recurring pass shapes as CUDA graphs (see above).
  bool cuda_graphs = true;
};

class CudaLlamaForward {
 public:
  // Selects `options.device`, uploads the weights (a shard's slices only), allocates the KV
  // pools. Unavailable without a usable device; InvalidArgument for a model the kernels
  // cannot run (head_dim > 256) or a shard without a reducer.
  static absl::StatusOr<std::unique_ptr<CudaLlamaForward>> Create(
      const LlamaConfig& config, const LlamaWeights& weights, const CudaForwardOptions& options);
  ~CudaLlamaForward();
  CudaLlamaForward(const CudaLlamaForward&) = delete;
  CudaLlamaForward& operator=(const CudaLlamaForward&) = delete;

  // As LlamaForward::Forward with this forward's cache. `logits` may be null (cache only).
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits);

  CudaKvCache& cache() { return *cache_; }
  const CudaKvCache& cache() const { return *cache_; }
  const LlamaConfig& config() const { return config_; }
  int device() const { return device_; }
  int64_t weight_bytes() const { return weight_bytes_; }
  // Null when graphs are off for this forward.
  const CudaGraphCache* graphs() const { return graphs_.get(); }

 private:
  struct DeviceMatrix {
    DeviceBuffer buffer;
    WeightView view;  // data = buffer
  };
  struct DeviceLayer {
    DeviceBuffer attn_norm, ffn_norm;  // [d_model] f32
    DeviceMatrix wq, wk, wv, wo, w_gate, w_up, w_down;
  };

  CudaLlamaForward() = default;
  absl::StatusOr<DeviceMatrix> Upload(const WeightView& w);
  absl::StatusOr<DeviceBuffer> UploadNorm(const float* v, int64_t n);
  absl::Status Run(std::span<const BatchEntry> batch, const std::vector<int32_t>& pos0, int64_t n,
                   std::vector<float>* logits);
  // Embedding + every layer over the step's n rows: kernels only, graph-capturable.
  absl::Status Body(int64_t n);
  absl::Status Layer(int l, int64_t n);
  // Final norm + head over the rows that need logits, and the copy to the host.
  absl::Status Head(std::span<const BatchEntry> batch, std::vector<float>* logits);
  // Sums `h` [n, d_model] over the shards (no-op for a whole model).
  absl::Status AllReduce(float* h, int64_t count);
  // Grows `buf` to hold `bytes`, to a power of two so that a growing batch reallocates (and
  // invalidates captured graphs) only log(n) times; contents discarded when it grows.
  static absl::Status Ensure(DeviceBuffer& buf, size_t bytes);
  absl::Status ToDevice(DeviceBuffer& buf, const void* host, size_t bytes);

  LlamaConfig config_;
  int device_ = 0;
  int64_t weight_bytes_ = 0;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaMatMulContext> mm_;
  std::unique_ptr<CudaKvCache> cache_;
  DeviceMatrix token_embd_, output_;
  DeviceBuffer output_norm_;
  std::vector<DeviceLayer> layers_;
  int n_heads_ = 0, n_kv_heads_ = 0, d_ff_ = 0;
  PartialSumReducer* reducer_ = nullptr;

  // Per-step device buffers, grown on demand: activations [n, ...] f32, and the step's
  // integer tables packed into one buffer (one copy per step), each [n] int32 in this order:
  // token ids, positions, KV rows, per-token page-table row, context length; then the page
  // table [n_entries, page_stride_].
  DeviceBuffer x_, h_, q_, k_, v_, attn_, gate_, up_, normed_, logits_;
  DeviceBuffer tables_;
  std::vector<int32_t> h_tables_;  // host staging of tables_
  int page_stride_ = 0;            // pages per page-table row (>= any sequence's pages)
  std::unique_ptr<CudaGraphCache> graphs_;
};

}  // namespace specnode
