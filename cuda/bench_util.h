// Shared by the GPU benchmarks (bench_decode_cuda.cc, bench_prefill_cuda.cc): a CUDA-event
// timer and the weight-type list of their command lines. Built with the benchmarks only.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_matmul.h"
#include "model/gguf/ggml_types.h"
#include "model/status_macros.h"

namespace specnode::cuda_bench {

// Times calls on one stream with CUDA events. Not thread-safe.
class Timer {
 public:
  Timer() {
    cudaEventCreate(&start_);
    cudaEventCreate(&stop_);
  }
  ~Timer() {
    cudaEventDestroy(start_);
    cudaEventDestroy(stop_);
  }
  // Microseconds per call of `body(i)` over `iterations` calls on `stream`.
  template <typename Body>
  absl::StatusOr<double> Time(cudaStream_t stream, int iterations, Body body) {
    for (int i = 0; i < 5; ++i) SPECNODE_RETURN_IF_ERROR(body(i));  // warm-up
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventRecord(start_, stream));
    for (int i = 0; i < iterations; ++i) SPECNODE_RETURN_IF_ERROR(body(i));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventRecord(stop_, stream));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventSynchronize(stop_));
    float ms = 0.0f;
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaEventElapsedTime(&ms, start_, stop_));
    return 1e3 * ms / iterations;
  }

 private:
  cudaEvent_t start_ = nullptr, stop_ = nullptr;
};

// "Q4_0,Q4_K,..." -> the types; false for an unknown name or an empty list.
inline bool ParseTypes(const std::string& list, std::vector<GgmlType>* out) {
  std::stringstream ss(list);
  std::string t;
  while (std::getline(ss, t, ',')) {
    if (t == "Q4_0") {
      out->push_back(GgmlType::kQ4_0);
    } else if (t == "Q4_1") {
      out->push_back(GgmlType::kQ4_1);
    } else if (t == "Q8_0") {
      out->push_back(GgmlType::kQ8_0);
    } else if (t == "F16") {
      out->push_back(GgmlType::kF16);
    } else if (t == "BF16") {
      out->push_back(GgmlType::kBF16);
    } else if (t == "Q4_K") {
      out->push_back(GgmlType::kQ4_K);
    } else if (t == "Q5_K") {
      out->push_back(GgmlType::kQ5_K);
    } else if (t == "Q6_K") {
      out->push_back(GgmlType::kQ6_K);
    } else {
      return false;
    }
  }
  return !out->empty();
}

// Device 0 with a stream and a matmul context on it, its name printed ("device: NAME, N SMs,
// sm_XY"). Unavailable / Internal with the runtime's reason without one.
class BenchDevice {
 public:
  static absl::StatusOr<std::unique_ptr<BenchDevice>> Open() {
    SPECNODE_ASSIGN_OR_RETURN(const int devices, CudaDeviceCount());
    if (devices == 0) return absl::UnavailableError("no CUDA device");
    cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, 0) == cudaSuccess) {
      std::printf("device: %s, %d SMs, sm_%d%d\n", prop.name, prop.multiProcessorCount, prop.major,
                  prop.minor);
    }
    std::unique_ptr<BenchDevice> d(new BenchDevice());
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamCreate(&d->stream_));
    SPECNODE_ASSIGN_OR_RETURN(d->ctx_, CudaMatMulContext::Create(d->stream_));
    return d;
  }
  ~BenchDevice() {
    ctx_.reset();  // its cuBLAS handle is bound to the stream
    if (stream_ != nullptr) cudaStreamDestroy(stream_);
  }
  cudaStream_t stream() const { return stream_; }
  CudaMatMulContext& ctx() { return *ctx_; }

 private:
  BenchDevice() = default;
  cudaStream_t stream_ = nullptr;
  std::unique_ptr<CudaMatMulContext> ctx_;
};

}  // namespace specnode::cuda_bench
