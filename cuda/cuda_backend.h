// CudaBackend: the Backend (model/backend.h) on one GPU — today's CUDA kernels behind the
// ops of the one Llama graph (model/llama_forward.h): matmuls (cuda_matmul.h: kQuantAct
// for Q4_0/Q4_1/Q8_0 and the K-quants, kStaged for F16/BF16, kFused for F32; Q/K/V and
// gate/up in one launch each),
// RMSNorm with the residual add fused in, the Q/K RoPE pair, SwiGLU, embedding rows
// (cuda_ops.h, cuda_embedding.h). Every op is batch-invariant as on the CPU, so greedy speculation
// equals plain decoding here too; results differ from the CPU reference within the tolerances
// cuda/tests state (quantised matmuls round activations to int16 blocks as the CPU does by default;
// the rest of the arithmetic is f32 on both, summed in other orders).
//
// Everything runs on the backend's own stream. Per-step integer tables (token ids,
// positions, and what the KV page pool stages: cuda_page_pool.h) are packed into one host
// staging area and reach the device in one copy before the pass's first kernel.
//
// CUDA graphs: Record() replays the graph's body (embedding + layers) as a CUDA graph once a
// pass shape (its rows, up to 64: decode batches and verification passes, not prefill
// chunks) recurs with the same signature (cuda_graph_cache.h). Graphs run exactly the
// kernels of the eager pass: bit-identical results. Off with
// CudaBackendOptions::cuda_graphs = false or SPECNODE_CUDA_GRAPHS=0.
//
// Not thread-safe. Create() and every call with the backend's device current (calls set it).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/cuda_graph_cache.h"
#include "cuda/cuda_matmul.h"
#include "cuda/cuda_qmatvec_kernels.h"
#include "cuda/device_buffer.h"
#include "kvstore/kv_budget.h"
#include "model/llama/backend.h"
#include "model/llama/backend_caps.h"

namespace specnode {

struct CudaBackendOptions {
  int device = 0;
  // Replay recurring pass shapes as CUDA graphs (see above).
  bool cuda_graphs = true;
  // Quantised matmuls with int16 activations (CudaMatMulAlgo::kQuantAct, K-quants as
  // stored) and F16/BF16 ones staged (kStaged); false runs kFused for every type (K-quants
  // converted at upload), as does SPECNODE_CUDA_QUANT_ACT=0 in the environment:
  // for A/B measurements and diagnosis. Fixed for the backend's life, so a row's result
  // does not depend on the batch.
  bool quant_act = true;
  // kQuantAct passes of 32 tokens or more on int8 tensor cores (sm_80 and newer;
  // CudaMatMulContext::tensor_cores); false, or SPECNODE_CUDA_TENSOR_CORES=0, keeps every
  // pass on the dp2a kernel. The results are the same bits either way (cuda/q16_order.h):
  // for A/B speed measurements.
  bool tensor_cores = true;
};

// One step's integer tables: staged on the host by the backend and the KV page pool, then
// copied to the device together. Offsets are in int32 values from the start of the step's
// tables. The first Stage after an Upload starts the next step's tables.
class CudaStepTables {
 public:
  // Starts a step's tables (drops whatever was staged and not uploaded).
  void Restart();
  // Appends `count` zeroed values and returns their offset.
  int64_t Stage(int64_t count);
  // The host staging of offset `offset`, to fill before Upload (valid until the next Stage).
  int32_t* staged(int64_t offset) { return host_.data() + offset; }
  // Copies the staged tables to the device on `stream` (no-op when already uploaded).
  absl::Status Upload(cudaStream_t stream);
  // The device address of offset `offset` of the uploaded tables.
  const int32_t* device(int64_t offset) const { return buffer_.as<int32_t>() + offset; }
  const void* device_base() const { return buffer_.data(); }

 private:
  std::vector<int32_t> host_;
  DeviceBuffer buffer_;
  bool uploaded_ = true;
};

class CudaBackend final : public Backend {
 public:
  // Selects options.device and creates the stream and cuBLAS handle. Unavailable without a
  // usable device; InvalidArgument for a device that does not exist.
  static absl::StatusOr<std::unique_ptr<CudaBackend>> Create(const CudaBackendOptions& options);

  // The capability table (model/llama/backend_caps.h), asked before any weight moves: every
  // graph feature, head_dim <= 256 (the attention kernels hold a row in one block), int16
  // activations only.
  static BackendCaps Caps();
  ~CudaBackend() override;
  CudaBackend(const CudaBackend&) = delete;
  CudaBackend& operator=(const CudaBackend&) = delete;

  Device device() const override { return Device::Cuda(device_); }
  std::string Describe() const override;
  // Copies every matrix (compacted to its own rows, in its GGUF storage type) and norm (f32)
  // to the device; a tied head shares the embedding's copy.
  absl::StatusOr<std::shared_ptr<const LlamaWeights>> UploadWeights(
      std::shared_ptr<const LlamaWeights> weights) override;
  absl::StatusOr<float*> Buffer(int slot, int64_t floats) override;
  absl::Status BeginPass(std::span<const int32_t> ids, std::span<const int32_t> positions) override;
  absl::Status EmbeddingRows(const WeightView& table, float* out) override;
  absl::Status RmsNorm(const float* x, const float* weight, int64_t n, int dim, float eps,
                       float* y) override;
  absl::Status AddRmsNorm(float* x, const float* h, const float* weight, int64_t n, int dim,
                          float eps, float* y) override;
  absl::Status RmsNormRows(const float* x, std::span<const int64_t> rows, const float* weight,
                           int dim, float eps, float* y) override;
  absl::Status Add(float* y, const float* x, int64_t count) override;
  absl::Status MatMul(const WeightView& w, const float* x, int64_t n, float* y) override;
  absl::Status MatMulShared(std::span<const WeightView> ws, const float* x, int64_t n,
                            std::span<float* const> ys) override;
  absl::Status RopePair(float* q, float* k, int64_t n, int n_heads, int n_kv_heads, int head_dim,
                        int rope_dim, float base, RopeMode mode,
                        const float* freq_factors) override;
  // Refused (Unimplemented): no bias kernel has run on a device yet; UploadWeights refuses
  // weights with biases first.
  absl::Status AddBias(float* y, const float* bias, int64_t n, int dim) override;
  absl::Status SwiGlu(const float* gate, const float* up, int64_t count, float* out) override;
  // Refused (Unimplemented) until kernels for them ran on a device (UploadWeights refuses
  // the architectures that need them first).
  absl::Status GeGlu(const float* gate, const float* up, int64_t count, float* out) override;
  absl::Status Scale(float* x, int64_t count, float s) override;
  // Synchronises the stream, then calls the reducer (an NCCL all-reduce over device
  // buffers), which returns with the sum in place.
  absl::Status AllReduce(PartialSumReducer* reducer, float* data, int64_t count) override;
  absl::StatusOr<float*> LogitsBuffer(int64_t floats, std::vector<float>* host) override;
  absl::Status FinishLogits(const float* logits, int64_t floats, std::vector<float>* host) override;
  // The arg max of each row on the device (CudaArgMaxRows); only the ids are copied back.
  absl::Status FinishArgMax(const float* logits, int64_t rows, int64_t vocab,
                            std::vector<float>* host, std::vector<int32_t>* ids,
                            bool selected) override;
  // Each row's k largest on the device (CudaTopKRows); only rows * k pairs are copied back.
  // k above kCudaTopKMax: the default (the logits to the host, TopK there).
  // CudaDrawRows (cuda/cuda_sample.h) after the pass: the draws go up into draw_params_,
  // one id a row comes back. With a top-p row, CudaTopKRows first sorts every row's head of
  // sample::kNucleusHead into draw_head_ids_ / draw_head_values_; a row whose nucleus is
  // wider than that comes to the host (`host`) and is drawn there (DrawRows).
  absl::Status FinishDraws(const float* logits, int64_t rows, int64_t vocab,
                           std::span<const sample::DrawParams> draws, std::vector<float>* host,
                           std::vector<int32_t>* ids) override;
  absl::Status FinishTopK(const float* logits, int64_t rows, int64_t vocab, int k,
                          std::vector<float>* host, std::vector<int32_t>* ids,
                          std::vector<float>* values, bool selected) override;
  // Launches CudaArgMaxRows (k == 0) or CudaTopKRows into argmax_ids_ / topk_values_ (their
  // addresses go into Record's signature); nothing for k > kCudaTopKMax.
  absl::Status SelectHead(const float* logits, int64_t rows, int64_t vocab, int k) override;
  absl::Status Sync() override;
  absl::Status Record(int64_t rows, uint64_t signature,
                      const std::function<absl::Status()>& body) override;

  // For the page pool on this device (cuda_page_pool.h): the stream its kernels share and
  // the step tables it stages into. Staged tables reach the device before the first kernel
  // that reads them: Record uploads them, as do EmbeddingRows, RopePair and the pool's
  // Write / Attend (UploadTables: a no-op once uploaded), so a recorded body never copies.
  int device_index() const { return device_; }
  cudaStream_t stream() const { return stream_; }
  CudaStepTables& tables() { return tables_; }
  absl::Status UploadTables() { return tables_.Upload(stream_); }
  // Whether quantised matmuls run kQuantAct (CudaBackendOptions::quant_act).
  bool quant_act() const { return quant_act_; }
  // The page pool's attention as a producer of int16 activations (see ProduceQ16 below):
  // where it writes its output's int16 blocks, `values` floats in rows of `row_len`, so
  // that the output projection, the next backend call, skips its own rounding. Null: the
  // pool writes none.
  const cuda_internal::Q16Acts* ProduceQ16ForPool(const float* y, int64_t values, int64_t row_len) {
    return ProduceQ16(y, values, row_len);
  }
  // Null when graphs are off.
  const CudaGraphCache* graphs() const { return graphs_.get(); }
  int64_t weight_bytes() const { return weight_bytes_; }
  // This GPU's memory now (cudaMemGetInfo: total, and total − free as used by every
  // process), for the KV budget of kv.memory_utilization (kvstore/kv_budget.h).
  absl::StatusOr<DeviceMemoryInfo> MemoryInfo() const;

 private:
  CudaBackend() = default;
  // Grows `buf` to hold `bytes`, to a power of two so that a growing batch reallocates (and
  // invalidates captured graphs) only log(n) times; contents discarded when it grows.
  static absl::Status Ensure(DeviceBuffer& buf, size_t bytes);
  CudaMatMulAlgo AlgoFor(const WeightView& w) const;

  // The hand-off of int16 activations from a producer to the next matmul: a norm or SwiGLU
  // (ProduceQ16) also writes its output y, `values` floats in rows of `row_len`, rounded to
  // int16 blocks into the matmul scratch, and notes it; the matmul that comes next
  // (TakeQ16: the very next backend call, on x == y with n x cols == values) skips its own
  // rounding. Every other backend call forgets it (ForgetQ16), so no op can change y in
  // between; the KV page pool's calls come between RopePair and the output projection only,
  // and its Attend produces (ProduceQ16ForPool).
  // Null (nothing produced) when kQuantAct is off or the rows are not whole blocks.
  const cuda_internal::Q16Acts* ProduceQ16(const float* y, int64_t values, int64_t row_len);
  bool TakeQ16(const float* x, int64_t values);
  void ForgetQ16() { q16_of_ = nullptr; }

  int device_ = 0;
  std::string device_name_;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaMatMulContext> mm_;
  std::unique_ptr<CudaGraphCache> graphs_;
  std::array<DeviceBuffer, kMaxSlots> buffers_;
  DeviceBuffer logits_;
  DeviceBuffer argmax_ids_;   // FinishArgMax's [rows] int32, FinishTopK's [rows, k]
  DeviceBuffer topk_values_;  // FinishTopK's [rows, k] float
  DeviceBuffer draw_params_;  // FinishDraws' [rows] sample::DrawParams
  DeviceBuffer draw_head_ids_;     // FinishDraws' top-p heads: [rows, kNucleusHead] int32
  DeviceBuffer draw_head_values_;  // and their logits, float
  CudaStepTables tables_;
  int64_t ids_ = 0, positions_ = 0;  // the pass's offsets in tables_
  int64_t rows_ = 0;
  int64_t weight_bytes_ = 0;
  bool quant_act_ = true;
  const float* q16_of_ = nullptr;  // see ProduceQ16
  int64_t q16_values_ = 0;
  cuda_internal::Q16Acts q16_acts_{};
  int64_t max_matmul_cols_ = 0;  // widest matrix uploaded (the int16 activations' scratch)
};

}  // namespace specnode
