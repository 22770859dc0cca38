// Element-wise and per-row operations of the Llama forward pass on the GPU: the CUDA
// counterparts of model/cpu_ops.h, with the same semantics (read that header first) and the
// same argument order. Every pointer is a DEVICE pointer; every tensor is f32 row-major.
//
// All functions launch asynchronously on `stream` (nullptr: the legacy default stream) and
// return InvalidArgument for bad arguments (before any CUDA call) or Internal with file:line
// when the launch fails. Errors while a kernel runs surface at the next synchronising call.
// Like the CPU versions they are batch-invariant: a row's result never depends on n.
//
// Precision against the CPU reference:
//   CudaRmsNorm   the sum of squares is accumulated in double as on the CPU (different
//                 order), the scale is computed in double and rounded once: results agree
//                 to about 1 ulp.
//   CudaRopeNorm  angles, cos and sin in double as on the CPU (CUDA's double pow/sin/cos are
//                 within 2 ulp of glibc's), then the same f32 rotation: ~1 ulp.
//   CudaSwiGlu    expf is within 2 ulp of glibc's: a few ulp.
//   CudaGeGlu     double arithmetic as on the CPU, rounded once: ~1 ulp.
//   CudaScale, CudaAddBias: one f32 operation each, exactly the CPU's.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "cuda/cuda_qmatvec_kernels.h"

namespace specnode {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight for n rows of dim values.
// x, y: [n, dim] (may alias exactly); weight: [dim]. One thread block per row.
// q16 (optional; dim a multiple of 32): also writes y rounded to int16 blocks there, as
// LaunchQuantizeActs16 would (the same bytes: q16_dot.h's WarpQuantizeBlock16), so a
// kQuantAct matmul of y can skip its own rounding (CudaMatMul's x_quantised).
absl::Status CudaRmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                         float* y, cudaStream_t stream = nullptr,
                         const cuda_internal::Q16Acts* q16 = nullptr);

// The residual add and the next norm in one launch: x += h, then y = RmsNorm(x) * weight,
// bit-identical to CudaAddInPlace(x, h) followed by CudaRmsNorm(x, weight, ..., y).
// x: [n, dim] (updated in place); h, y: [n, dim], y may alias h exactly (not x).
// q16 as CudaRmsNorm's.
absl::Status CudaAddRmsNorm(float* x, const float* h, const float* weight, int64_t n, int64_t dim,
                            float eps, float* y, cudaStream_t stream = nullptr,
                            const cuda_internal::Q16Acts* q16 = nullptr);

// Rotary position embedding in ggml "NORM" mode (adjacent pairs), in place.
// x: [n, n_heads, head_dim]; positions: [n] (device int32). Pair (2i, 2i+1) of each head is
// rotated by positions[t] * base^(-2i / rope_dim) for 2i < rope_dim; the rest is untouched.
// Requires n_heads >= 1, 0 <= rope_dim <= head_dim.
absl::Status CudaRopeNorm(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim,
                          int rope_dim, float base, cudaStream_t stream = nullptr);

// CudaRopeNorm on two tensors in one launch (a layer's Q and K): x [n, n_heads, head_dim]
// and x2 [n, n_heads2, head_dim] (n_heads2 may be 0, x2 then unused), same positions; each
// value bit-identical to its own CudaRopeNorm call.
absl::Status CudaRopeNormPair(float* x, float* x2, const int32_t* positions, int64_t n, int n_heads,
                              int n_heads2, int head_dim, int rope_dim, float base,
                              cudaStream_t stream = nullptr);

// Both modes of the CPU's RopeAngles + RopeApply (model/cpu/cpu_ops.h) on two tensors in one
// launch: neox rotates dims (i, i + rope_dim / 2) instead of (2i, 2i + 1); freq_factors
// (device [rope_dim / 2], or null) divide each pair's angle (rope_freqs.weight).
// CudaRopeNormPair is this with neox false and no factors.
absl::Status CudaRopePair(float* x, float* x2, const int32_t* positions, int64_t n, int n_heads,
                          int n_heads2, int head_dim, int rope_dim, float base, bool neox,
                          const float* freq_factors, cudaStream_t stream = nullptr);

// out[i] = silu(gate[i]) * up[i] for n values; silu(g) = g / (1 + exp(-g)).
// gate, up, out: [n]; out may alias gate or up exactly. q16 (optional; n a multiple of 32):
// out rounded to int16 blocks of 32 consecutive values, as CudaRmsNorm's.
absl::Status CudaSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                        cudaStream_t stream = nullptr, const cuda_internal::Q16Acts* q16 = nullptr);

// ids[r] = the index of row r's largest value, lowest on ties (model/llama/sampling.h's
// ArgMax), or -1 when the row holds a NaN or an infinity. x: [n, cols]; ids: [n] int32.
// One block per row (a greedy head: only n ints leave the device).
absl::Status CudaArgMaxRows(const float* x, int64_t n, int64_t cols, int32_t* ids,
                            cudaStream_t stream = nullptr);

// out[i] = gelu_tanh(gate[i]) * up[i] (model/cpu/cpu_ops.h GeGlu: computed in double and
// rounded once, as there; CUDA's double tanh is within 1 ulp of glibc's). q16 as CudaSwiGlu's.
absl::Status CudaGeGlu(const float* gate, const float* up, int64_t n, float* out,
                       cudaStream_t stream = nullptr, const cuda_internal::Q16Acts* q16 = nullptr);

// x[i] *= s for n values (Gemma's embedding scale): exactly the CPU's ScaleInPlace.
absl::Status CudaScale(float* x, int64_t n, float s, cudaStream_t stream = nullptr);

// y[r, j] += bias[j] for n rows of dim values (Q/K/V biases): exactly the CPU's AddBias.
absl::Status CudaAddBias(float* y, const float* bias, int64_t n, int dim,
                         cudaStream_t stream = nullptr);

// y[i] += x[i] for n values. x, y: [n].
absl::Status CudaAddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream = nullptr);

}  // namespace specnode
