#include "kvstore/kv_cache_factory.h"
#include "kvstore/kv_store.h"

#include <cmath>
#include <unistd.h>

#include <filesystem>
#include <random>

#include "gtest/gtest.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/dense_kv_cache.h"
#include "model/llama/cpu_forward.h"
#include "model/llama/llama_forward.h"
#include "model/llama/llama_model.h"
#include "model/llama/tiny_model.h"
#include "tests/kvstore/kv_store_test_util.h"
#include "tests/support/temp_file.h"

namespace specnode {
namespace {

using kvtest::Feed;
using kvtest::Query;
using kvtest::SettleNow;
using kvtest::SmallConfig;

std::unique_ptr<KvStore> Make(const KvStoreConfig& c) {
  auto s = MakeHostKvStore(c);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

DenseKvCache MakeDense(const KvStoreConfig& c) {
  return DenseKvCache(c.n_layers, c.n_kv_heads, c.head_dim, c.gqa_group, c.max_seq_len, 1 << 20);
}

double MaxAbsDiff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, std::abs(double(a[i]) - b[i]));
  return m;
}

// Attention over each class equals dense attention on the original values within a
// tolerance set by that class's rounding; outputs are averages of unit-normal values, so
// absolute tolerances apply.
class StoreVsDense : public ::testing::TestWithParam<std::pair<KvMode, double>> {};

TEST_P(StoreVsDense, AttentionMatchesDenseReference) {
  const auto [mode, tol] = GetParam();
  KvStoreConfig c = SmallConfig(mode);
  auto store = Make(c);
  DenseKvCache dense = MakeDense(c);
  std::mt19937 g1(11), g2(11);
  for (int chunk : {5, 1, 1, 30, 1, 7, 1, 1, 60}) {
    ASSERT_TRUE(Feed(*store, c, 1, chunk, g1).ok());
    ASSERT_TRUE(Feed(dense, c, 1, chunk, g2).ok());
    const double diff = MaxAbsDiff(Query(*store, c, 1, chunk), Query(dense, c, 1, chunk));
    EXPECT_LT(diff, tol) << KvModeName(mode) << " after chunk " << chunk;
    // A sliding window (Gemma 3's local layers): the last 12 positions only, in every class.
    const std::vector<float> windowed = Query(*store, c, 1, chunk, 12);
    EXPECT_LT(MaxAbsDiff(windowed, Query(dense, c, 1, chunk, 12)), tol) << "window 12";
    if (store->Length(1) > 12) {
      EXPECT_GT(MaxAbsDiff(windowed, Query(*store, c, 1, chunk)), 0.3) << "window unused";
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, StoreVsDense,
    ::testing::Values(std::make_pair(KvMode::kFull, 2e-3), std::make_pair(KvMode::kInt8, 3e-2),
                      std::make_pair(KvMode::kInt4, 0.35), std::make_pair(KvMode::kInt2, 1.0),
                      std::make_pair(KvMode::kMixed, 0.35)),
    [](const auto& info) { return std::string(KvModeName(info.param.first)); });

TEST(KvStore, MixedKeepsSinksAndWindowFullAndDemotesTheRest) {
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  auto store = Make(c);
  std::mt19937 gen(3);
  ASSERT_TRUE(Feed(*store, c, 1, 40, gen).ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(Feed(*store, c, 1, 1, gen).ok());
  auto t = store->SequenceTokens(1);
  // The last commit is not settled yet: the window has not moved for it.
  EXPECT_EQ(t[0], c.sink_tokens + c.window_tokens + 1);
  SettleNow(*store, 1);
  t = store->SequenceTokens(1);
  EXPECT_EQ(t[0], c.sink_tokens + c.window_tokens);
  EXPECT_EQ(t[1] + t[2], 50 - c.sink_tokens - c.window_tokens);
  EXPECT_GT(t[2], 0);  // most tokens are not critical
  KvUsage u = store->Usage();
  EXPECT_EQ(u.tokens, t);
  EXPECT_LE(u.used_bytes, u.capacity_bytes);
  EXPECT_EQ(u.used_bytes, u.bytes[0] + u.bytes[1] + u.bytes[2] + u.bytes[3]);
  EXPECT_EQ(t[3], 0) << "no cold tier unless asked for";
}

// Issue 16, item 11: in mixed mode the classes tokens end in, and what a query sees, depend
// only on the committed tokens. The same token stream (K/V and queries a function of the
// position alone, as a model's are) is fed one token per pass; in passes of random sizes
// that stay between multiples of demote_every (PassBoundary), as verification and chunked
// prefill make them; and with drafts rolled back (extra rows written, attended, then
// truncated away — their attention must not count). Every pass's attention outputs and the
// final classes must be bit-identical, also when the passes run on threads.
// With the cold tier on, some tokens end INT2; with a byte budget (as a fraction of an f16
// slot per token) the last boundaries re-demote older tokens; the same holds for both.
class MixedDemotion : public ::testing::TestWithParam<std::pair<float, double>> {};

TEST_P(MixedDemotion, DependsOnlyOnCommittedTokens) {
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  c.demote_every = 8;
  c.mass_sample_every = 2;
  c.window_tokens = 12;
  c.critical_threshold = 1.2f;
  c.cold_threshold = GetParam().first;
  if (GetParam().second > 0) {
    const int64_t f16_slot = int64_t{2} * c.n_layers * c.n_kv_heads * 2 * c.head_dim;
    c.bytes_per_token = static_cast<int64_t>(GetParam().second * f16_slot);
  }
  const int hd = c.head_dim, n_heads = c.n_kv_heads * c.gqa_group;
  const size_t row = static_cast<size_t>(c.n_kv_heads) * hd;
  const size_t qrow = static_cast<size_t>(n_heads) * hd;
  // K, V and q of position p at layer l; `salt` != 0 gives a rejected draft's values.
  auto values = [&](int p, int l, int salt, std::vector<float>* k, std::vector<float>* v,
                    std::vector<float>* q) {
    std::mt19937 g(static_cast<uint32_t>(p * 131 + l * 7 + salt * 100003));
    std::normal_distribution<float> d(0.0f, 1.0f);
    for (float& x : *k) x = d(g) * (p % 9 == 0 ? 3.0f : 1.0f);  // some keys stand out
    for (float& x : *v) x = d(g);
    for (float& x : *q) x = d(g);
    if (salt != 0) {
      // A rejected draft's query looks straight at position 20's key: were its attention
      // counted, 20 would turn critical (INT8 instead of INT4).
      std::mt19937 g20(static_cast<uint32_t>(20 * 131 + l * 7));
      std::vector<float> k20(k->size());
      for (float& x : k20) x = d(g20);
      for (int h = 0; h < n_heads; ++h) {
        const int kvh = h / c.gqa_group;
        for (int i = 0; i < hd; ++i) (*q)[h * hd + i] = 4.0f * k20[kvh * hd + i];
      }
    }
  };
  const int kTotal = 90;
  // Runs the stream in passes; `plan` gives each pass's committed rows and rejected extra
  // rows. Returns every committed row's attention output (position order) + the classes.
  auto run = [&](const std::vector<std::pair<int, int>>& plan, ThreadPool* threads) {
    auto store = Make(c);
    std::vector<float> outs(static_cast<size_t>(kTotal) * c.n_layers * qrow);
    int pos = 0;
    for (auto [n, extra] : plan) {
      const int rows = n + extra;
      EXPECT_EQ(pos / 8, (pos + rows - 1) / 8) << "the plan straddles a boundary";
      EXPECT_TRUE(store->Reserve(1, rows).ok());
      const KvPassEntry e{1, pos, rows};
      EXPECT_TRUE(store->BeginPass({&e, 1}, threads).ok());
      for (int l = 0; l < c.n_layers; ++l) {
        std::vector<float> k(rows * row), v(rows * row), q(rows * qrow), out(rows * qrow);
        for (int r = 0; r < rows; ++r) {
          std::vector<float> kr(row), vr(row), qr(qrow);
          values(pos + r, l, r < n ? 0 : 1, &kr, &vr, &qr);
          std::copy(kr.begin(), kr.end(), k.begin() + r * row);
          std::copy(vr.begin(), vr.end(), v.begin() + r * row);
          std::copy(qr.begin(), qr.end(), q.begin() + r * qrow);
        }
        EXPECT_TRUE(store->Write(l, k.data(), v.data()).ok());
        EXPECT_TRUE(store->Attend(l, q.data(), 0.25f, 0, out.data()).ok());
        for (int r = 0; r < n; ++r) {
          std::copy(out.begin() + r * qrow, out.begin() + (r + 1) * qrow,
                    outs.begin() + (static_cast<size_t>(pos + r) * c.n_layers + l) * qrow);
        }
      }
      store->Commit(1, pos + rows);
      if (extra > 0) {
        EXPECT_TRUE(store->Truncate(1, pos + n).ok());
      }
      pos += n;
    }
    EXPECT_EQ(pos, kTotal);
    SettleNow(*store, 1);
    return std::make_pair(outs, store->SequenceTokens(1));
  };
  std::vector<std::pair<int, int>> one_by_one(kTotal, {1, 0});
  const auto want = run(one_by_one, nullptr);
  // (Under the budget a wrong mass would move tokens between int4 and int2 instead.)
  if (c.bytes_per_token == 0) {
    EXPECT_GT(want.second[1], 0) << "no critical token: the test would not see a wrong mass";
  }
  EXPECT_GT(want.second[2], 0);
  if (c.cold_threshold > 0.0f || c.bytes_per_token > 0) {
    EXPECT_GT(want.second[3], 0) << "no cold token: the test would not see the int2 tier";
  } else {
    EXPECT_EQ(want.second[3], 0);
  }
  std::mt19937 gen(5);
  for (int trial = 0; trial < 6; ++trial) {
    std::vector<std::pair<int, int>> plan;
    for (int pos = 0; pos < kTotal;) {
      const int room = 8 - pos % 8;  // rows left before the next boundary
      const int rows = 1 + static_cast<int>(gen() % room);
      const int n = trial % 2 == 0 ? rows : 1 + static_cast<int>(gen() % rows);
      plan.push_back({std::min(n, kTotal - pos), trial % 2 == 0 ? 0 : rows - n});
      pos += plan.back().first;
    }
    // Trials 3..5 on threads: a pass's rows are then split between them (ForEachPassHead).
    ThreadPool pool(3);
    const auto got = run(plan, trial >= 3 ? &pool : nullptr);
    EXPECT_EQ(got.second, want.second) << "trial " << trial;
    for (size_t i = 0; i < want.first.size(); ++i) {
      ASSERT_EQ(got.first[i], want.first[i])
          << "trial " << trial << " position " << i / (c.n_layers * qrow);
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Policies, MixedDemotion,
                         ::testing::Values(std::make_pair(0.0f, 0.0), std::make_pair(0.9f, 0.0),
                                           std::make_pair(0.0f, 0.65)),
                         [](const auto& info) {
                           return info.param.second > 0
                                      ? "budget"
                                      : (info.param.first > 0 ? "cold" : "thresholds");
                         });

// kv.bytes_per_token: once the sinks, the window and the next block fit beside the rest at
// int2, the sequence's rows never exceed budget x length (at any length, not only at
// boundaries), and the budget is spent: tokens by mass in every class, not all at int2.
TEST(KvStore, ByteBudgetIsNeverExceededOnceItCanHold) {
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  c.demote_every = 8;
  c.window_tokens = 8;
  std::array<int64_t, kNumKvPrecisions> slot{};  // a token's rows in each class
  for (int k = 0; k < kNumKvPrecisions; ++k) {
    slot[k] = int64_t{c.n_layers} * c.n_kv_heads *
              static_cast<int64_t>(KvPairBytes(static_cast<KvPrecision>(k), c.head_dim));
  }
  c.bytes_per_token = slot[0] * 9 / 20;  // 2.2x below f16
  auto store = Make(c);
  std::mt19937 gen(21);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int hd = c.head_dim, n_heads = c.n_kv_heads * c.gqa_group;
  const size_t row = static_cast<size_t>(c.n_kv_heads) * hd;
  int64_t first_held = -1;
  for (int pos = 0; pos < 400; ++pos) {
    ASSERT_TRUE(store->Reserve(1, 1).ok());
    const KvPassEntry e{1, pos, 1};
    ASSERT_TRUE(store->BeginPass({&e, 1}, nullptr).ok());
    for (int l = 0; l < c.n_layers; ++l) {
      std::vector<float> k(row), v(row), q(static_cast<size_t>(n_heads) * hd), out(q.size());
      for (float& x : k) x = dist(gen) * (pos % 11 == 0 ? 2.0f : 1.0f);  // some stand out
      for (float& x : v) x = dist(gen);
      for (float& x : q) x = dist(gen);
      ASSERT_TRUE(store->Write(l, k.data(), v.data()).ok());
      ASSERT_TRUE(store->Attend(l, q.data(), 0.5f, 0, out.data()).ok());
    }
    store->Commit(1, pos + 1);
    SettleNow(*store, 1);
    const auto t = store->SequenceTokens(1);
    int64_t bytes = 0;
    for (int k = 0; k < kNumKvPrecisions; ++k) bytes += t[k] * slot[k];
    const int64_t length = pos + 1;
    const int64_t pages = store->Usage().used_bytes;  // rows plus partly filled pages
    if (first_held < 0 && pages <= c.bytes_per_token * length && t[3] > 0) first_held = length;
    if (first_held >= 0) {
      ASSERT_LE(bytes, c.bytes_per_token * length) << "length " << length;
      ASSERT_LE(pages, c.bytes_per_token * length) << "length " << length;
    }
  }
  // Feasible from ~190 tokens (24 f16 slots and the classes' page tails beside the rest in
  // the cold class): held from the boundary after that on.
  EXPECT_GT(first_held, 0);
  EXPECT_LE(first_held, 216);
  const auto t = store->SequenceTokens(1);
  EXPECT_GT(t[1] + t[2], 0) << "the budget's room went unused";
  EXPECT_GT(t[3], 0);
}

// One layer, one kv head, 40 tokens decoded one at a time, every query all ones and each
// value row 0.5: key(pos, d) decides where the attention goes. Returns the settled store.
std::unique_ptr<KvStore> DecodeOneHead(KvStoreConfig c, float (*key)(int pos, int d)) {
  c.n_layers = 1;
  c.n_kv_heads = 1;
  c.gqa_group = 1;
  auto store = Make(c);
  const int hd = c.head_dim;
  std::vector<float> k(hd), v(hd, 0.5f), q(hd, 1.0f), out(hd);
  for (int pos = 0; pos < 40; ++pos) {
    EXPECT_TRUE(store->Reserve(1, 1).ok());
    for (int d = 0; d < hd; ++d) k[d] = key(pos, d);
    const KvPassEntry e{1, pos, 1};
    EXPECT_TRUE(store->BeginPass({&e, 1}, nullptr).ok());
    EXPECT_TRUE(store->Write(0, k.data(), v.data()).ok());
    EXPECT_TRUE(store->Attend(0, q.data(), 0.25f, 0, out.data()).ok());
    store->Commit(1, pos + 1);
  }
  SettleNow(*store, 1);
  return store;
}

TEST(KvStore, CriticalTokensGoToInt8) {
  // A key aligned with every query gets most of the attention mass: it must be kept INT8.
  auto store = DecodeOneHead(SmallConfig(KvMode::kMixed), [](int pos, int d) {
    return pos == 5 ? 3.0f : 0.01f * ((pos * 7 + d) % 5 - 2);
  });
  auto t = store->SequenceTokens(1);
  EXPECT_EQ(t[1], 1) << "only position 5 is critical";
}

// A key every query looks away from receives almost no attention: with the cold tier on it
// goes to INT2, the ordinary tokens to INT4, and the one every query looks at to INT8.
TEST(KvStore, ColdTokensGoToInt2) {
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  c.cold_threshold = 0.5f;
  auto store = DecodeOneHead(c, [](int pos, int d) {
    return pos == 5 ? 0.5f : (pos == 7 ? -0.5f : 0.01f * ((pos * 7 + d) % 5 - 2));
  });
  auto t = store->SequenceTokens(1);
  EXPECT_EQ(t[1], 1) << "only position 5 is critical";
  EXPECT_EQ(t[3], 1) << "only position 7 is cold";
  EXPECT_GT(t[2], 0);
  KvUsage u = store->Usage();
  EXPECT_GT(u.bytes[3], 0);
}

// kv.budget_rank recency (the recency tiers kv-eval compares against): within the demoted
// range a newer token is never stored less precisely than an older one.
TEST(KvStore, RecencyRankedBudgetKeepsNewerTokensMorePrecise) {
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  c.demote_every = 8;
  c.window_tokens = 8;
  c.bytes_per_token = int64_t{c.n_layers} * c.n_kv_heads * 2 * 2 * c.head_dim * 2 / 5;  // f16 / 2.5
  c.budget_rank = KvBudgetRank::kRecency;
  auto store = Make(c);
  std::mt19937 gen(4);
  for (int i = 0; i < 40; ++i) ASSERT_TRUE(Feed(*store, c, 1, 8, gen).ok());
  SettleNow(*store, 1);
  const int32_t demoted = store->Length(1) - c.window_tokens;
  int prev = static_cast<int>(KvPrecision::kInt2);
  std::array<int, kNumKvPrecisions> seen{};
  for (int32_t p = c.sink_tokens; p < demoted; ++p) {
    const auto cls = store->PositionClass(1, p);
    ASSERT_TRUE(cls.has_value()) << p;
    const int k = static_cast<int>(*cls);
    EXPECT_LE(k, prev) << "position " << p << " is less precise than an older one";
    prev = k;
    ++seen[k];
  }
  EXPECT_GT(seen[3], 0);
  EXPECT_GT(seen[2] + seen[1], 0);
  EXPECT_EQ(store->PositionClass(1, store->Length(1) - 1), KvPrecision::kFull);
  EXPECT_EQ(store->PositionClass(1, store->Length(1)), std::nullopt);
}

// A cold threshold above the critical one would make a token both: refused where read.
TEST(KvStore, ColdThresholdAboveCriticalIsRefused) {
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  c.critical_threshold = 2.0f;
  c.cold_threshold = 3.0f;
  auto s = MakeHostKvStore(c);
  ASSERT_FALSE(s.ok());
  EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(std::string(s.status().message()).find("cold_threshold"), std::string::npos);
}

TEST(KvStore, ReserveFailureChangesNothing) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  auto probe = Make(c);
  const int64_t page = probe->BytesForTokens(1) / 2;  // one full page
  c.capacity_bytes = 3 * page;
  auto store = Make(c);
  std::mt19937 gen(5);
  ASSERT_TRUE(Feed(*store, c, 1, 16, gen).ok());  // two pages
  const KvUsage before = store->Usage();
  const auto q_before = Query(*store, c, 1, 9);
  absl::Status s = Feed(*store, c, 2, 16, gen);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(store->Length(2), 0);
  EXPECT_EQ(store->Usage().used_bytes, before.used_bytes);
  EXPECT_EQ(Query(*store, c, 1, 9), q_before);
  EXPECT_FALSE(MakeHostKvStore([&] {
                 KvStoreConfig bad = c;
                 bad.capacity_bytes = page;
                 return bad;
               }())
                   .ok());
}

TEST(KvStore, SwapRoundTripIsBitExact) {
  for (KvMode mode : {KvMode::kFull, KvMode::kMixed, KvMode::kInt4}) {
    KvStoreConfig c = SmallConfig(mode);
    auto store = Make(c);
    std::mt19937 gen(8);
    ASSERT_TRUE(Feed(*store, c, 1, 37, gen).ok());
    for (int i = 0; i < 5; ++i) ASSERT_TRUE(Feed(*store, c, 1, 1, gen).ok());
    SettleNow(*store, 1);  // SwapOut settles first; compare with the settled view
    const auto before = Query(*store, c, 1, 4);
    const auto tokens = store->SequenceTokens(1);
    const int64_t used = store->Usage().used_bytes;
    ASSERT_TRUE(store->SwapOut(1).ok());
    EXPECT_TRUE(store->IsSwapped(1));
    EXPECT_EQ(store->Usage().used_bytes, 0);
    EXPECT_GT(store->Usage().host_bytes, 0);
    EXPECT_EQ(store->Reserve(1, 1).code(), absl::StatusCode::kFailedPrecondition);
    ASSERT_TRUE(store->SwapIn(1).ok());
    EXPECT_EQ(store->Usage().host_bytes, 0);
    EXPECT_EQ(store->SequenceTokens(1), tokens);
    EXPECT_LE(store->Usage().used_bytes, used);
    EXPECT_EQ(Query(*store, c, 1, 4), before) << KvModeName(mode);
  }
}

// Rollback is exact at full precision. (In mixed mode a rejected speculative step may
// already have demoted a few tokens early and added attention-mass observations; the
// policy is a heuristic, so that is allowed.)
TEST(KvStore, TruncateThenRegrowMatchesFreshSequence) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  auto store = Make(c);
  std::mt19937 a(21), b(21), junk(99);
  ASSERT_TRUE(Feed(*store, c, 1, 30, a).ok());
  ASSERT_TRUE(Feed(*store, c, 2, 30, b).ok());
  ASSERT_TRUE(Feed(*store, c, 1, 4, junk).ok());  // speculative tokens, then rejected
  ASSERT_TRUE(store->Truncate(1, 30).ok());
  EXPECT_FALSE(store->Truncate(1, 31).ok());
  ASSERT_TRUE(Feed(*store, c, 1, 3, a).ok());
  ASSERT_TRUE(Feed(*store, c, 2, 3, b).ok());
  EXPECT_EQ(Query(*store, c, 1, 2), Query(*store, c, 2, 2));
}

TEST(KvStore, ForkSharesPagesAndDivergesSafely) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  auto store = Make(c);
  std::mt19937 gen(2);
  ASSERT_TRUE(Feed(*store, c, 1, 20, gen).ok());
  const int64_t used = store->Usage().used_bytes;
  ASSERT_TRUE(store->Fork(1, 2).ok());
  EXPECT_EQ(store->Usage().used_bytes, used);  // shared, not copied
  EXPECT_EQ(Query(*store, c, 2, 6), Query(*store, c, 1, 6));
  const auto parent_before = Query(*store, c, 1, 6);
  std::mt19937 other(50);
  ASSERT_TRUE(Feed(*store, c, 2, 9, other).ok());
  ASSERT_TRUE(store->Truncate(2, 15).ok());
  EXPECT_EQ(Query(*store, c, 1, 6), parent_before);
  store->Free(1);
  EXPECT_EQ(store->Length(2), 15);
  EXPECT_EQ(store->Fork(2, 2).code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(store->Fork(7, 8).code(), absl::StatusCode::kNotFound);
  store->Free(2);
  EXPECT_EQ(store->Usage().used_bytes, 0);
}

TEST(KvStore, PrefixCacheReusesWholeBlocks) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  auto store = Make(c);
  std::vector<int32_t> tokens(21);
  for (int i = 0; i < 21; ++i) tokens[i] = 100 + i;
  std::mt19937 gen(4);
  std::vector<float> kv;
  ASSERT_TRUE(Feed(*store, c, 1, 21, gen, &kv).ok());
  store->PublishPrefix(1, tokens);
  EXPECT_EQ(store->Usage().cached_prefix_pages, 2);
  EXPECT_EQ(store->MatchPrefix(2, tokens), 16);
  EXPECT_EQ(store->Length(2), 16);
  std::vector<int32_t> other = tokens;
  other[9] = 7;
  EXPECT_EQ(store->MatchPrefix(3, other), 8);  // diverges inside the second block
  store->Free(1);
  store->Free(2);
  store->Free(3);
  // Cache-only pages are evicted when a reservation needs the room.
  const int64_t page = store->BytesForTokens(1) / 2;
  KvStoreConfig small = c;
  small.capacity_bytes = 3 * page;
  auto tight = Make(small);
  std::mt19937 g2(4);
  ASSERT_TRUE(Feed(*tight, small, 1, 16, g2).ok());
  tight->PublishPrefix(1, std::span<const int32_t>(tokens).subspan(0, 16));
  tight->Free(1);
  EXPECT_EQ(tight->Usage().cached_prefix_pages, 2);
  ASSERT_TRUE(Feed(*tight, small, 5, 20, g2).ok());
  EXPECT_LT(tight->Usage().cached_prefix_pages, 2);
}

TEST(KvStore, SlidingWindowEvictionIsOptIn) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  c.evict = true;
  c.evict_window = 16;
  auto store = Make(c);
  std::mt19937 gen(1);
  ASSERT_TRUE(Feed(*store, c, 1, 40, gen).ok());
  SettleNow(*store, 1);
  auto t = store->SequenceTokens(1);
  EXPECT_EQ(t[0], c.sink_tokens + 16);
  EXPECT_EQ(store->Usage().evicted_tokens, 40 - 16 - c.sink_tokens);
  EXPECT_EQ(Query(*store, c, 1, 3).size(), size_t(c.n_layers * c.n_kv_heads * c.gqa_group * c.head_dim));
}

TEST(KvStore, ForwardPassWithFullPrecisionStoreMatchesDenseCache) {
  TinyModelOptions o;
  o.n_layers = 2;
  const std::string path = testing_support::TempFilePath("kvstore_fwd");
  ASSERT_TRUE(WriteTinyModel(o, path).ok());
  auto m = LlamaModel::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const LlamaConfig& mc = (*m)->config();
  ThreadPool pool(2);
  CpuLlamaForward fwd(mc, (*m)->weights(), &pool);
  KvStoreConfig c;
  c.n_layers = mc.n_layers;
  c.n_kv_heads = mc.n_kv_heads;
  c.head_dim = mc.head_dim;
  c.gqa_group = mc.gqa_group();
  c.max_seq_len = mc.context_length;
  c.capacity_bytes = 16 << 20;
  c.mode = KvMode::kFull;
  auto store = Make(c);
  DenseKvCache dense(mc.n_layers, mc.n_kv_heads, mc.head_dim, mc.gqa_group(), mc.context_length,
                     1 << 16);
  std::vector<int32_t> toks(24);
  for (int i = 0; i < 24; ++i) toks[i] = (i * 13 + 5) % 200 + 3;
  std::vector<float> a, b;
  BatchEntry e{1, toks, true};
  ASSERT_TRUE(fwd.Forward({&e, 1}, store.get(), &a).ok());
  ASSERT_TRUE(fwd.Forward({&e, 1}, &dense, &b).ok());
  ASSERT_EQ(a.size(), b.size());
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    max_diff = std::max(max_diff, std::abs(double(a[i]) - b[i]));
    max_abs = std::max(max_abs, std::abs(double(b[i])));
  }
  EXPECT_LT(max_diff, 1e-2 * max_abs);  // f16 K/V rounding
}

}  // namespace
}  // namespace specnode
