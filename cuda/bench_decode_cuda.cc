// bench_decode_cuda: times the fused Q4_1 matmul (CudaMatMul, kFused) at SmolLM2-135M's
// projection shapes and prints microseconds per call and effective bandwidth (weight + x + y
// bytes / time). Decode is weight-bandwidth bound, so GB/s against the GPU's peak (H200:
// ~4800 GB/s) says how far the kernel is from the limit. Built as a target only; ctest never
// runs it. Usage: bench_decode_cuda [iterations=200] [type=Q4_1|Q4_0|Q8_0|F16]
#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_matmul.h"
#include "cuda/device_buffer.h"
#include "model/gguf/ggml_types.h"

namespace specnode {
namespace {

struct BenchShape {
  const char* name;
  int64_t rows;
  int64_t cols;
};

// One SmolLM2-135M layer's projections (GQA: 3 KV heads x 64) and the tied LM head.
const BenchShape kShapes[] = {
    {"attn_q / attn_o 576x576", 576, 576}, {"attn_k / attn_v 192x576", 192, 576},
    {"ffn_gate / up 1536x576", 1536, 576}, {"ffn_down 576x1536", 576, 1536},
    {"lm_head 49152x576", 49152, 576},
};

absl::Status RunShape(GgmlType type, const BenchShape& s, int64_t n, int iterations,
                      cudaEvent_t start, cudaEvent_t stop) {
  // Random weights quantised on the host once per shape.
  const size_t row_bytes = GgmlRowBytes(type, s.cols);
  std::vector<uint8_t> w(s.rows * row_bytes);
  std::mt19937 rng(42);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<float> row(s.cols);
  for (int64_t r = 0; r < s.rows; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRow(type, row.data(), w.data() + r * row_bytes, s.cols);
  }
  std::vector<float> x(n * s.cols, 0.5f);
  absl::StatusOr<DeviceBuffer> w_dev = DeviceBuffer::FromHost(w.data(), w.size());
  if (!w_dev.ok()) return w_dev.status();
  absl::StatusOr<DeviceBuffer> x_dev = DeviceBuffer::FromHost(x.data(), x.size() * 4);
  if (!x_dev.ok()) return x_dev.status();
  absl::StatusOr<DeviceBuffer> y_dev = DeviceBuffer::Allocate(n * s.rows * 4);
  if (!y_dev.ok()) return y_dev.status();
  const WeightView view{type, w_dev->data(), s.rows, s.cols, row_bytes};

  for (int i = 0; i < 10; ++i) {  // warm-up: clocks, caches, lazy module load
    absl::Status st = CudaMatMul(nullptr, view, x_dev->as<float>(), n, y_dev->as<float>());
    if (!st.ok()) return st;
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start, nullptr));
  for (int i = 0; i < iterations; ++i) {
    absl::Status st = CudaMatMul(nullptr, view, x_dev->as<float>(), n, y_dev->as<float>());
    if (!st.ok()) return st;
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop, nullptr));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop));
  float ms = 0.0f;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start, stop));
  const double us = 1e3 * ms / iterations;
  const double bytes = static_cast<double>(w.size()) + 4.0 * n * (s.cols + s.rows);
  std::printf("%-26s n=%-3lld %9.2f us  %8.1f GB/s\n", s.name, static_cast<long long>(n), us,
              bytes / (us * 1e3));
  return absl::OkStatus();
}

int Main(int argc, char** argv) {
  const int iterations = argc > 1 ? std::atoi(argv[1]) : 200;
  GgmlType type = GgmlType::kQ4_1;
  if (argc > 2) {
    const std::string t = argv[2];
    if (t == "Q4_0")
      type = GgmlType::kQ4_0;
    else if (t == "Q8_0")
      type = GgmlType::kQ8_0;
    else if (t == "F16")
      type = GgmlType::kF16;
    else if (t != "Q4_1") {
      std::fprintf(stderr, "unknown type %s (Q4_1, Q4_0, Q8_0, F16)\n", t.c_str());
      return 2;
    }
  }
  absl::StatusOr<int> devices = CudaDeviceCount();
  if (!devices.ok() || *devices == 0) {
    std::fprintf(stderr, "%s\n",
                 devices.ok() ? "no CUDA device" : std::string(devices.status().message()).c_str());
    return 1;
  }
  cudaDeviceProp prop;
  if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) std::printf("device: %s\n", prop.name);
  std::printf("type %s, %d iterations per shape\n",
              std::string(GgmlTypeName(static_cast<uint32_t>(type))).c_str(), iterations);
  cudaEvent_t start = nullptr, stop = nullptr;
  if (cudaEventCreate(&start) != cudaSuccess || cudaEventCreate(&stop) != cudaSuccess) {
    std::fprintf(stderr, "cudaEventCreate failed\n");
    return 1;
  }
  int rc = 0;
  for (int64_t n : {1, 4, 16}) {
    for (const BenchShape& s : kShapes) {
      absl::Status st = RunShape(type, s, n, iterations, start, stop);
      if (!st.ok()) {
        std::fprintf(stderr, "%s: %s\n", s.name, std::string(st.message()).c_str());
        rc = 1;
      }
    }
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  return rc;
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) { return specnode::Main(argc, argv); }
