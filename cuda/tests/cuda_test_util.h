// Shared helpers of the CUDA kernel tests.
//
// Without a usable GPU every kernel test SKIPS (never fails) with the runtime's reason,
// e.g. "no CUDA device: CUDA driver version is insufficient for CUDA runtime version
// (cudaErrorInsufficientDriver)": derive fixtures from CudaTest / CudaTestWithParam<T>, or
// call SPECNODE_SKIP_WITHOUT_CUDA() first in a plain TEST.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "gtest/gtest.h"

namespace specnode::cuda_test {

// Empty when a device is usable, else why not ("no CUDA device: ...").
inline std::string CudaUnavailableReason() {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (!count.ok()) return std::string(count.status().message());
  if (*count == 0) return "no CUDA device: cudaGetDeviceCount reports 0 devices";
  return "";
}

}  // namespace specnode::cuda_test

#define SPECNODE_SKIP_WITHOUT_CUDA()                                                          \
  do {                                                                                        \
    const std::string specnode_cuda_reason_ = ::specnode::cuda_test::CudaUnavailableReason(); \
    if (!specnode_cuda_reason_.empty()) GTEST_SKIP() << specnode_cuda_reason_;                \
  } while (0)

#define SPECNODE_ASSERT_OK(expr)                            \
  do {                                                      \
    const ::absl::Status specnode_status_ = (expr);         \
    ASSERT_TRUE(specnode_status_.ok()) << specnode_status_; \
  } while (0)

namespace specnode::cuda_test {

class CudaTest : public ::testing::Test {
 protected:
  void SetUp() override { SPECNODE_SKIP_WITHOUT_CUDA(); }
};

template <typename Param>
class CudaTestWithParam : public ::testing::TestWithParam<Param> {
 protected:
  void SetUp() override { SPECNODE_SKIP_WITHOUT_CUDA(); }
};

inline std::vector<float> RandomVector(size_t n, uint32_t seed, float stddev = 1.0f) {
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, stddev);
  std::vector<float> v(n);
  for (float& x : v) x = dist(gen);
  return v;
}

// Logit rows for the head kernels' tests (top-k, draws), kHeadRows of `cols`: 0 random
// (x 8: a flat distribution), 1 every value equal (ties everywhere: the lowest ids win), 2
// quarter steps (many ties, across any cut), 3 signed zeros above negatives, 4 a NaN, 5 +inf,
// 6 one large logit (a sharp distribution).
constexpr int64_t kHeadRows = 7;
inline std::vector<float> HeadRows(int64_t cols, uint32_t seed) {
  std::vector<float> x = RandomVector(kHeadRows * cols, seed);
  for (int64_t c = 0; c < cols; ++c) {
    x[0 * cols + c] *= 8.0f;
    x[1 * cols + c] = 0.5f;
    x[2 * cols + c] = std::round(x[2 * cols + c] * 16.0f) / 4.0f;
    x[3 * cols + c] = c % 5 == 0 ? (c % 2 == 0 ? 0.0f : -0.0f) : -1.0f - static_cast<float>(c % 7);
  }
  x[4 * cols + cols / 2] = std::nanf("");
  x[5 * cols] = INFINITY;
  x[6 * cols + cols / 3] = 30.0f;
  return x;
}

template <typename T>
absl::StatusOr<DeviceBuffer> Upload(const std::vector<T>& host) {
  return DeviceBuffer::FromHost(host.data(), host.size() * sizeof(T));
}

// Waits for all work on the device, then copies `count` values back.
template <typename T>
absl::StatusOr<std::vector<T>> Download(const DeviceBuffer& buffer, size_t count) {
  absl::Status synced = SPECNODE_CUDA_STATUS(cudaDeviceSynchronize());
  if (!synced.ok()) return synced;
  std::vector<T> host(count);
  absl::Status copied = buffer.CopyToHost(host.data(), count * sizeof(T));
  if (!copied.ok()) return copied;
  return host;
}

}  // namespace specnode::cuda_test
