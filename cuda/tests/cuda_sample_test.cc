// CudaDrawRows (cuda/cuda_sample.h) against the host's DrawRows (model/llama/sampling.h), which
// tests/model/sampling_test.cc checks against Sampler::Sample: the same token for every row,
// greedy and sampled at several temperatures, with and without top-p, over vocabulary sizes
// around the block's lane count, ties (quarter steps, equal rows, signed zeros) and
// non-finite rows. Skips without a GPU.
#include "cuda/cuda_sample.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <vector>

#include "cuda/cuda_topk.h"
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

class CudaDrawTest : public CudaTest {};

// CudaDrawRows of x ([kHeadRows, cols]) with draws [kHeadRows], the rows' top-p head sorted
// by CudaTopKRows first when `head` (as CudaBackend::FinishDraws does).
std::vector<int32_t> DeviceDraws(const std::vector<float>& x, int64_t cols,
                                 const std::vector<sample::DrawParams>& draws, bool head) {
  const int64_t n = kHeadRows;
  absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
  absl::StatusOr<DeviceBuffer> d_dev = Upload(draws);
  absl::StatusOr<DeviceBuffer> ids_dev = DeviceBuffer::Allocate(n * sizeof(int32_t));
  const int k = static_cast<int>(std::min<int64_t>(sample::kNucleusHead, cols));
  absl::StatusOr<DeviceBuffer> hid_dev = DeviceBuffer::Allocate(n * k * sizeof(int32_t));
  absl::StatusOr<DeviceBuffer> hval_dev = DeviceBuffer::Allocate(n * k * sizeof(float));
  EXPECT_TRUE(x_dev.ok() && d_dev.ok() && ids_dev.ok() && hid_dev.ok() && hval_dev.ok());
  if (!(x_dev.ok() && d_dev.ok() && ids_dev.ok() && hid_dev.ok() && hval_dev.ok())) return {};
  CudaDrawHead h;
  if (head) {
    EXPECT_TRUE(
        CudaTopKRows(x_dev->as<float>(), n, cols, k, hid_dev->as<int32_t>(), hval_dev->as<float>())
            .ok());
    h = {hid_dev->as<int32_t>(), hval_dev->as<float>(), k};
  }
  EXPECT_TRUE(CudaDrawRows(x_dev->as<float>(), n, cols, d_dev->as<sample::DrawParams>(), h,
                           ids_dev->as<int32_t>())
                  .ok());
  absl::StatusOr<std::vector<int32_t>> ids = Download<int32_t>(*ids_dev, n);
  EXPECT_TRUE(ids.ok());
  return ids.ok() ? *ids : std::vector<int32_t>{};
}

TEST_F(CudaDrawTest, EqualsTheHostDrawAndFlagsNonFiniteRows) {
  constexpr int64_t n = kHeadRows;
  for (int64_t cols : {int64_t{1}, int64_t{40}, int64_t{1023}, int64_t{1024}, int64_t{1025},
                       int64_t{49152}, int64_t{151936}}) {
    for (float temperature : {0.0f, 0.05f, 0.7f, 1.0f, 3.0f}) {
      const std::vector<float> x = HeadRows(cols, static_cast<uint32_t>(cols));
      Sampler sampler({temperature, 0, 1.0f, static_cast<uint64_t>(cols)});
      std::vector<sample::DrawParams> draws;
      for (int64_t r = 0; r < n; ++r) draws.push_back(sampler.DrawAt(1000 + r));
      std::vector<int32_t> want(n);
      DrawRows(x.data(), n, cols, draws.data(), want.data());
      const std::vector<int32_t> ids = DeviceDraws(x, cols, draws, false);
      ASSERT_EQ(ids.size(), static_cast<size_t>(n));
      for (int64_t r = 0; r < n; ++r) {
        EXPECT_EQ(ids[r], want[r]) << "cols " << cols << " T " << temperature << " row " << r;
      }
      EXPECT_EQ(ids[4], -1);
      EXPECT_EQ(ids[5], -1);
    }
  }
}

// Top-p rows: the host's token wherever the nucleus fits the head, -2 (the host draws) where
// it does not — never on a vocabulary the head covers — and -2 for every top-p row when no
// head is given.
TEST_F(CudaDrawTest, TopPEqualsTheHostDrawOrAsksTheHost) {
  constexpr int64_t n = kHeadRows;
  int on_device = 0;
  for (int64_t cols :
       {int64_t{1}, int64_t{40}, int64_t{1024}, int64_t{1025}, int64_t{49152}, int64_t{151936}}) {
    for (float temperature : {0.05f, 0.7f, 1.5f}) {
      for (float top_p : {0.1f, 0.9f, 0.999f}) {
        const std::vector<float> x = HeadRows(cols, static_cast<uint32_t>(cols) + 7);
        Sampler sampler({temperature, 0, top_p, static_cast<uint64_t>(cols) + 3});
        std::vector<sample::DrawParams> draws;
        for (int64_t r = 0; r < n; ++r) draws.push_back(sampler.DrawAt(1000 + r));
        std::vector<int32_t> want(n);
        DrawRows(x.data(), n, cols, draws.data(), want.data());
        const std::vector<int32_t> ids = DeviceDraws(x, cols, draws, true);
        ASSERT_EQ(ids.size(), static_cast<size_t>(n));
        for (int64_t r = 0; r < n; ++r) {
          if (ids[r] == -2) {
            EXPECT_GT(cols, sample::kNucleusHead) << "row " << r;
            continue;
          }
          on_device += r < 4 || r == 6;
          EXPECT_EQ(ids[r], want[r])
              << "cols " << cols << " T " << temperature << " top_p " << top_p << " row " << r;
        }
        const std::vector<int32_t> headless = DeviceDraws(x, cols, draws, false);
        ASSERT_EQ(headless.size(), static_cast<size_t>(n));
        EXPECT_EQ(headless[0], -2);
        EXPECT_EQ(headless[4], -1);
      }
    }
  }
  EXPECT_GT(on_device, 100);
}

// Argument checks run without a GPU too (nothing is launched).
TEST(CudaDrawArgs, RefusesBadShapesAndNullPointers) {
  float* x = reinterpret_cast<float*>(16);
  auto* d = reinterpret_cast<sample::DrawParams*>(16);
  int32_t* ids = reinterpret_cast<int32_t*>(16);
  const CudaDrawHead none;
  EXPECT_EQ(CudaDrawRows(x, -1, 100, d, none, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaDrawRows(x, 2, 0, d, none, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaDrawRows(nullptr, 2, 100, d, none, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaDrawRows(x, 2, 100, nullptr, none, ids).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CudaDrawRows(nullptr, 0, 100, nullptr, none, nullptr).ok());
  // A head must hold min(kNucleusHead, cols) entries a row, values with the ids.
  const CudaDrawHead short_head{ids, x, 99};
  EXPECT_EQ(CudaDrawRows(x, 2, 100, d, short_head, ids).code(), absl::StatusCode::kInvalidArgument);
  const CudaDrawHead no_values{ids, nullptr, 100};
  EXPECT_EQ(CudaDrawRows(x, 2, 100, d, no_values, ids).code(), absl::StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace specnode
