// CudaTopKRows (cuda/cuda_topk.h) against the host's TopK (model/llama/sampling.h): the same
// ids and values in the same order, over vocabulary sizes around the block's stride, k from
// 1 to the launch's maximum, ties that cross the k-th place, signed zeros and non-finite rows.
// Skips without a GPU.
#include "cuda/cuda_topk.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <span>
#include <vector>

#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"
#include "model/llama/sampling.h"

namespace specnode {
namespace {

using cuda_test::CudaTest;
using cuda_test::Download;
using cuda_test::HeadRows;
using cuda_test::kHeadRows;
using cuda_test::Upload;

class CudaTopKTest : public CudaTest {};

TEST_F(CudaTopKTest, EqualsTheHostTopKAndFlagsNonFiniteRows) {
  for (int64_t cols :
       {int64_t{1}, int64_t{40}, int64_t{1023}, int64_t{1025}, int64_t{49152}, int64_t{151936}}) {
    for (int k : {1, 2, 17, 40, 256, 1000, kCudaTopKMax}) {
      if (k > cols) continue;
      const int64_t n = kHeadRows;
      const std::vector<float> x = HeadRows(cols, static_cast<uint32_t>(cols + k));
      absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
      absl::StatusOr<DeviceBuffer> ids_dev = DeviceBuffer::Allocate(n * k * sizeof(int32_t));
      absl::StatusOr<DeviceBuffer> val_dev = DeviceBuffer::Allocate(n * k * sizeof(float));
      ASSERT_TRUE(x_dev.ok() && ids_dev.ok() && val_dev.ok());
      SPECNODE_ASSERT_OK(CudaTopKRows(x_dev->as<float>(), n, cols, k, ids_dev->as<int32_t>(),
                                      val_dev->as<float>()));
      absl::StatusOr<std::vector<int32_t>> ids = Download<int32_t>(*ids_dev, n * k);
      absl::StatusOr<std::vector<float>> values = Download<float>(*val_dev, n * k);
      ASSERT_TRUE(ids.ok() && values.ok());
      std::vector<int32_t> want_ids(k);
      std::vector<float> want_values(k);
      for (int64_t r = 0; r < n; ++r) {
        const std::span<const float> row(x.data() + r * cols, cols);
        if (!std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); })) {
          EXPECT_EQ((*ids)[r * k], -1) << "cols " << cols << " k " << k << " row " << r;
          continue;
        }
        TopK(row, k, want_ids.data(), want_values.data());
        for (int i = 0; i < k; ++i) {
          ASSERT_EQ((*ids)[r * k + i], want_ids[i])
              << "cols " << cols << " k " << k << " row " << r << " rank " << i;
          ASSERT_EQ(std::signbit((*values)[r * k + i]), std::signbit(want_values[i]));
          ASSERT_EQ((*values)[r * k + i], want_values[i]);
        }
      }
    }
  }
}

// Argument checks run without a GPU too (nothing is launched).
TEST(CudaTopKArgs, RefusesKOutsideItsRangeAndBadShapes) {
  float* x = reinterpret_cast<float*>(16);
  int32_t* ids = reinterpret_cast<int32_t*>(16);
  EXPECT_EQ(CudaTopKRows(x, 2, 100, 0, ids, x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaTopKRows(x, 2, 100, 101, ids, x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaTopKRows(x, 2, 5000, kCudaTopKMax + 1, ids, x).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaTopKRows(x, -1, 100, 4, ids, x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaTopKRows(nullptr, 2, 100, 4, ids, x).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CudaTopKRows(nullptr, 0, 100, 4, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace specnode
