// Error reporting (cuda_check.h) and DeviceBuffer. The status-format tests need no GPU
// (the runtime's error strings are host tables); the buffer round trips skip without one.
#include "cuda/cuda_check.h"

#include <cublas_v2.h>

#include <cstdint>
#include <string>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "cuda/device_buffer.h"
#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using cuda_test::CudaTest;
using cuda_test::Download;
using cuda_test::Upload;

cudaError_t FailWithInvalidValue() { return cudaErrorInvalidValue; }
cublasStatus_t FailNotInitialized() { return CUBLAS_STATUS_NOT_INITIALIZED; }

int cuda_error_line = 0;
absl::Status ReturnsCudaError() {
  cuda_error_line = __LINE__ + 1;
  SPECNODE_CUDA_RETURN_IF_ERROR(FailWithInvalidValue());
  return absl::OkStatus();
}

int cublas_error_line = 0;
absl::StatusOr<int> ReturnsCublasError() {
  cublas_error_line = __LINE__ + 1;
  SPECNODE_CUBLAS_RETURN_IF_ERROR(FailNotInitialized());
  return 1;
}

TEST(CudaCheck, CudaErrorBecomesInternalWithFileLineExpressionAndReason) {
  const absl::Status status = ReturnsCudaError();
  EXPECT_EQ(status.code(), absl::StatusCode::kInternal);
  const std::string message(status.message());
  EXPECT_TRUE(absl::StrContains(message, absl::StrCat("cuda_check_test.cc:", cuda_error_line,
                                                      ": FailWithInvalidValue() failed: ")))
      << message;
  EXPECT_TRUE(absl::StrContains(message, cudaGetErrorString(cudaErrorInvalidValue))) << message;
  EXPECT_TRUE(absl::StrContains(message, "cudaErrorInvalidValue")) << message;
}

TEST(CudaCheck, CublasErrorBecomesInternalWithFileLineExpressionAndReason) {
  const absl::StatusOr<int> result = ReturnsCublasError();
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), absl::StatusCode::kInternal);
  const std::string message(result.status().message());
  EXPECT_TRUE(absl::StrContains(message, absl::StrCat("cuda_check_test.cc:", cublas_error_line,
                                                      ": FailNotInitialized() failed: ")))
      << message;
  EXPECT_TRUE(absl::StrContains(message, "CUBLAS_STATUS_NOT_INITIALIZED")) << message;
}

TEST(CudaCheck, StatusFormsAreOkOnSuccess) {
  EXPECT_TRUE(SPECNODE_CUDA_STATUS(cudaSuccess).ok());
  EXPECT_TRUE(SPECNODE_CUBLAS_STATUS(CUBLAS_STATUS_SUCCESS).ok());
  EXPECT_EQ(SPECNODE_CUDA_STATUS(cudaErrorMemoryAllocation).code(), absl::StatusCode::kInternal);
}

// Holds with and without a GPU: either a count, or Unavailable with the reason.
TEST(CudaDeviceCount, ReportsCountOrUnavailableWithReason) {
  const absl::StatusOr<int> count = CudaDeviceCount();
  if (count.ok()) {
    EXPECT_GE(*count, 0);
  } else {
    EXPECT_EQ(count.status().code(), absl::StatusCode::kUnavailable);
    EXPECT_TRUE(absl::StartsWith(count.status().message(), "no CUDA device: ")) << count.status();
  }
}

TEST(DeviceBuffer, EmptyBufferNeedsNoDevice) {
  absl::StatusOr<DeviceBuffer> empty = DeviceBuffer::Allocate(0);
  ASSERT_TRUE(empty.ok()) << empty.status();
  EXPECT_EQ(empty->data(), nullptr);
  EXPECT_EQ(empty->size(), 0u);
  EXPECT_TRUE(empty->CopyFromHost(nullptr, 0).ok());
  char byte = 0;
  EXPECT_EQ(empty->CopyToHost(&byte, 1).code(), absl::StatusCode::kOutOfRange);
  EXPECT_EQ(empty->CopyFromHost(&byte, 1, 0).code(), absl::StatusCode::kOutOfRange);
}

class DeviceBufferTest : public CudaTest {};

TEST_F(DeviceBufferTest, RoundTripsThroughTheDevice) {
  std::vector<int32_t> host(1000);
  for (size_t i = 0; i < host.size(); ++i) host[i] = static_cast<int32_t>(i * 7 - 300);
  absl::StatusOr<DeviceBuffer> buffer = Upload(host);
  ASSERT_TRUE(buffer.ok()) << buffer.status();
  EXPECT_EQ(buffer->size(), host.size() * sizeof(int32_t));
  absl::StatusOr<std::vector<int32_t>> back = Download<int32_t>(*buffer, host.size());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, host);

  // Partial copies at an offset, and bounds.
  const int32_t patch[2] = {11, 12};
  SPECNODE_ASSERT_OK(buffer->CopyFromHost(patch, sizeof(patch), 4 * sizeof(int32_t)));
  int32_t read[3] = {};
  SPECNODE_ASSERT_OK(buffer->CopyToHost(read, sizeof(read), 3 * sizeof(int32_t)));
  EXPECT_EQ(read[0], host[3]);
  EXPECT_EQ(read[1], 11);
  EXPECT_EQ(read[2], 12);
  EXPECT_EQ(buffer->CopyToHost(read, sizeof(read), buffer->size() - 4).code(),
            absl::StatusCode::kOutOfRange);
}

TEST_F(DeviceBufferTest, MoveTransfersOwnershipAndReserveGrows) {
  absl::StatusOr<DeviceBuffer> a = DeviceBuffer::Allocate(256);
  ASSERT_TRUE(a.ok()) << a.status();
  void* const ptr = a->data();
  DeviceBuffer b = std::move(*a);
  EXPECT_EQ(b.data(), ptr);
  EXPECT_EQ(a->data(), nullptr);  // NOLINT(bugprone-use-after-move): documented empty state
  EXPECT_EQ(a->size(), 0u);
  SPECNODE_ASSERT_OK(b.Reserve(128));  // already large enough: keeps the allocation
  EXPECT_EQ(b.data(), ptr);
  SPECNODE_ASSERT_OK(b.Reserve(1 << 20));
  EXPECT_GE(b.size(), size_t{1} << 20);
  SPECNODE_ASSERT_OK(b.Zero());
  absl::StatusOr<std::vector<uint8_t>> zeros = Download<uint8_t>(b, 64);
  ASSERT_TRUE(zeros.ok()) << zeros.status();
  EXPECT_EQ(*zeros, std::vector<uint8_t>(64, 0));
  b.Reset();
  EXPECT_EQ(b.data(), nullptr);
}

TEST_F(DeviceBufferTest, HugeAllocationFailsWithStatusNotAbort) {
  absl::StatusOr<DeviceBuffer> huge = DeviceBuffer::Allocate(size_t{1} << 60);
  ASSERT_FALSE(huge.ok());
  EXPECT_EQ(huge.status().code(), absl::StatusCode::kInternal);
  EXPECT_TRUE(absl::StrContains(huge.status().message(), "cudaMalloc")) << huge.status();
  // The failed allocation must not poison later launches' error checks.
  EXPECT_EQ(cudaGetLastError(), cudaSuccess);
}

}  // namespace
}  // namespace specnode
