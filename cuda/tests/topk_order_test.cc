// The top-k head's order and select (cuda/topk_order.h), as the kernel runs them, against the
// host's TopK (model/llama/sampling.h): runs everywhere, no GPU needed.
#include "cuda/topk_order.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <span>
#include <vector>

#include "gtest/gtest.h"
#include "model/llama/sampling.h"

namespace specnode {
namespace {

// Key order is float order over finite values, signed zeros equal, extremes included.
TEST(TopKOrder, KeysOrderLikeTheFloatsTheyKey) {
  const float v[] = {-std::numeric_limits<float>::max(),
                     -1e30f,
                     -2.5f,
                     -1.0f,
                     -1e-38f,
                     -std::numeric_limits<float>::denorm_min(),
                     -0.0f,
                     0.0f,
                     std::numeric_limits<float>::denorm_min(),
                     1e-38f,
                     1.0f,
                     2.5f,
                     1e30f,
                     std::numeric_limits<float>::max()};
  for (float a : v) {
    for (float b : v) {
      EXPECT_EQ(a < b, topk::Key(a) < topk::Key(b)) << a << " " << b;
      EXPECT_EQ(a == b, topk::Key(a) == topk::Key(b)) << a << " " << b;
    }
  }
  EXPECT_GT(topk::Comp(topk::Key(-std::numeric_limits<float>::max()), 0xfffffffeu), 0u);
}

// Comps sorted descending give TopK's order (ties to the lower id) and their ids back.
TEST(TopKOrder, CompsSortDescendingInTopKOrder) {
  Rng gen(5);
  std::vector<float> row(500);
  for (float& v : row) v = static_cast<float>(static_cast<int>(gen.Uniform() * 30) - 15) * 0.5f;
  row[3] = -0.0f;
  row[9] = 0.0f;
  std::vector<uint64_t> comps;
  for (size_t i = 0; i < row.size(); ++i) {
    comps.push_back(topk::Comp(topk::Key(row[i]), static_cast<uint32_t>(i)));
  }
  std::sort(comps.begin(), comps.end(), std::greater<>());
  std::vector<int32_t> ids(row.size());
  std::vector<float> values(row.size());
  TopK(row, static_cast<int>(row.size()), ids.data(), values.data());
  for (size_t i = 0; i < row.size(); ++i) {
    ASSERT_EQ(static_cast<int32_t>(topk::CompId(comps[i])), ids[i]) << i;
  }
}

// The radix select's threshold is the k-th largest key, and the equal entries it takes
// complete the top k: the kernel's collection rule gives TopK's set.
TEST(TopKOrder, SelectFindsTheKthLargestAndHowManyTiesToTake) {
  Rng gen(11);
  for (int n : {1, 7, 300, 4099}) {
    for (int distinct : {1, 3, 50, 100000}) {
      std::vector<float> row(n);
      for (float& v : row) {
        v = static_cast<float>(static_cast<int>(gen.Uniform() * distinct)) * 0.25f - 3.0f;
      }
      std::vector<uint32_t> keys(n);
      for (int i = 0; i < n; ++i) keys[i] = topk::Key(row[i]);
      for (int k : {1, 2, n / 2 + 1, n}) {
        if (k > n) continue;
        uint32_t threshold = 0;
        int take_equal = 0;
        topk::SelectThreshold(keys.data(), n, k, &threshold, &take_equal);
        std::vector<uint32_t> sorted = keys;
        std::sort(sorted.begin(), sorted.end(), std::greater<>());
        ASSERT_EQ(threshold, sorted[k - 1]) << n << " " << k;
        // Collect as the kernel does: every key above, then the lowest-id equal ones.
        std::vector<int32_t> taken;
        int equal_taken = 0;
        for (int i = 0; i < n; ++i) {
          if (keys[i] > threshold) taken.push_back(i);
          if (keys[i] == threshold && equal_taken < take_equal) {
            taken.push_back(i);
            ++equal_taken;
          }
        }
        ASSERT_EQ(static_cast<int>(taken.size()), k);
        std::vector<int32_t> ids(k);
        std::vector<float> values(k);
        TopK(row, k, ids.data(), values.data());
        std::sort(ids.begin(), ids.end());
        ASSERT_EQ(taken, ids) << n << " " << k << " " << distinct;
      }
    }
  }
}

}  // namespace
}  // namespace specnode
