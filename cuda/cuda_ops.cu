#include "cuda/cuda_ops.h"

#include <climits>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"
#include "cuda/q16_dot.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

constexpr int kElementwiseThreads = 256;
// Grid-stride loops cap the grid; 65535 blocks keep every SM busy on any current GPU.
constexpr int64_t kMaxElementwiseBlocks = 65535;

unsigned ElementwiseBlocks(int64_t count) {
  const int64_t blocks = (count + kElementwiseThreads - 1) / kElementwiseThreads;
  return static_cast<unsigned>(blocks < kMaxElementwiseBlocks ? blocks : kMaxElementwiseBlocks);
}

// x and y are not __restrict__: the API allows y == x. Each element is read and then
// written by the same thread, so in-place is safe.
// kAdd: first x += h (the residual add), then the norm of the updated x: one launch with
// exactly the operations of AddInPlaceKernel followed by the plain norm. h may alias y
// exactly (each thread reads h[i] before it writes y[i], for the same i); x aliases neither.
// Block: NormThreads(dim) threads, each taking kNormUnroll values per pass (i, i + T, ...)
// whose loads are all issued before the first store: with the stores possibly aliasing the
// loads the compiler cannot overlap iterations itself, and one load latency per element
// (16 in a row of 4096 on 256 threads) was what the H200 measured (4.6-14.6 us a call).
// The block size depends on dim only, so a row's result does not depend on the batch.
constexpr int kNormMaxThreads = 1024;
constexpr int kNormUnroll = 4;

int NormThreads(int64_t dim) {
  const int64_t want = (dim + kNormUnroll - 1) / kNormUnroll;
  const int64_t rounded = (want + 31) / 32 * 32;
  return static_cast<int>(rounded < kNormMaxThreads ? rounded : kNormMaxThreads);
}

template <bool kAdd>
__global__ void __launch_bounds__(kNormMaxThreads)
    RmsNormKernel(float* x, const float* h, const float* __restrict__ weight, int64_t dim,
                  float eps, float* y, int16_t* qs, float* qd, float* qsum) {
  float* xr = x + static_cast<int64_t>(blockIdx.x) * dim;
  float* yr = y + static_cast<int64_t>(blockIdx.x) * dim;
  const int64_t step = blockDim.x;
  // Double accumulation as in the CPU reference; FP64 throughput is ample for one row.
  double sum = 0.0;
  for (int64_t base = threadIdx.x; base < dim; base += step * kNormUnroll) {
    float xv[kNormUnroll], hv[kNormUnroll];
#pragma unroll
    for (int j = 0; j < kNormUnroll; ++j) {
      const int64_t i = base + j * step;
      xv[j] = i < dim ? xr[i] : 0.0f;
      if constexpr (kAdd) hv[j] = i < dim ? h[static_cast<int64_t>(blockIdx.x) * dim + i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kNormUnroll; ++j) {
      const int64_t i = base + j * step;
      if (i >= dim) break;
      if constexpr (kAdd) {
        xv[j] += hv[j];
        xr[i] = xv[j];
      }
      const double v = xv[j];
      sum += v * v;
    }
  }
  for (int offset = 16; offset > 0; offset >>= 1) sum += __shfl_xor_sync(0xffffffffu, sum, offset);
  __shared__ double warp_sums[kNormMaxThreads / 32];
  __shared__ float scale;
  const int warp = threadIdx.x / 32;
  if ((threadIdx.x & 31) == 0) warp_sums[warp] = sum;
  __syncthreads();
  if (threadIdx.x == 0) {
    double total = 0.0;
    for (int w = 0; w < static_cast<int>(blockDim.x / 32); ++w) total += warp_sums[w];
    scale = static_cast<float>(1.0 / sqrt(total / static_cast<double>(dim) + eps));
  }
  __syncthreads();
  const float s = scale;
  for (int64_t base = threadIdx.x; base < dim; base += step * kNormUnroll) {
    float xv[kNormUnroll], wv[kNormUnroll];
#pragma unroll
    for (int j = 0; j < kNormUnroll; ++j) {
      const int64_t i = base + j * step;
      xv[j] = i < dim ? xr[i] : 0.0f;
      wv[j] = i < dim ? weight[i] : 0.0f;
    }
#pragma unroll
    for (int j = 0; j < kNormUnroll; ++j) {
      const int64_t i = base + j * step;
      if (i < dim) {
        const float yv = xv[j] * s * wv[j];
        yr[i] = yv;
        // With int16 outputs dim % 32 == 0, so a warp's 32 values are one whole block
        // (i % 32 is the lane): the branch above is warp-uniform.
        if (qs != nullptr) {
          const int64_t at = static_cast<int64_t>(blockIdx.x) * dim + i;
          q16::WarpQuantizeBlock16(yv, static_cast<int>(i & 31), qs + (at - (i & 31)), qd + at / 32,
                                   qsum + at / 32);
        }
      }
    }
  }
}

// One thread per (token, head, pair). The angle is recomputed per head rather than shared
// so that a single decode token still spreads over n_heads * rope_dim / 2 threads. Two
// tensors per launch (Q and K of a layer): indices past x's n * n_heads * half_rope pairs
// rotate x2's (n_heads2 heads; 0 for none), each pair exactly as in its own launch.
// Pair i of every head: dims (2i, 2i + 1), or NeoX (i, i + rope_dim / 2); the angle
// pos * base^(-2i / rope_dim) [/ freq_factors[i]] as the CPU's RopeAngles computes it.
__global__ void RopeKernel(float* x, float* x2, const int32_t* __restrict__ positions, int64_t n,
                           int n_heads, int n_heads2, int head_dim, int half_rope, int rope_dim,
                           double base, int neox, const float* __restrict__ freq_factors) {
  const int64_t first = n * n_heads * half_rope;
  const int64_t total = first + n * n_heads2 * half_rope;
  for (int64_t k = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; k < total;
       k += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const bool second = k >= first;
    const int64_t idx = second ? k - first : k;
    float* const xs = second ? x2 : x;
    const int heads = second ? n_heads2 : n_heads;
    const int i = static_cast<int>(idx % half_rope);
    const int64_t th = idx / half_rope;  // t * n_heads + h
    const int64_t t = th / heads;
    // Same expression as the CPU: pos * base^(-2i / rope_dim), all in double.
    double theta = static_cast<double>(positions[t]) * pow(base, -2.0 * i / rope_dim);
    if (freq_factors != nullptr) theta /= static_cast<double>(freq_factors[i]);
    double sd, cd;
    sincos(theta, &sd, &cd);
    const float c = static_cast<float>(cd);
    const float s = static_cast<float>(sd);
    float* p = xs + th * head_dim + (neox ? i : 2 * i);
    const int other = neox ? half_rope : 1;
    const float a = p[0];
    const float b = p[other];
    // __fmul_rn / __fadd_rn keep nvcc from contracting into FMAs the CPU does not use.
    p[0] = __fadd_rn(__fmul_rn(a, c), -__fmul_rn(b, s));
    p[other] = __fadd_rn(__fmul_rn(a, s), __fmul_rn(b, c));
  }
}

// With int16 outputs (qs non-null) n % 32 == 0: a warp's 32 values are one block and the
// loop is warp-uniform (block and grid sizes are multiples of 32).
// SwiGLU (kGelu false) or GeGLU with the tanh GELU (true), optionally with the output's int16
// blocks (a warp holds 32 consecutive values in every pass of the grid-stride loop).
template <bool kGelu>
__global__ void GluKernel(const float* gate, const float* up, int64_t n, float* out, int16_t* qs,
                          float* qd, float* qsum) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    float o;
    if constexpr (kGelu) {
      // The CPU's GeGlu (model/cpu/cpu_ops.cc) in double, rounded once.
      constexpr double kSqrt2OverPi = 0.79788456080286535588;
      const double gd = g;
      const double gelu = 0.5 * gd * (1.0 + tanh(kSqrt2OverPi * (gd + 0.044715 * gd * gd * gd)));
      o = static_cast<float>(gelu * static_cast<double>(up[i]));
    } else {
      o = g / (1.0f + expf(-g)) * up[i];
    }
    out[i] = o;
    if (qs != nullptr) {
      q16::WarpQuantizeBlock16(o, static_cast<int>(i & 31), qs + (i - (i & 31)), qd + i / 32,
                               qsum + i / 32);
    }
  }
}

// x[i] *= s.
__global__ void ScaleKernel(float* x, int64_t n, float s) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    x[i] *= s;
  }
}

// y[r, j] += bias[j] for rows of dim values.
__global__ void AddBiasKernel(float* y, const float* __restrict__ bias, int64_t total, int dim) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < total;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += bias[i % dim];
  }
}

// The better of two (value, index) candidates: the larger value, the lower index on ties.
__device__ __forceinline__ void BetterOf(float ov, int oi, float& v, int& i) {
  if (ov > v || (ov == v && oi < i)) {
    v = ov;
    i = oi;
  }
}

// One block per row: each thread the best of its strided values, then the warps' and the
// block's bests; a NaN or an infinity anywhere makes the row's id -1.
constexpr int kArgMaxThreads = 256;
__global__ void __launch_bounds__(kArgMaxThreads)
    ArgMaxRowsKernel(const float* __restrict__ x, int64_t cols, int32_t* __restrict__ ids) {
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  float v = -INFINITY;
  int i = INT_MAX;
  int bad = 0;
  for (int64_t c = threadIdx.x; c < cols; c += kArgMaxThreads) {
    const float e = row[c];
    if (!isfinite(e)) bad = 1;
    BetterOf(e, static_cast<int>(c), v, i);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    const float ov = __shfl_xor_sync(0xffffffffu, v, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, i, offset);
    BetterOf(ov, oi, v, i);
  }
  __shared__ float warp_v[kArgMaxThreads / 32];
  __shared__ int warp_i[kArgMaxThreads / 32];
  if (threadIdx.x % 32 == 0) {
    warp_v[threadIdx.x / 32] = v;
    warp_i[threadIdx.x / 32] = i;
  }
  bad = __syncthreads_or(bad);
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgMaxThreads / 32; ++w) BetterOf(warp_v[w], warp_i[w], v, i);
    ids[blockIdx.x] = bad ? -1 : i;
  }
}

__global__ void AddInPlaceKernel(float* y, const float* x, int64_t n) {
  for (int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<int64_t>(gridDim.x) * blockDim.x) {
    y[i] += x[i];
  }
}

}  // namespace

namespace {

// The int16 outputs' pointers, or nulls; InvalidArgument when `block_multiple` (a row's or
// the whole count of values) is not whole 32-value blocks.
absl::Status Q16Outputs(const cuda_internal::Q16Acts* q16, int64_t block_multiple, const char* what,
                        int16_t** qs, float** qd, float** qsum) {
  *qs = nullptr;
  *qd = *qsum = nullptr;
  if (q16 == nullptr) return absl::OkStatus();
  if (block_multiple % 32 != 0 || q16->qs == nullptr || q16->d == nullptr || q16->s == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat(what, ": int16 outputs need rows of whole 32-value blocks (", block_multiple,
                     ") and three buffers"));
  }
  *qs = q16->qs;
  *qd = q16->d;
  *qsum = q16->s;
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaRmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps,
                         float* y, cudaStream_t stream, const cuda_internal::Q16Acts* q16) {
  if (n < 0 || dim <= 0 || n > INT32_MAX) {
    return absl::InvalidArgumentError(absl::StrCat("CudaRmsNorm: bad shape n=", n, " dim=", dim));
  }
  if (n == 0) return absl::OkStatus();
  if (x == nullptr || weight == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("CudaRmsNorm: null pointer");
  }
  int16_t* qs;
  float *qd, *qsum;
  SPECNODE_RETURN_IF_ERROR(Q16Outputs(q16, dim, "CudaRmsNorm", &qs, &qd, &qsum));
  // The plain norm never writes x (kAdd is false); the cast only shares the kernel.
  RmsNormKernel<false><<<static_cast<unsigned>(n), NormThreads(dim), 0, stream>>>(
      const_cast<float*>(x), nullptr, weight, dim, eps, y, qs, qd, qsum);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("RmsNormKernel");
  return absl::OkStatus();
}

absl::Status CudaAddRmsNorm(float* x, const float* h, const float* weight, int64_t n, int64_t dim,
                            float eps, float* y, cudaStream_t stream,
                            const cuda_internal::Q16Acts* q16) {
  if (n < 0 || dim <= 0 || n > INT32_MAX) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaAddRmsNorm: bad shape n=", n, " dim=", dim));
  }
  if (n == 0) return absl::OkStatus();
  if (x == nullptr || h == nullptr || weight == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("CudaAddRmsNorm: null pointer");
  }
  if (x == h || x == y) {
    return absl::InvalidArgumentError("CudaAddRmsNorm: x may not alias h or y");
  }
  int16_t* qs;
  float *qd, *qsum;
  SPECNODE_RETURN_IF_ERROR(Q16Outputs(q16, dim, "CudaAddRmsNorm", &qs, &qd, &qsum));
  RmsNormKernel<true><<<static_cast<unsigned>(n), NormThreads(dim), 0, stream>>>(
      x, h, weight, dim, eps, y, qs, qd, qsum);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("RmsNormKernel<add>");
  return absl::OkStatus();
}

absl::Status CudaRopeNorm(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim,
                          int rope_dim, float base, cudaStream_t stream) {
  return CudaRopePair(x, nullptr, positions, n, n_heads, 0, head_dim, rope_dim, base, false,
                      nullptr, stream);
}

absl::Status CudaRopeNormPair(float* x, float* x2, const int32_t* positions, int64_t n, int n_heads,
                              int n_heads2, int head_dim, int rope_dim, float base,
                              cudaStream_t stream) {
  return CudaRopePair(x, x2, positions, n, n_heads, n_heads2, head_dim, rope_dim, base, false,
                      nullptr, stream);
}

absl::Status CudaRopePair(float* x, float* x2, const int32_t* positions, int64_t n, int n_heads,
                          int n_heads2, int head_dim, int rope_dim, float base, bool neox,
                          const float* freq_factors, cudaStream_t stream) {
  if (n < 0 || n_heads <= 0 || n_heads2 < 0 || head_dim <= 0 || rope_dim < 0 ||
      rope_dim > head_dim) {
    return absl::InvalidArgumentError(absl::StrCat("CudaRope: bad shape n=", n,
                                                   " n_heads=", n_heads, "+", n_heads2,
                                                   " head_dim=", head_dim, " rope_dim=", rope_dim));
  }
  const int half_rope = rope_dim / 2;
  if (n == 0 || half_rope == 0) return absl::OkStatus();
  if (x == nullptr || positions == nullptr || (n_heads2 > 0 && x2 == nullptr)) {
    return absl::InvalidArgumentError("CudaRope: null pointer");
  }
  const int64_t total = n * (n_heads + n_heads2) * half_rope;
  RopeKernel<<<ElementwiseBlocks(total), kElementwiseThreads, 0, stream>>>(
      x, x2, positions, n, n_heads, n_heads2, head_dim, half_rope, rope_dim,
      static_cast<double>(base), neox ? 1 : 0, freq_factors);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("RopeKernel");
  return absl::OkStatus();
}

namespace {

absl::Status LaunchGlu(bool gelu, const float* gate, const float* up, int64_t n, float* out,
                       cudaStream_t stream, const cuda_internal::Q16Acts* q16, const char* what) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat(what, ": bad n=", n));
  if (n == 0) return absl::OkStatus();
  if (gate == nullptr || up == nullptr || out == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(what, ": null pointer"));
  }
  int16_t* qs;
  float *qd, *qsum;
  SPECNODE_RETURN_IF_ERROR(Q16Outputs(q16, n, what, &qs, &qd, &qsum));
  if (gelu) {
    GluKernel<true>
        <<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(gate, up, n, out, qs, qd, qsum);
  } else {
    GluKernel<false>
        <<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(gate, up, n, out, qs, qd, qsum);
  }
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("GluKernel");
  return absl::OkStatus();
}

}  // namespace

absl::Status CudaSwiGlu(const float* gate, const float* up, int64_t n, float* out,
                        cudaStream_t stream, const cuda_internal::Q16Acts* q16) {
  return LaunchGlu(false, gate, up, n, out, stream, q16, "CudaSwiGlu");
}

absl::Status CudaGeGlu(const float* gate, const float* up, int64_t n, float* out,
                       cudaStream_t stream, const cuda_internal::Q16Acts* q16) {
  return LaunchGlu(true, gate, up, n, out, stream, q16, "CudaGeGlu");
}

absl::Status CudaScale(float* x, int64_t n, float s, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("CudaScale: bad n=", n));
  if (n == 0) return absl::OkStatus();
  if (x == nullptr) return absl::InvalidArgumentError("CudaScale: null pointer");
  ScaleKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(x, n, s);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("ScaleKernel");
  return absl::OkStatus();
}

absl::Status CudaAddBias(float* y, const float* bias, int64_t n, int dim, cudaStream_t stream) {
  if (n < 0 || dim <= 0) {
    return absl::InvalidArgumentError(absl::StrCat("CudaAddBias: bad n=", n, " dim=", dim));
  }
  if (n == 0) return absl::OkStatus();
  if (y == nullptr || bias == nullptr)
    return absl::InvalidArgumentError("CudaAddBias: null pointer");
  AddBiasKernel<<<ElementwiseBlocks(n * dim), kElementwiseThreads, 0, stream>>>(y, bias, n * dim,
                                                                                dim);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("AddBiasKernel");
  return absl::OkStatus();
}

absl::Status CudaAddInPlace(float* y, const float* x, int64_t n, cudaStream_t stream) {
  if (n < 0) return absl::InvalidArgumentError(absl::StrCat("CudaAddInPlace: bad n=", n));
  if (n == 0) return absl::OkStatus();
  if (y == nullptr || x == nullptr) {
    return absl::InvalidArgumentError("CudaAddInPlace: null pointer");
  }
  AddInPlaceKernel<<<ElementwiseBlocks(n), kElementwiseThreads, 0, stream>>>(y, x, n);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("AddInPlaceKernel");
  return absl::OkStatus();
}

absl::Status CudaArgMaxRows(const float* x, int64_t n, int64_t cols, int32_t* ids,
                            cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff || cols <= 0 || cols > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaArgMaxRows: bad shape n=", n, " cols=", cols));
  }
  if (n == 0) return absl::OkStatus();
  if (x == nullptr || ids == nullptr) {
    return absl::InvalidArgumentError("CudaArgMaxRows: null pointer");
  }
  ArgMaxRowsKernel<<<static_cast<unsigned>(n), kArgMaxThreads, 0, stream>>>(x, cols, ids);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("ArgMaxRowsKernel");
  return absl::OkStatus();
}

}  // namespace specnode
