// CudaGraphCache (cuda_graph_cache.h): eager until a shape recurs, then one capture and
// replays that do exactly what the eager launches do; a changed signature recaptures; an
// error inside the launches is returned and leaves the cache usable. Skips without a GPU.
#include "cuda/cuda_graph_cache.h"

#include <cuda_runtime_api.h>

#include <vector>

#include "cuda/cuda_ops.h"
#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using cuda_test::Download;
using cuda_test::Upload;

class CudaGraphCacheTest : public cuda_test::CudaTest {
 protected:
  void SetUp() override {
    cuda_test::CudaTest::SetUp();
    if (IsSkipped()) return;
    ASSERT_EQ(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), cudaSuccess);
  }
  void TearDown() override {
    if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
  }
  // y[0, n) as the host sees it after the stream's work.
  std::vector<float> Read(const DeviceBuffer& y, size_t n) {
    EXPECT_EQ(cudaStreamSynchronize(stream_), cudaSuccess);
    absl::StatusOr<std::vector<float>> got = Download<float>(y, n);
    EXPECT_TRUE(got.ok()) << got.status();
    return got.ok() ? *got : std::vector<float>();
  }
  cudaStream_t stream_ = nullptr;
};

TEST_F(CudaGraphCacheTest, ReplaysOnceTheShapeRecursAndMatchesEager) {
  const size_t n = 1000;
  absl::StatusOr<DeviceBuffer> y = Upload(std::vector<float>(n, 0.0f));
  absl::StatusOr<DeviceBuffer> x = Upload(std::vector<float>(n, 1.0f));
  ASSERT_TRUE(y.ok() && x.ok());
  CudaGraphCache cache(/*min_uses=*/2);
  const uint64_t sig = GraphSignature().Add(y->data()).Add(x->data()).value();
  // Two launches per call, so a replay that ran only part of the sequence would show.
  auto launches = [&] {
    absl::Status s = CudaAddInPlace(y->as<float>(), x->as<float>(), n, stream_);
    if (!s.ok()) return s;
    return CudaAddInPlace(y->as<float>(), x->as<float>(), n, stream_);
  };
  for (int i = 0; i < 5; ++i) SPECNODE_ASSERT_OK(cache.Run(stream_, n, sig, launches));
  EXPECT_EQ(Read(*y, n), std::vector<float>(n, 10.0f));
  EXPECT_EQ(cache.captures(), 1);
  EXPECT_EQ(cache.replays(), 4);  // call 1 eager, call 2 captured then launched, 3-5 replayed
  EXPECT_FALSE(cache.disabled()) << cache.disabled_reason();
}

TEST_F(CudaGraphCacheTest, ChangedSignatureRecapturesAndOldPointersAreNotReplayed) {
  const size_t n = 64;
  absl::StatusOr<DeviceBuffer> a = Upload(std::vector<float>(n, 0.0f));
  absl::StatusOr<DeviceBuffer> b = Upload(std::vector<float>(n, 0.0f));
  absl::StatusOr<DeviceBuffer> x = Upload(std::vector<float>(n, 1.0f));
  ASSERT_TRUE(a.ok() && b.ok() && x.ok());
  CudaGraphCache cache(/*min_uses=*/1, /*max_graphs=*/2);
  float* target = a->as<float>();
  auto launches = [&] { return CudaAddInPlace(target, x->as<float>(), n, stream_); };
  for (int i = 0; i < 3; ++i) {
    SPECNODE_ASSERT_OK(cache.Run(stream_, 7, GraphSignature().Add(target).value(), launches));
  }
  target = b->as<float>();  // same key, new buffer: must not replay into `a`
  for (int i = 0; i < 2; ++i) {
    SPECNODE_ASSERT_OK(cache.Run(stream_, 7, GraphSignature().Add(target).value(), launches));
  }
  EXPECT_EQ(Read(*a, n), std::vector<float>(n, 3.0f));
  EXPECT_EQ(Read(*b, n), std::vector<float>(n, 2.0f));
  EXPECT_EQ(cache.captures(), 2);
  // More keys than max_graphs: graphs are dropped, results stay right.
  for (int64_t key = 100; key < 104; ++key) {
    SPECNODE_ASSERT_OK(cache.Run(stream_, key, GraphSignature().Add(target).value(), launches));
  }
  EXPECT_EQ(Read(*b, n), std::vector<float>(n, 6.0f));
}

TEST_F(CudaGraphCacheTest, ErrorInsideTheLaunchesIsReturnedAndTheCacheStaysUsable) {
  const size_t n = 32;
  absl::StatusOr<DeviceBuffer> y = Upload(std::vector<float>(n, 0.0f));
  absl::StatusOr<DeviceBuffer> x = Upload(std::vector<float>(n, 1.0f));
  ASSERT_TRUE(y.ok() && x.ok());
  CudaGraphCache cache(/*min_uses=*/1);
  // A launch then an invalid one, failing while being captured.
  auto bad = [&] {
    absl::Status s = CudaAddInPlace(y->as<float>(), x->as<float>(), n, stream_);
    if (!s.ok()) return s;
    return CudaAddInPlace(nullptr, x->as<float>(), n, stream_);
  };
  EXPECT_EQ(cache.Run(stream_, 1, 42, bad).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_FALSE(cache.disabled()) << cache.disabled_reason();
  EXPECT_EQ(cache.captures(), 0);
  // Nothing of the failed capture ran; a good sequence under the same key works.
  auto good = [&] { return CudaAddInPlace(y->as<float>(), x->as<float>(), n, stream_); };
  for (int i = 0; i < 3; ++i) SPECNODE_ASSERT_OK(cache.Run(stream_, 1, 43, good));
  EXPECT_EQ(Read(*y, n), std::vector<float>(n, 3.0f));
  EXPECT_EQ(cache.captures(), 1);
}

}  // namespace
}  // namespace specnode
