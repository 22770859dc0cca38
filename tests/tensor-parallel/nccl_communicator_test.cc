// NcclCommunicator: one rank per visible GPU (up to 4) as threads of this process,
// bootstrapped over a LocalCommunicatorGroup (any host Communicator can carry the
// ncclUniqueId; under mpirun it is MpiCommunicator). With one GPU the group has one rank:
// NCCL still runs every collective (a copy), which checks the plumbing; the multi-rank
// checks and the deadline need 2+ GPUs and say so when skipped. Without a GPU every test
// skips with "no CUDA device: <reason>".
#include "cuda/nccl_communicator.h"

#include <chrono>
#include <functional>
#include <thread>
#include <vector>

#include "cuda/cuda_check.h"
#include "cuda/device_buffer.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tensor-parallel/local_communicator.h"
#include "cuda/nccl_check.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;

int GpusOrSkipReason(std::string* reason) {
  auto n = CudaDeviceCount();
  if (!n.ok()) {
    *reason = std::string(n.status().message());
    return 0;
  }
  if (*n == 0) *reason = "no CUDA device: the runtime reports 0 devices";
  return *n;
}

#define SKIP_WITHOUT_GPU(n)                      \
  std::string skip_reason_;                      \
  const int n = GpusOrSkipReason(&skip_reason_); \
  if (n == 0) GTEST_SKIP() << skip_reason_

// fn(rank, comm) on one thread per rank, each rank on GPU `rank`.
void RunGroup(int T, double timeout_s, const std::function<void(int, NcclCommunicator*)>& fn) {
  auto boot = LocalCommunicatorGroup::Create(T, {.timeout_s = 60});
  ASSERT_TRUE(boot.ok());
  std::vector<std::thread> threads;
  for (int r = 0; r < T; ++r) {
    threads.emplace_back([&, r] {
      auto c = NcclCommunicator::Create((*boot)->Rank(r), r, {.timeout_s = timeout_s});
      ASSERT_TRUE(c.ok()) << c.status();
      EXPECT_EQ((*c)->kind(), "nccl");
      EXPECT_EQ((*c)->rank(), r);
      fn(r, c->get());
    });
  }
  for (auto& t : threads) t.join();
}

TEST(NcclCommunicator, CollectivesOnEveryVisibleGpu) {
  SKIP_WITHOUT_GPU(gpus);
  const int T = std::min(gpus, 4);
  if (T == 1) std::printf("[ note ] 1 GPU: NCCL group of one rank (multi-rank needs 2+)\n");
  RunGroup(T, 30, [&](int r, NcclCommunicator* c) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    for (int64_t count : {1, 7, 577, 40000}) {
      std::vector<float> host(count);
      for (int64_t i = 0; i < count; ++i) host[i] = r + 0.5f * (i % 5);
      auto buf = DeviceBuffer::FromHost(host.data(), count * sizeof(float));
      ASSERT_TRUE(buf.ok()) << buf.status();
      float* d = static_cast<float*>(buf->data());
      ASSERT_TRUE(c->AllReduceSum(d, count).ok());
      std::vector<float> got(count);
      ASSERT_EQ(cudaMemcpy(got.data(), d, count * sizeof(float), cudaMemcpyDeviceToHost),
                cudaSuccess);
      for (int64_t i = 0; i < count; ++i) {
        float want = 0;
        for (int q = 0; q < T; ++q) want += q + 0.5f * (i % 5);
        ASSERT_EQ(got[i], want) << i;  // small exact values: any order gives these bits
      }
    }
    // AllGather and Broadcast.
    std::vector<float> mine(9, static_cast<float>(r));
    auto send = DeviceBuffer::FromHost(mine.data(), 9 * sizeof(float));
    auto recv = DeviceBuffer::Allocate(T * 9 * sizeof(float));
    ASSERT_TRUE(send.ok() && recv.ok());
    ASSERT_TRUE(
        c->AllGather(static_cast<float*>(send->data()), 9, static_cast<float*>(recv->data())).ok());
    std::vector<float> all(T * 9);
    ASSERT_EQ(cudaMemcpy(all.data(), recv->data(), all.size() * 4, cudaMemcpyDeviceToHost),
              cudaSuccess);
    for (int q = 0; q < T; ++q) EXPECT_EQ(all[q * 9 + 8], static_cast<float>(q));
    ASSERT_TRUE(c->Broadcast(send->data(), 9 * sizeof(float), T - 1).ok());
    ASSERT_EQ(cudaMemcpy(mine.data(), send->data(), 36, cudaMemcpyDeviceToHost), cudaSuccess);
    EXPECT_EQ(mine[0], static_cast<float>(T - 1));
    EXPECT_TRUE(c->Barrier().ok());
  });
}

TEST(NcclCommunicator, MissingRankIsDeadlineExceeded) {
  SKIP_WITHOUT_GPU(gpus);
  if (gpus < 2) GTEST_SKIP() << "the deadline test needs 2+ GPUs (found " << gpus << ")";
  RunGroup(2, 1.0, [&](int r, NcclCommunicator* c) {
    ASSERT_EQ(cudaSetDevice(r), cudaSuccess);
    auto buf = DeviceBuffer::Allocate(1024 * sizeof(float));
    ASSERT_TRUE(buf.ok());
    if (r == 1) return;  // never joins
    const auto t0 = std::chrono::steady_clock::now();
    const absl::Status s = c->AllReduceSum(static_cast<float*>(buf->data()), 1024);
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_EQ(s.code(), absl::StatusCode::kDeadlineExceeded) << s;
    EXPECT_THAT(s.message(), HasSubstr("no answer within 1 s"));
    EXPECT_LT(waited, 5.0);
    EXPECT_EQ(c->Barrier().code(), absl::StatusCode::kFailedPrecondition);
  });
}

TEST(NcclCommunicator, BadDeviceIsInvalidArgument) {
  SKIP_WITHOUT_GPU(gpus);
  auto boot = LocalCommunicatorGroup::Create(1);
  ASSERT_TRUE(boot.ok());
  auto c = NcclCommunicator::Create((*boot)->Rank(0), gpus + 3);
  EXPECT_EQ(c.status().code(), absl::StatusCode::kInvalidArgument) << c.status();
}

TEST(NcclCheck, MessageFormat) {
  const absl::Status s = SPECNODE_NCCL_STATUS(ncclInvalidArgument);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(s.message(), HasSubstr("ncclInvalidArgument failed: "));
  EXPECT_TRUE(SPECNODE_NCCL_STATUS(ncclInProgress).ok());
}

}  // namespace
}  // namespace specnode
