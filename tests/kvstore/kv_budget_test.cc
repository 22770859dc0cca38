// The KV budget as a fraction of a device's memory (kvstore/kv_budget.h): what is left of
// fraction × total with the model loaded, in whole MiB, and a clear refusal when that is
// below the store's floor.
#include "kvstore/kv_budget.h"

#include <string>

#include "gtest/gtest.h"

namespace specnode {
namespace {

constexpr int64_t kMiB = int64_t{1} << 20;
constexpr int64_t kGiB = int64_t{1} << 30;

TEST(KvBudgetTest, WhatIsLeftOfTheFractionInWholeMiB) {
  // An H200-sized device with 20 GiB of weights in use: 0.9 × 141 GiB − 20 GiB.
  const DeviceMemoryInfo h200{141 * kGiB, 20 * kGiB};
  auto kv = KvCapacityFromUtilization(0.9, h200, kMiB, "cuda:0");
  ASSERT_TRUE(kv.ok()) << kv.status();
  const double want = 0.9 * 141 * kGiB - 20 * kGiB;
  EXPECT_EQ(*kv % kMiB, 0);
  EXPECT_LE(*kv, want);
  EXPECT_GT(*kv, want - kMiB);
  auto all = KvCapacityFromUtilization(1.0, {8 * kGiB, 3 * kGiB}, kMiB, "cpu");
  ASSERT_TRUE(all.ok());
  EXPECT_EQ(*all, 5 * kGiB);
}

TEST(KvBudgetTest, NoRoomIsResourceExhaustedNamingTheDeviceAndTheFlags) {
  // Other processes' memory counts: 0.5 of 80 GiB with 45 GiB in use leaves nothing.
  auto kv = KvCapacityFromUtilization(0.5, {80 * kGiB, 45 * kGiB}, kMiB, "cuda:3");
  ASSERT_FALSE(kv.ok());
  EXPECT_EQ(kv.status().code(), absl::StatusCode::kResourceExhausted);
  const std::string m(kv.status().message());
  EXPECT_NE(m.find("cuda:3"), std::string::npos) << m;
  EXPECT_NE(m.find("--gpu-memory-utilization"), std::string::npos) << m;
  EXPECT_NE(m.find("--kv-capacity-mb"), std::string::npos) << m;
  // Room, but under the floor (two pages of 3 MiB).
  EXPECT_EQ(
      KvCapacityFromUtilization(1.0, {100 * kMiB, 95 * kMiB}, 6 * kMiB, "cpu").status().code(),
      absl::StatusCode::kResourceExhausted);
  EXPECT_TRUE(KvCapacityFromUtilization(1.0, {100 * kMiB, 90 * kMiB}, 6 * kMiB, "cpu").ok());
}

TEST(KvBudgetTest, AFractionOutsideZeroToOneIsInvalid) {
  for (double f : {0.0, -0.5, 1.01}) {
    EXPECT_EQ(KvCapacityFromUtilization(f, {kGiB, 0}, kMiB, "cpu").status().code(),
              absl::StatusCode::kInvalidArgument)
        << f;
  }
}

}  // namespace
}  // namespace specnode
