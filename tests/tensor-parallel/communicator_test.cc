// LocalCommunicator: collectives for T = 1..4 and odd counts, bit-identical results on
// every rank in rank order, byte accounting, deadlines naming the missing rank, and the
// broken state after a failure.
#include "tensor-parallel/local_communicator.h"

#include <chrono>
#include <cstring>
#include <functional>
#include <thread>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;

// Runs fn(rank, comm) on one thread per rank and joins them.
void RunRanks(LocalCommunicatorGroup& group, const std::function<void(int, Communicator*)>& fn) {
  std::vector<std::thread> threads;
  for (int r = 0; r < group.size(); ++r) {
    threads.emplace_back([&, r] { fn(r, group.Rank(r)); });
  }
  for (auto& t : threads) t.join();
}

float Value(int rank, int64_t i) { return 0.1f * rank + 1.0f / (1 + i) + (i % 7) * 1e-3f; }

class LocalCollectives : public ::testing::TestWithParam<int> {};

TEST_P(LocalCollectives, AllReduceSumIsRankOrderedAndIdenticalEverywhere) {
  const int T = GetParam();
  auto group = LocalCommunicatorGroup::Create(T);
  ASSERT_TRUE(group.ok()) << group.status();
  for (int64_t count : {0, 1, 7, 33, 577, 4099}) {
    std::vector<std::vector<float>> out(T);
    RunRanks(**group, [&](int r, Communicator* c) {
      EXPECT_EQ(c->rank(), r);
      EXPECT_EQ(c->size(), T);
      EXPECT_EQ(c->kind(), "local");
      std::vector<float> x(count);
      for (int64_t i = 0; i < count; ++i) x[i] = Value(r, i);
      ASSERT_TRUE(c->AllReduceSum(x.data(), count).ok());
      out[r] = x;
    });
    for (int64_t i = 0; i < count; ++i) {
      float expect = Value(0, i);
      for (int r = 1; r < T; ++r) expect += Value(r, i);
      ASSERT_EQ(out[0][i], expect) << "count " << count << " i " << i;  // same order, exact
    }
    for (int r = 1; r < T; ++r) {
      // count 0: empty vectors, whose data() may be null (memcmp's arguments must not be).
      if (count > 0) {
        ASSERT_EQ(std::memcmp(out[r].data(), out[0].data(), count * sizeof(float)), 0) << r;
      }
    }
  }
}

TEST_P(LocalCollectives, AllGatherBroadcastBarrierAndBytes) {
  const int T = GetParam();
  auto group = LocalCommunicatorGroup::Create(T);
  ASSERT_TRUE(group.ok());
  const int64_t count = 13;
  RunRanks(**group, [&](int r, Communicator* c) {
    std::vector<float> send(count), recv(T * count, -1.0f);
    for (int64_t i = 0; i < count; ++i) send[i] = Value(r, i);
    ASSERT_TRUE(c->AllGather(send.data(), count, recv.data()).ok());
    for (int q = 0; q < T; ++q) {
      for (int64_t i = 0; i < count; ++i) ASSERT_EQ(recv[q * count + i], Value(q, i));
    }
    for (int root = 0; root < T; ++root) {
      char msg[16] = {};
      if (r == root) std::snprintf(msg, sizeof(msg), "root %d", root);
      ASSERT_TRUE(c->Broadcast(msg, 11, root).ok());
      EXPECT_EQ(std::string(msg), "root " + std::to_string(root));
    }
    ASSERT_TRUE(c->Barrier().ok());
    std::vector<float> x(5, 1.0f);
    ASSERT_TRUE(c->AllReduceSum(x.data(), 5).ok());
    EXPECT_EQ(x[4], static_cast<float>(T));
    // AllGather 13 + AllReduceSum 5 floats: 4*(T-1)*18; Broadcast: 11*(T-1) as root, 11 each
    // other time.
    EXPECT_EQ(c->bytes_sent(), 4 * (T - 1) * 18 + 11 * (T - 1));
    EXPECT_EQ(c->bytes_received(), 4 * (T - 1) * 18 + 11 * (T - 1));
  });
}

INSTANTIATE_TEST_SUITE_P(Sizes, LocalCollectives, ::testing::Values(1, 2, 3, 4));

TEST(LocalCommunicator, MissingRankIsDeadlineExceededThenBroken) {
  auto group = LocalCommunicatorGroup::Create(3, {.timeout_s = 0.3});
  ASSERT_TRUE(group.ok());
  std::vector<absl::Status> first(3), later(3);
  std::vector<double> waited(3);
  RunRanks(**group, [&](int r, Communicator* c) {
    std::vector<float> x(64, 1.0f);
    ASSERT_TRUE(c->AllReduceSum(x.data(), 64).ok());  // one good collective first
    if (r == 2) return;                               // rank 2 never arrives at the next
    const auto t0 = std::chrono::steady_clock::now();
    first[r] = c->AllReduceSum(x.data(), 64);
    waited[r] = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    later[r] = c->Barrier();
  });
  for (int r : {0, 1}) {
    EXPECT_EQ(first[r].code(), absl::StatusCode::kDeadlineExceeded) << first[r];
    EXPECT_THAT(first[r].message(), HasSubstr("from rank 2"));
    EXPECT_THAT(first[r].message(), HasSubstr("AllReduceSum #2"));
    EXPECT_GE(waited[r], 0.25);
    EXPECT_LT(waited[r], 2.0);
    EXPECT_EQ(later[r].code(), absl::StatusCode::kFailedPrecondition) << later[r];
    EXPECT_THAT(later[r].message(), HasSubstr("broken"));
  }
  // The late rank finds the group broken instead of waiting.
  std::vector<float> x(64, 1.0f);
  const absl::Status late = (*group)->Rank(2)->AllReduceSum(x.data(), 64);
  EXPECT_EQ(late.code(), absl::StatusCode::kFailedPrecondition) << late;
}

TEST(LocalCommunicator, MismatchedCollectivesAreInvalidArgument) {
  auto group = LocalCommunicatorGroup::Create(2, {.timeout_s = 2.0});
  ASSERT_TRUE(group.ok());
  std::vector<absl::Status> got(2);
  RunRanks(**group, [&](int r, Communicator* c) {
    std::vector<float> x(8, 1.0f);
    got[r] = c->AllReduceSum(x.data(), r == 0 ? 8 : 4);
  });
  for (int r : {0, 1}) {
    EXPECT_EQ(got[r].code(), absl::StatusCode::kInvalidArgument) << got[r];
    EXPECT_THAT(got[r].message(), HasSubstr("mismatch"));
  }
}

TEST(LocalCommunicator, BadOptions) {
  EXPECT_EQ(LocalCommunicatorGroup::Create(0).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(LocalCommunicatorGroup::Create(2, {.timeout_s = 0}).status().code(),
            absl::StatusCode::kInvalidArgument);
}

TEST(CommunicatorReducer, ForwardsToTheCommunicator) {
  auto group = LocalCommunicatorGroup::Create(2);
  ASSERT_TRUE(group.ok());
  RunRanks(**group, [&](int r, Communicator* c) {
    CommunicatorReducer reducer(c);
    std::vector<float> x(3, r + 1.0f);
    ASSERT_TRUE(reducer.AllReduceSum(x.data(), 3).ok());
    EXPECT_EQ(x[0], 3.0f);
  });
}

}  // namespace
}  // namespace specnode
