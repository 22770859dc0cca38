// bench_decode_cuda: the decode matmuls against the device's own limit, measured in the same
// run. First the copy bandwidth (cudaMemcpyAsync device to device of 512 MiB, read + write
// bytes / time); then, per weight type and shape (SmolLM2-135M's projections and LM head,
// Llama-3-8B's), CudaMatMul with kFused and with kQuantAct (its activation rounding
// included) at n = 1, 4 and 9 tokens, printing microseconds per call, the achieved
// bandwidth (weight + x + y bytes / time) and that as a fraction of the copy bandwidth.
// Each shape cycles through enough copies of its weights (>= 256 MiB) that every call reads
// them from DRAM, as a decode step of a real model does, not from the 50 MB L2.
// Built as a target only (scripts/device-check runs it); ctest never does.
// K-quants run kQuantAct only (fused: 0) at the shapes of whole 256-value super-blocks;
// F16 / BF16 compare kFused with kStaged (the "quant-act" columns).
// Usage: bench_decode_cuda [iterations=100] [types=Q4_0,Q4_1,Q8_0,Q4_K,Q6_K,BF16]
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cuda/bench_util.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_matmul.h"
#include "cuda/device_buffer.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

using cuda_bench::ParseTypes;
using cuda_bench::Timer;

struct BenchShape {
  const char* name;
  int64_t rows;
  int64_t cols;
};

// SmolLM2-135M (GQA: 3 KV heads x 64, tied LM head) and Llama-3-8B (8 KV heads x 128).
const BenchShape kShapes[] = {
    {"smollm2 q/o 576x576", 576, 576},      {"smollm2 gate/up 1536x576", 1536, 576},
    {"smollm2 down 576x1536", 576, 1536},   {"smollm2 head 49152x576", 49152, 576},
    {"8b q/o 4096x4096", 4096, 4096},       {"8b k/v 1024x4096", 1024, 4096},
    {"8b gate/up 14336x4096", 14336, 4096}, {"8b down 4096x14336", 4096, 14336},
};

constexpr size_t kDramBytes = size_t{256} << 20;  // what a shape's copies span at least

// GB/s of a device-to-device copy (bytes read + bytes written).
absl::StatusOr<double> CopyBandwidth(Timer& timer, cudaStream_t stream) {
  constexpr size_t kBytes = size_t{512} << 20;
  SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer a, DeviceBuffer::Allocate(kBytes));
  SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer b, DeviceBuffer::Allocate(kBytes));
  SPECNODE_ASSIGN_OR_RETURN(double us, timer.Time(stream, 20, [&](int i) -> absl::Status {
    void* dst = i % 2 ? a.data() : b.data();
    const void* src = i % 2 ? b.data() : a.data();
    SPECNODE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(dst, src, kBytes, cudaMemcpyDeviceToDevice, stream));
    return absl::OkStatus();
  }));
  return 2.0 * static_cast<double>(kBytes) / (us * 1e3);
}

struct ShapeData {
  std::vector<DeviceBuffer> copies;  // the same weights, cycled through
  size_t weight_bytes = 0;
  DeviceBuffer x, y;
};

absl::StatusOr<ShapeData> MakeShape(GgmlType type, const BenchShape& s, int64_t n_max) {
  ShapeData d;
  const size_t row_bytes = GgmlRowBytes(type, s.cols);
  std::vector<uint8_t> w(s.rows * row_bytes);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> row(s.cols);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRow(type, row.data(), w.data() + r * row_bytes, s.cols);
  }
  d.weight_bytes = w.size();
  const size_t copies = std::max<size_t>(2, (kDramBytes + w.size() - 1) / w.size());
  for (size_t i = 0; i < copies; ++i) {
    SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer c, DeviceBuffer::FromHost(w.data(), w.size()));
    d.copies.push_back(std::move(c));
  }
  std::vector<float> x(n_max * s.cols);
  for (float& v : x) v = normal(rng) * 50.0f;
  SPECNODE_ASSIGN_OR_RETURN(d.x, DeviceBuffer::FromHost(x.data(), x.size() * 4));
  SPECNODE_ASSIGN_OR_RETURN(d.y, DeviceBuffer::Allocate(n_max * s.rows * 4));
  return d;
}

absl::Status RunShape(Timer& timer, CudaMatMulContext& ctx, GgmlType type, const BenchShape& s,
                      int iterations, double copy_gbs) {
  constexpr int64_t kNs[] = {1, 4, 9};
  SPECNODE_ASSIGN_OR_RETURN(ShapeData d, MakeShape(type, s, 9));
  const size_t row_bytes = GgmlRowBytes(type, s.cols);
  for (int64_t n : kNs) {
    double us[2] = {0.0, 0.0};
    // The staged algorithm: kStaged for 16-bit floats, kQuantAct for the quantised types.
    const bool plain16 = type == GgmlType::kF16 || type == GgmlType::kBF16;
    const CudaMatMulAlgo algos[2] = {CudaMatMulAlgo::kFused,
                                     plain16 ? CudaMatMulAlgo::kStaged : CudaMatMulAlgo::kQuantAct};
    // kFused has no K-quant kernel (they were converted at upload before kQuantAct).
    for (int a = IsKQuantType(type) ? 1 : 0; a < 2; ++a) {
      SPECNODE_ASSIGN_OR_RETURN(us[a], timer.Time(ctx.stream(), iterations, [&](int i) {
        const WeightView v{type, d.copies[i % d.copies.size()].data(), s.rows, s.cols, row_bytes};
        return CudaMatMul(&ctx, v, d.x.as<float>(), n, d.y.as<float>(), algos[a]);
      }));
    }
    const double bytes = static_cast<double>(d.weight_bytes) + 4.0 * n * (s.cols + s.rows);
    const double fused_gbs = us[0] > 0 ? bytes / (us[0] * 1e3) : 0.0;
    const double qa_gbs = bytes / (us[1] * 1e3);
    std::printf(
        "%-4s %-26s n=%-2lld  fused %8.2f us %7.1f GB/s %5.3f  |  quant-act %8.2f us "
        "%7.1f GB/s %5.3f  | %5.2fx\n",
        std::string(GgmlTypeName(static_cast<uint32_t>(type))).c_str(), s.name,
        static_cast<long long>(n), us[0], fused_gbs, fused_gbs / copy_gbs, us[1], qa_gbs,
        qa_gbs / copy_gbs, us[0] > 0 ? us[0] / us[1] : 0.0);
  }
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::max(1, std::atoi(argv[1])) : 100;
  std::vector<GgmlType> types;
  if (!ParseTypes(argc > 2 ? argv[2] : "Q4_0,Q4_1,Q8_0,Q4_K,Q6_K,BF16", &types)) {
    std::fprintf(
        stderr, "types: a comma-separated list of Q4_0, Q4_1, Q8_0, Q4_K, Q5_K, Q6_K, F16, BF16\n");
    return 2;
  }
  absl::StatusOr<std::unique_ptr<cuda_bench::BenchDevice>> dev = cuda_bench::BenchDevice::Open();
  if (!dev.ok()) {
    std::fprintf(stderr, "%s\n", std::string(dev.status().message()).c_str());
    return 1;
  }
  CudaMatMulContext& ctx = (*dev)->ctx();
  cudaStream_t stream = (*dev)->stream();
  Timer timer;
  absl::StatusOr<double> copy = CopyBandwidth(timer, stream);
  if (!copy.ok()) {
    std::fprintf(stderr, "copy: %s\n", std::string(copy.status().message()).c_str());
    return 1;
  }
  std::printf(
      "copy bandwidth (limit): %.1f GB/s; %d iterations per case; fractions below "
      "are of the copy bandwidth\n",
      *copy, iterations);
  int rc = 0;
  for (GgmlType type : types) {
    for (const BenchShape& s : kShapes) {
      if (s.cols % GgmlBlockSize(type) != 0) continue;  // K-quants: whole super-blocks only
      absl::Status st = RunShape(timer, ctx, type, s, iterations, *copy);
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", s.name, std::string(st.message()).c_str());
        rc = 1;
      }
    }
  }
  return rc;
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) { return specnode::Main(argc, argv); }
