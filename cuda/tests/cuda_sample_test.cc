// CudaDrawRows (cuda/cuda_sample.h) against the host's DrawRows (model/llama/sampling.h), which
// tests/model/sampling_test.cc checks against Sampler::Sample: the same token for every row,
// greedy and sampled at several temperatures, over vocabulary sizes around the block's lane
// count, ties (quarter steps, equal rows, signed zeros) and non-finite rows. Skips without a
// GPU.
#include "cuda/cuda_sample.h"

#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"
#include "model/llama/sampling.h"

namespace specnode {
namespace {

using cuda_test::CudaTest;
using cuda_test::Download;
using cuda_test::RandomVector;
using cuda_test::Upload;

class CudaDrawTest : public CudaTest {};

// Rows: 0 random (x 8: a flat distribution), 1 every value equal, 2 quarter steps, 3 signed
// zeros above negatives, 4 a NaN, 5 +inf, 6 one large logit (a sharp distribution).
std::vector<float> Rows(int64_t n, int64_t cols, uint32_t seed) {
  std::vector<float> x = RandomVector(n * cols, seed);
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

TEST_F(CudaDrawTest, EqualsTheHostDrawAndFlagsNonFiniteRows) {
  constexpr int64_t n = 7;
  for (int64_t cols : {int64_t{1}, int64_t{40}, int64_t{1023}, int64_t{1024}, int64_t{1025},
                       int64_t{49152}, int64_t{151936}}) {
    for (float temperature : {0.0f, 0.05f, 0.7f, 1.0f, 3.0f}) {
      const std::vector<float> x = Rows(n, cols, static_cast<uint32_t>(cols));
      Sampler sampler({temperature, 0, 1.0f, static_cast<uint64_t>(cols)});
      std::vector<sample::DrawParams> draws;
      for (int64_t r = 0; r < n; ++r) draws.push_back(sampler.DrawAt(1000 + r));
      std::vector<int32_t> want(n);
      DrawRows(x.data(), n, cols, draws.data(), want.data());
      absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
      absl::StatusOr<DeviceBuffer> d_dev = Upload(draws);
      absl::StatusOr<DeviceBuffer> ids_dev = DeviceBuffer::Allocate(n * sizeof(int32_t));
      ASSERT_TRUE(x_dev.ok() && d_dev.ok() && ids_dev.ok());
      SPECNODE_ASSERT_OK(CudaDrawRows(x_dev->as<float>(), n, cols, d_dev->as<sample::DrawParams>(),
                                      ids_dev->as<int32_t>()));
      absl::StatusOr<std::vector<int32_t>> ids = Download<int32_t>(*ids_dev, n);
      ASSERT_TRUE(ids.ok());
      for (int64_t r = 0; r < n; ++r) {
        EXPECT_EQ((*ids)[r], want[r]) << "cols " << cols << " T " << temperature << " row " << r;
      }
      EXPECT_EQ((*ids)[4], -1);
      EXPECT_EQ((*ids)[5], -1);
    }
  }
}

// Argument checks run without a GPU too (nothing is launched).
TEST(CudaDrawArgs, RefusesBadShapesAndNullPointers) {
  float* x = reinterpret_cast<float*>(16);
  auto* d = reinterpret_cast<sample::DrawParams*>(16);
  int32_t* ids = reinterpret_cast<int32_t*>(16);
  EXPECT_EQ(CudaDrawRows(x, -1, 100, d, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaDrawRows(x, 2, 0, d, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaDrawRows(nullptr, 2, 100, d, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaDrawRows(x, 2, 100, nullptr, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CudaDrawRows(nullptr, 0, 100, nullptr, nullptr).ok());
}

}  // namespace
}  // namespace specnode
