// bench_prefill_cuda: batched-pass matmuls (prefill, large verification trees) against the
// device's own tensor-core limit, measured in the same run. First the peak: cuBLAS BF16 GEMM
// (f32 accumulation) of 8192 x 8192 x 8192, in TFLOP/s. Then, per weight type at the
// Llama-3-8B projection shapes and n = 2, 9, 16 (verification passes: where the kernels
// cross over) and 32, 128, 512 tokens, kQuantAct on tensor cores
// (cuda_mma_kernels.cu) and on the dp2a kernel (set_tensor_cores(false)), activation
// rounding included, and cuBLAS BF16 on the same shape (what a BF16 model would run):
// microseconds per call, TFLOP/s (2 n rows cols / time) and the fraction of the peak.
// The issue-35 target: prefill at the 8B shapes >= 0.40 of the BF16 peak.
// Built as a target only (scripts/device-check runs it); ctest never does.
// Usage: bench_prefill_cuda [iterations=20] [types=Q4_0,Q4_K,Q8_0,Q6_K]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "cuda/bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_matmul.h"
#include "cuda/cuda_mma_kernels.h"
#include "cuda/device_buffer.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

using cuda_bench::ParseTypes;
using cuda_bench::Timer;

struct Shape {
  const char* name;
  int64_t rows, cols;
};
const Shape kShapes[] = {
    {"8b q/o 4096x4096", 4096, 4096},
    {"8b gate/up 14336x4096", 14336, 4096},
    {"8b down 4096x14336", 4096, 14336},
};
// 2..16: verification passes, where the crossover between the kernels lies.
constexpr int64_t kTokens[] = {2, 9, 16, 32, 128, 512};

double Tflops(int64_t n, int64_t rows, int64_t cols, double us) {
  return 2.0 * static_cast<double>(n) * static_cast<double>(rows) * static_cast<double>(cols) /
         (us * 1e6);
}

// Random weights of `type` for rows x cols.
std::vector<uint8_t> Weights(GgmlType type, int64_t rows, int64_t cols) {
  const size_t row_bytes = GgmlRowBytes(type, cols);
  std::vector<uint8_t> w(rows * row_bytes);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    if (IsKQuantType(type)) {
      QuantizeConvertedRow(type, row.data(), w.data() + r * row_bytes, cols);
    } else {
      QuantizeRow(type, row.data(), w.data() + r * row_bytes, cols);
    }
  }
  return w;
}

// cuBLAS BF16 GEMM y [n, rows] = x [n, cols] · Wᵀ through CudaMatMul (x rounded to bf16 in
// the context's scratch, as kCublas does), in microseconds per call.
absl::StatusOr<double> CublasUs(Timer& timer, CudaMatMulContext& ctx, int64_t rows, int64_t cols,
                                int64_t n, int iterations) {
  // Values do not change a GEMM's time: bf16 0x3c3c (~0.0115) everywhere, made on the device.
  SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer w_dev, DeviceBuffer::Allocate(rows * cols * 2));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemset(w_dev.data(), 0x3c, rows * cols * 2));
  SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer x, DeviceBuffer::Allocate(n * cols * 4));
  SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer y, DeviceBuffer::Allocate(n * rows * 4));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemset(x.data(), 0, n * cols * 4));
  const WeightView v{GgmlType::kBF16, w_dev.data(), rows, cols, static_cast<size_t>(cols) * 2};
  return timer.Time(ctx.stream(), iterations, [&](int) {
    return CudaMatMul(&ctx, v, x.as<float>(), n, y.as<float>(), CudaMatMulAlgo::kCublas);
  });
}

// cuBLAS BF16 per (shape, n), measured once whatever the types (its weights take a second
// to make at the 8B shapes).
class CublasTable {
 public:
  absl::StatusOr<double> Us(Timer& timer, CudaMatMulContext& ctx, const Shape& s, int64_t n,
                            int iterations) {
    const auto key = std::make_pair(s.name, n);
    auto it = us_.find(key);
    if (it != us_.end()) return it->second;
    SPECNODE_ASSIGN_OR_RETURN(const double us, CublasUs(timer, ctx, s.rows, s.cols, n, iterations));
    us_[key] = us;
    return us;
  }

 private:
  std::map<std::pair<std::string, int64_t>, double> us_;
};

absl::Status RunType(Timer& timer, CudaMatMulContext& ctx, GgmlType type, int iterations,
                     double peak, CublasTable* cublas) {
  for (const Shape& s : kShapes) {
    const std::vector<uint8_t> w = Weights(type, s.rows, s.cols);
    SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer w_dev, DeviceBuffer::FromHost(w.data(), w.size()));
    const int64_t n_max = kTokens[std::size(kTokens) - 1];
    std::vector<float> xh(n_max * s.cols);
    std::mt19937 rng(7);
    std::normal_distribution<float> normal(0.0f, 1.0f);
    for (float& v : xh) v = normal(rng);
    SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer x, DeviceBuffer::FromHost(xh.data(), xh.size() * 4));
    SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer y, DeviceBuffer::Allocate(n_max * s.rows * 4));
    const WeightView v{type, w_dev.data(), s.rows, s.cols, GgmlRowBytes(type, s.cols)};
    for (int64_t n : kTokens) {
      double us[2];
      for (int tc = 0; tc < 2; ++tc) {
        ctx.set_tensor_cores(tc == 1);
        ctx.set_mma_min_tokens(1);  // every n on the kernel asked for
        SPECNODE_ASSIGN_OR_RETURN(us[tc], timer.Time(ctx.stream(), iterations, [&](int) {
          return CudaMatMul(&ctx, v, x.as<float>(), n, y.as<float>(), CudaMatMulAlgo::kQuantAct);
        }));
      }
      SPECNODE_ASSIGN_OR_RETURN(const double bf16_us, cublas->Us(timer, ctx, s, n, iterations));
      const double tc = Tflops(n, s.rows, s.cols, us[1]), dp = Tflops(n, s.rows, s.cols, us[0]);
      const double cb = Tflops(n, s.rows, s.cols, bf16_us);
      std::printf(
          "%-4s %-22s n=%-4lld tensor cores %8.1f us %6.1f TFLOP/s %5.3f | dp2a %8.1f us %6.1f "
          "%5.3f | %5.2fx | cuBLAS BF16 %8.1f us %6.1f %5.3f\n",
          std::string(GgmlTypeName(static_cast<uint32_t>(type))).c_str(), s.name,
          static_cast<long long>(n), us[1], tc, tc / peak, us[0], dp, dp / peak, us[0] / us[1],
          bf16_us, cb, cb / peak);
    }
  }
  ctx.set_tensor_cores(true);
  ctx.set_mma_min_tokens(cuda_internal::kQ16MmaMinTokens);
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 20;
  std::vector<GgmlType> types;
  if (!ParseTypes(argc > 2 ? argv[2] : "Q4_0,Q4_K,Q8_0,Q6_K", &types)) {
    std::fprintf(stderr, "types: a comma-separated list of Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<cuda_bench::BenchDevice>> dev = cuda_bench::BenchDevice::Open();
  if (!dev.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dev.status().message()).c_str());
    return 1;
  }
  CudaMatMulContext& ctx = (*dev)->ctx();
  Timer timer;
  absl::StatusOr<double> peak_us = CublasUs(timer, ctx, 8192, 8192, 8192, 10);
  if (!peak_us.ok()) {
    std::fprintf(stderr, "peak: %s\n", std::string(peak_us.status().message()).c_str());
    return 1;
  }
  const double peak = Tflops(8192, 8192, 8192, *peak_us);
  std::printf(
      "tensor-core peak (limit): cuBLAS BF16 8192^3 %.1f TFLOP/s; %d iterations per case; "
      "fractions below are of that peak\n",
      peak, iterations);
  int rc = 0;
  CublasTable cublas;
  for (GgmlType type : types) {
    if (!IsKQuantType(type) && type != GgmlType::kQ4_0 && type != GgmlType::kQ4_1 &&
        type != GgmlType::kQ8_0) {
      std::fprintf(stderr, "%s: kQuantAct runs quantised types only\n",
                   std::string(GgmlTypeName(static_cast<uint32_t>(type))).c_str());
      rc = 2;
      continue;
    }
    absl::Status st = RunType(timer, ctx, type, iterations, peak, &cublas);
    if (!st.ok()) {
      std::fprintf(stderr, "%s\n", std::string(st.message()).c_str());
      rc = 1;
    }
  }
  return rc;
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) { return specnode::Main(argc, argv); }
