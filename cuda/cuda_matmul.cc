#include "cuda/cuda_matmul.h"

#include <climits>
#include <cstdint>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_matmul_kernels.h"
#include "cuda/cuda_mma_kernels.h"
#include "cuda/cuda_qmatvec_kernels.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

bool Aligned(const void* p, size_t alignment) {
  return reinterpret_cast<uintptr_t>(p) % alignment == 0;
}

// Alignment the fused kernels' loads need for W's data and row_stride.
size_t WeightAlignment(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_1:
    case GgmlType::kF32:
      return 4;
    default:
      return 2;
  }
}

std::string TypeName(GgmlType type) {
  return std::string(GgmlTypeName(static_cast<uint32_t>(type)));
}

absl::Status ValidateArgs(const WeightView& w, const float* x, int64_t n, const float* y) {
  if (!IsComputeGgmlType(w.type) && !cuda_internal::Q16Runs(w.type)) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaMatMul: unsupported weight type ", TypeName(w.type)));
  }
  if (n < 0 || w.rows < 0 || w.cols <= 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaMatMul: bad shape n=", n, " rows=", w.rows, " cols=", w.cols));
  }
  if (w.cols % GgmlBlockSize(w.type) != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMatMul: cols=", w.cols,
                                                   " is not a multiple of the ", TypeName(w.type),
                                                   " block size"));
  }
  const size_t row_bytes = GgmlRowBytes(w.type, w.cols);
  if (w.row_stride < row_bytes) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMatMul: row_stride ", w.row_stride, " < ",
                                                   row_bytes, " bytes of one ", TypeName(w.type),
                                                   " row"));
  }
  if (n > cuda_internal::kFusedMaxTokens) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMatMul: n=", n, " exceeds one launch's ",
                                                   cuda_internal::kFusedMaxTokens));
  }
  if (n == 0 || w.rows == 0) return absl::OkStatus();
  if (w.data == nullptr || x == nullptr || y == nullptr) {
    return absl::InvalidArgumentError("CudaMatMul: null weight, x or y pointer");
  }
  const size_t w_align = WeightAlignment(w.type);
  if (!Aligned(w.data, w_align) || w.row_stride % w_align != 0) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMatMul: ", TypeName(w.type),
                                                   " weight data and row_stride must be ", w_align,
                                                   "-byte aligned"));
  }
  const size_t x_align = cuda_internal::Q16Runs(w.type) ? 16 : 4;  // every quantised type
  if (!Aligned(x, x_align) || !Aligned(y, 4)) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMatMul: x must be ", x_align,
                                                   "-byte aligned and y 4-byte aligned for ",
                                                   TypeName(w.type)));
  }
  return absl::OkStatus();
}

// What the algorithm needs beyond ValidateArgs: kQuantAct and kCublas a context and their
// weight types.
absl::Status CheckAlgo(CudaMatMulContext* ctx, const WeightView& w, const float* x,
                       CudaMatMulAlgo algo) {
  if (algo == CudaMatMulAlgo::kFused) {
    if (IsComputeGgmlType(w.type)) return absl::OkStatus();
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaMatMul: kFused supports Q4_0, Q4_1, Q8_0, F16, BF16 and F32 weights, not ",
        TypeName(w.type), " (kQuantAct runs the K-quants)"));
  }
  if (algo == CudaMatMulAlgo::kStaged) {
    if (w.type != GgmlType::kF16 && w.type != GgmlType::kBF16) {
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaMatMul: kStaged supports F16 and BF16 weights, not ", TypeName(w.type)));
    }
    if (w.cols % 32 != 0 || (x != nullptr && !Aligned(x, 16))) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaMatMul: kStaged needs cols a multiple of 32 (", w.cols,
                       ") and x 16-byte aligned (rows of x are read as float4)"));
    }
    return absl::OkStatus();
  }
  const bool quant = algo == CudaMatMulAlgo::kQuantAct;
  const char* name = quant ? "kQuantAct" : "kCublas";
  if (ctx == nullptr) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaMatMul: ", name, " needs a CudaMatMulContext"));
  }
  const bool runs = quant == cuda_internal::Q16Runs(w.type);
  if (!runs) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaMatMul: ", name, " supports ",
                     quant ? "Q4_0, Q4_1, Q8_0, Q4_K, Q5_K and Q6_K" : "F32, F16 and BF16",
                     " weights, not ", TypeName(w.type)));
  }
  return absl::OkStatus();
}

// Rounds x to int16 blocks in ctx's scratch and runs the segments on them: on tensor cores
// from ctx.mma_min_tokens() tokens when ctx allows, else the dp2a kernel (the same bits).
// `quantised`: the scratch already holds them (CudaMatMul's x_quantised).
absl::Status QuantActMatMul(CudaMatMulContext& ctx, GgmlType type,
                            const cuda_internal::FusedSegment* segs, int count, int64_t cols,
                            const float* x, int64_t n, bool quantised) {
  SPECNODE_RETURN_IF_ERROR(ctx.ReserveQuantActs(n, cols));
  const cuda_internal::Q16Acts acts =
      cuda_internal::Q16ActsAt(const_cast<void*>(ctx.quant_acts()), n, cols);
  if (!quantised) {
    SPECNODE_CUDA_RETURN_IF_ERROR(
        cuda_internal::LaunchQuantizeActs16(x, n, cols, acts, ctx.stream()));
  }
  if (ctx.tensor_cores() && n >= ctx.mma_min_tokens()) {
    SPECNODE_CUDA_RETURN_IF_ERROR(
        cuda_internal::LaunchQ16Mma(type, segs, count, cols, acts, n, ctx.stream()));
    return absl::OkStatus();
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cuda_internal::LaunchQ16MatVec(type, segs, count, cols, acts, n, ctx.stream()));
  return absl::OkStatus();
}

absl::Status CublasMatMul(CudaMatMulContext& ctx, const WeightView& w, const float* x, int64_t n,
                          float* y) {
  cudaDataType_t ab_type;
  size_t elem;
  switch (w.type) {
    case GgmlType::kF32:
      ab_type = CUDA_R_32F;
      elem = 4;
      break;
    case GgmlType::kF16:
      ab_type = CUDA_R_16F;
      elem = 2;
      break;
    case GgmlType::kBF16:
      ab_type = CUDA_R_16BF;
      elem = 2;
      break;
    default:
      return absl::InvalidArgumentError(absl::StrCat(
          "CudaMatMul: kCublas supports F32, F16 and BF16 weights, not ", TypeName(w.type)));
  }
  const int64_t lda = static_cast<int64_t>(w.row_stride / elem);
  if (w.rows > INT_MAX || w.cols > INT_MAX || n > INT_MAX || lda > INT_MAX) {
    return absl::InvalidArgumentError("CudaMatMul: shape exceeds cuBLAS's int dimensions");
  }
  const void* b = x;
  if (w.type != GgmlType::kF32) {
    // cuBLAS needs A and B of one type: round x to W's 16-bit type in the scratch buffer.
    const size_t bytes = static_cast<size_t>(n) * static_cast<size_t>(w.cols) * elem;
    absl::Status reserved = ctx.scratch().Reserve(bytes);
    if (!reserved.ok()) return reserved;
    SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchConvertFromF32(
        x, ctx.scratch().data(), n * w.cols, w.type, ctx.stream()));
    b = ctx.scratch().data();
  }
  // Column-major view: W is [cols x rows] with leading dimension lda, x is [cols x n] and
  // y is [rows x n]; y = Wᵀ x is then one GEMM with A transposed.
  const float alpha = 1.0f;
  const float beta = 0.0f;
  SPECNODE_CUBLAS_RETURN_IF_ERROR(
      cublasGemmEx(ctx.cublas(), CUBLAS_OP_T, CUBLAS_OP_N, static_cast<int>(w.rows),
                   static_cast<int>(n), static_cast<int>(w.cols), &alpha, w.data, ab_type,
                   static_cast<int>(lda), b, ab_type, static_cast<int>(w.cols), &beta, y,
                   CUDA_R_32F, static_cast<int>(w.rows), CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT));
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<CudaMatMulContext>> CudaMatMulContext::Create(cudaStream_t stream) {
  std::unique_ptr<CudaMatMulContext> ctx(new CudaMatMulContext());
  ctx->stream_ = stream;
  ctx->mma_min_tokens_ = cuda_internal::kQ16MmaMinTokens;
  // From here on the destructor releases whatever was created if a later step fails.
  SPECNODE_CUBLAS_RETURN_IF_ERROR(cublasCreate(&ctx->cublas_));
  SPECNODE_CUBLAS_RETURN_IF_ERROR(cublasSetStream(ctx->cublas_, stream));
  // Default math never uses TF32 for CUBLAS_COMPUTE_32F (F32 results stay comparable with
  // the CPU reference); also keep f32 reductions for the 16-bit inputs.
  SPECNODE_CUBLAS_RETURN_IF_ERROR(cublasSetMathMode(
      ctx->cublas_, static_cast<cublasMath_t>(CUBLAS_DEFAULT_MATH |
                                              CUBLAS_MATH_DISALLOW_REDUCED_PRECISION_REDUCTION)));
  return ctx;
}

absl::Status CudaMatMulContext::ReserveQuantActs(int64_t n, int64_t cols) {
  return acts_.Grow(cuda_internal::Q16ActsBytes(n, cols));
}

CudaMatMulContext::~CudaMatMulContext() {
  if (cublas_ != nullptr) (void)cublasDestroy(cublas_);
}

absl::Status CudaMatMul(CudaMatMulContext* ctx, const WeightView& w, const float* x, int64_t n,
                        float* y, CudaMatMulAlgo algo, bool x_quantised) {
  if (x_quantised && algo != CudaMatMulAlgo::kQuantAct) {
    return absl::InvalidArgumentError("CudaMatMul: x_quantised goes with kQuantAct only");
  }
  SPECNODE_RETURN_IF_ERROR(ValidateArgs(w, x, n, y));
  SPECNODE_RETURN_IF_ERROR(CheckAlgo(ctx, w, x, algo));
  if (n == 0 || w.rows == 0) return absl::OkStatus();
  if (algo == CudaMatMulAlgo::kCublas) return CublasMatMul(*ctx, w, x, n, y);
  if (algo == CudaMatMulAlgo::kQuantAct) {
    const cuda_internal::FusedSegment one{w.data, w.row_stride, w.rows, y};
    return QuantActMatMul(*ctx, w.type, &one, 1, w.cols, x, n, x_quantised);
  }
  if (algo == CudaMatMulAlgo::kStaged) {
    const cuda_internal::FusedSegment one{w.data, w.row_stride, w.rows, y};
    SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchStaged16(
        w.type, &one, 1, w.cols, x, n, ctx != nullptr ? ctx->stream() : nullptr));
    return absl::OkStatus();
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cuda_internal::LaunchFusedMatMul(w.type, w.data, w.row_stride, w.rows, w.cols, x, n, y,
                                       ctx != nullptr ? ctx->stream() : nullptr));
  return absl::OkStatus();
}

absl::Status CudaMatMulSharedInput(CudaMatMulContext* ctx, std::span<const WeightView> ws,
                                   const float* x, int64_t n, std::span<float* const> ys,
                                   CudaMatMulAlgo algo, bool x_quantised) {
  if (x_quantised && algo != CudaMatMulAlgo::kQuantAct) {
    return absl::InvalidArgumentError(
        "CudaMatMulSharedInput: x_quantised goes with kQuantAct only");
  }
  if (ws.empty() || ws.size() != ys.size() ||
      ws.size() > static_cast<size_t>(cuda_internal::kFusedMaxSegments)) {
    return absl::InvalidArgumentError(absl::StrCat("CudaMatMulSharedInput: ", ws.size(),
                                                   " matrices and ", ys.size(), " outputs (1..",
                                                   cuda_internal::kFusedMaxSegments, ")"));
  }
  bool same_type = true;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (ws[i].cols != ws[0].cols) {
      return absl::InvalidArgumentError(
          absl::StrCat("CudaMatMulSharedInput: cols ", ws[i].cols, " != ", ws[0].cols));
    }
    SPECNODE_RETURN_IF_ERROR(ValidateArgs(ws[i], x, n, ys[i]));
    SPECNODE_RETURN_IF_ERROR(CheckAlgo(ctx, ws[i], x, algo));
    same_type = same_type && ws[i].type == ws[0].type;
  }
  if (n == 0) return absl::OkStatus();
  if (!same_type || algo == CudaMatMulAlgo::kCublas) {
    for (size_t i = 0; i < ws.size(); ++i) {
      absl::Status s = CudaMatMul(ctx, ws[i], x, n, ys[i], algo, x_quantised);
      if (!s.ok()) return s;
    }
    return absl::OkStatus();
  }
  cuda_internal::FusedSegment segs[cuda_internal::kFusedMaxSegments];
  int count = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    if (ws[i].rows == 0) continue;
    segs[count++] = {ws[i].data, ws[i].row_stride, ws[i].rows, ys[i]};
  }
  if (count == 0) return absl::OkStatus();
  if (algo == CudaMatMulAlgo::kQuantAct) {
    return QuantActMatMul(*ctx, ws[0].type, segs, count, ws[0].cols, x, n, x_quantised);
  }
  if (algo == CudaMatMulAlgo::kStaged) {
    SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchStaged16(
        ws[0].type, segs, count, ws[0].cols, x, n, ctx != nullptr ? ctx->stream() : nullptr));
    return absl::OkStatus();
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchFusedMatMulSegments(
      ws[0].type, segs, count, ws[0].cols, x, n, ctx != nullptr ? ctx->stream() : nullptr));
  return absl::OkStatus();
}

}  // namespace specnode
