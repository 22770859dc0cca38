// Matmul on the GPU with W kept in its GGUF storage type: y = x · Wᵀ.
//
// Same contract as model/cpu_matmul.h (read that first): W is a WeightView with `rows`
// output features, each row of `cols` input values encoded in `type`, rows `row_stride`
// bytes apart; a column slice (tensor parallelism splitting the input dimension) is a view
// whose data points inside each row at a block boundary, row_stride still the full row's
// bytes. The difference: WeightView::data, x and y are DEVICE pointers here.
//
// Two algorithms:
//   kFused (default): one warp per output row dequantises W on the fly (Q4_0, Q4_1, Q8_0,
//     F16, BF16, F32) and dots it with up to 8 tokens of x at a time, accumulating in f32.
//     x stays f32 (it is not quantised to 8 bits as the CPU path does), so results match
//     MatMulReference to f32 rounding. Batch-invariant like the CPU MatMul: y[t, r] is
//     produced by the same instruction sequence whatever n is, so a token's output is
//     bit-identical at batch 1 and batch 16 (speculative verification relies on it).
//     Meant for decode / verification batches (n up to a few dozen); each further 8 tokens
//     re-read W.
//   kQuantAct: Q4_0, Q4_1, Q8_0 and the K-quants Q4_K, Q5_K, Q6_K (natively, in the
//     file's layout, with the CPU's K-quant arithmetic: cuda/q16_kquant.h; cols a multiple
//     of 256). x is first rounded to int16 blocks exactly as the CPU rounds it by default
//     (cuda/q16_dot.h), then each weight block's integer dot with
//     its activation block is one __dp2a per 2 values (cuda_qmatvec_kernels.h: weight rows
//     staged through shared memory with 16-byte loads). So the GPU sees the CPU's
//     activations and integer sums; rows differ from the CPU's MatMul only in the order
//     their block terms are added. Passes of 32 tokens or more (prefill, large
//     verification trees, batch decode at high occupancy) run on int8 tensor cores instead
//     (cuda_mma_kernels.h; sm_80 and newer, unless set_tensor_cores(false)), which add the
//     float terms in the same canonical order (cuda/q16_order.h): a (row, token) result is
//     the same bits from either kernel, so kQuantAct stays batch-invariant as kFused across
//     the switch. Needs a CudaMatMulContext (the int16 activations live in its scratch; see
//     ReserveQuantActs). What CudaBackend runs for quantised weights.
//   kStaged: F16 and BF16 only: rows staged through shared memory as kQuantAct stages them,
//     each lane's values multiplied by the f32 activations with fmaf in order (no
//     rounding of x); batch-invariant. What CudaBackend runs for 16-bit float weights.
//   kCublas: cublasGemmEx, for plain types only (F32, F16, BF16), meant for prefill. F16 and
//     BF16 W need x rounded to that type first (cuBLAS has no mixed f16 x f32 GEMM), which
//     costs precision (≈2^-11 resp. 2^-8 relative per product); accumulation is f32. NOT
//     batch-invariant (cuBLAS picks kernels by shape). Needs a CudaMatMulContext.
//
// Alignment (checked; InvalidArgument otherwise): x 16-byte aligned for quantised W and for
// kStaged (rows of x are read as 16-byte vectors), 4-byte otherwise; y 4-byte; W data and
// row_stride a multiple of 4 for Q4_1 and F32, of 2 for the other types. cudaMalloc'd buffers and
// whole-block column slices of ggml rows always satisfy this.
//
// Errors: argument problems return InvalidArgument before any CUDA call (so they are
// reported the same with or without a GPU); launch / cuBLAS failures return Internal with
// file:line (cuda/cuda_check.h). Kernels run asynchronously on the context's stream (the
// legacy default stream without a context); errors while they run surface at the next
// synchronising call.
#pragma once

#include <cublas_v2.h>
#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/device_buffer.h"
#include "model/gguf/weight_view.h"

namespace specnode {

enum class CudaMatMulAlgo {
  kFused,     // own kernels, every supported type, batch-invariant
  kQuantAct,  // int16 activations x Q4_0/Q4_1/Q8_0/K-quants, batch-invariant
  kStaged,    // F16/BF16 rows staged as kQuantAct's, f32 activations, batch-invariant
  kCublas,    // cublasGemmEx, F32/F16/BF16 only
};

// Per-stream state for CudaMatMul: a cuBLAS handle bound to `stream` and a scratch buffer
// (x converted to f16/bf16 for kCublas). Not thread-safe; one per stream. Owns neither the
// stream nor the device: create it with the intended device current.
class CudaMatMulContext {
 public:
  // `stream` may be nullptr (the legacy default stream). Fails (Internal, with cuBLAS's
  // reason) when cuBLAS cannot be initialised, e.g. without a device.
  static absl::StatusOr<std::unique_ptr<CudaMatMulContext>> Create(cudaStream_t stream);
  ~CudaMatMulContext();
  CudaMatMulContext(const CudaMatMulContext&) = delete;
  CudaMatMulContext& operator=(const CudaMatMulContext&) = delete;

  cudaStream_t stream() const { return stream_; }
  cublasHandle_t cublas() const { return cublas_; }
  // Grown on demand; growing frees the old buffer first (cudaFree waits for the device, so
  // kernels still reading it have finished).
  DeviceBuffer& scratch() { return scratch_; }

  // Makes the int16-activation scratch (kQuantAct) hold n tokens of `cols`, growing it to a
  // power of two when it does not. A growth frees the old buffer (as scratch()), so call it
  // outside CUDA-graph capture, before a pass whose launches a graph records (CudaBackend
  // does, in BeginPass); kQuantAct calls it too, where it is a no-op once reserved.
  absl::Status ReserveQuantActs(int64_t n, int64_t cols);
  // The int16-activation scratch's device address (part of a recorded pass's signature).
  const void* quant_acts() const { return acts_.data(); }

  // Whether kQuantAct runs passes of mma_min_tokens() tokens or more on tensor cores
  // (default true; CudaBackend turns it off below sm_80). Results are the same bits either
  // way; only the speed differs.
  bool tensor_cores() const { return tensor_cores_; }
  void set_tensor_cores(bool on) { tensor_cores_ = on; }
  // The pass size from which tensor cores take over (default
  // cuda_internal::kQ16MmaMinTokens, 32; >= 1). Where the crossover lies is a measurement
  // (bench_prefill_cuda prints both kernels from n = 2); any value keeps the results.
  int64_t mma_min_tokens() const { return mma_min_tokens_; }
  void set_mma_min_tokens(int64_t n) { mma_min_tokens_ = n < 1 ? 1 : n; }

 private:
  CudaMatMulContext() = default;

  cudaStream_t stream_ = nullptr;
  cublasHandle_t cublas_ = nullptr;
  DeviceBuffer scratch_;
  DeviceBuffer acts_;
  bool tensor_cores_ = true;
  int64_t mma_min_tokens_ = 32;  // cuda_internal::kQ16MmaMinTokens (cuda_mma_kernels.h)
};

// y[n, w.rows] = x[n, w.cols] · Wᵀ, all device pointers (W through w.data).
// `ctx` may be nullptr for kFused (launches on the legacy default stream); kCublas needs it.
// n == 0 or w.rows == 0 is a no-op. The input is validated as described above.
// x_quantised (kQuantAct only): ctx's int16 scratch already holds x [n, w.cols] rounded to
// int16 blocks (an RMSNorm or SwiGLU wrote it there: cuda_ops.h), so the rounding is skipped;
// x itself is not read. InvalidArgument with another algorithm.
absl::Status CudaMatMul(CudaMatMulContext* ctx, const WeightView& w, const float* x, int64_t n,
                        float* y, CudaMatMulAlgo algo = CudaMatMulAlgo::kFused,
                        bool x_quantised = false);

// ys[i][n, ws[i].rows] = x[n, cols] · ws[i]ᵀ for 1..3 matrices of the same cols (a layer's
// Q/K/V or gate/up), kFused: one launch when they share a weight type, one each otherwise.
// Every output is bit-identical to a separate CudaMatMul call with the same algo (same
// per-row instructions);
// the point is fewer launches in a decode step. Each matrix is validated as by CudaMatMul;
// InvalidArgument for a count or cols mismatch.
// With kQuantAct (every matrix quantised, ctx given) x is rounded to int16 once for all of
// them.
absl::Status CudaMatMulSharedInput(CudaMatMulContext* ctx, std::span<const WeightView> ws,
                                   const float* x, int64_t n, std::span<float* const> ys,
                                   CudaMatMulAlgo algo = CudaMatMulAlgo::kFused,
                                   bool x_quantised = false);

}  // namespace specnode
