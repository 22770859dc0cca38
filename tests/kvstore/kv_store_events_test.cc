// The KV manager's prefix-cache events (model/llama/kv_cache_events.h): which blocks a
// PublishPrefix reports and with what chaining, what an eviction reports, and that hashes
// of equal prefixes are equal across stores and sequences.
#include <random>
#include <set>
#include <span>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/kv_store.h"
#include "model/llama/dense_kv_cache.h"
#include "tests/kvstore/kv_store_test_util.h"

namespace specnode {
namespace {

using kvtest::Feed;
using kvtest::SmallConfig;
using ::testing::ElementsAreArray;

class Recorder : public KvCacheEventListener {
 public:
  void OnKvCacheEvent(KvCacheEvent e) override { events.push_back(std::move(e)); }
  std::vector<KvCacheEvent> events;
};

std::unique_ptr<KvStore> Make(const KvStoreConfig& c) {
  auto s = MakeHostKvStore(c);
  EXPECT_TRUE(s.ok()) << s.status();
  return std::move(s).value();
}

std::vector<int32_t> Tokens(int n, int base) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = base + i;
  return t;
}

TEST(KvStoreEvents, PublishReportsEachNewRunOnceChainedToItsParent) {
  const KvStoreConfig c = SmallConfig(KvMode::kFull);  // 8-token pages
  auto store = Make(c);
  Recorder rec;
  ASSERT_TRUE(store->SetEventListener(&rec).ok());
  std::mt19937 gen(1);
  const std::vector<int32_t> a = Tokens(21, 100);  // 2 whole blocks + 5 tokens
  ASSERT_TRUE(Feed(*store, c, 1, 21, gen).ok());
  store->PublishPrefix(1, a);
  ASSERT_EQ(rec.events.size(), 1u);
  const KvCacheEvent first = rec.events[0];  // a copy: rec.events grows
  EXPECT_EQ(first.kind, KvCacheEvent::Kind::kBlockStored);
  ASSERT_EQ(first.block_hashes.size(), 2u);
  EXPECT_FALSE(first.parent_block_hash.has_value());  // starts at token 0
  EXPECT_EQ(first.block_size, 8);
  EXPECT_THAT(first.token_ids, ElementsAreArray(a.begin(), a.begin() + 16));
  EXPECT_EQ(first.medium, "CPU");
  for (uint64_t h : first.block_hashes) EXPECT_EQ(h >> 63, 0u);  // 63-bit
  // Publishing again adds nothing, so reports nothing.
  store->PublishPrefix(1, a);
  EXPECT_EQ(rec.events.size(), 1u);

  // A second sequence sharing the first block (then diverging) reports only its new
  // blocks, chained to the shared one.
  std::vector<int32_t> b = a;
  b.resize(32);
  for (int i = 8; i < 32; ++i) b[i] = 5000 + i;
  ASSERT_TRUE(Feed(*store, c, 2, 32, gen).ok());
  store->PublishPrefix(2, b);
  ASSERT_EQ(rec.events.size(), 2u);
  const KvCacheEvent second = rec.events[1];
  ASSERT_EQ(second.block_hashes.size(), 3u);  // blocks 1..3 (block 0 was cached)
  ASSERT_TRUE(second.parent_block_hash.has_value());
  EXPECT_EQ(*second.parent_block_hash, first.block_hashes[0]);
  EXPECT_THAT(second.token_ids, ElementsAreArray(b.begin() + 8, b.end()));
  EXPECT_NE(second.block_hashes[0], first.block_hashes[1]);  // different tokens, other hash

  // A third sequence equal to `a` for three blocks: blocks 0-1 cached, block 2 new, parent
  // block 1 — the hash chain is a function of the tokens alone.
  std::vector<int32_t> d = Tokens(24, 100);
  ASSERT_TRUE(Feed(*store, c, 3, 24, gen).ok());
  store->PublishPrefix(3, d);
  ASSERT_EQ(rec.events.size(), 3u);
  EXPECT_EQ(*rec.events[2].parent_block_hash, first.block_hashes[1]);
  EXPECT_EQ(rec.events[2].block_hashes.size(), 1u);

  // The same tokens in another store hash the same (routers compare hashes across nodes).
  auto other = Make(c);
  Recorder rec2;
  ASSERT_TRUE(other->SetEventListener(&rec2).ok());
  ASSERT_TRUE(Feed(*other, c, 9, 21, gen).ok());
  other->PublishPrefix(9, a);
  ASSERT_EQ(rec2.events.size(), 1u);
  EXPECT_EQ(rec2.events[0].block_hashes, first.block_hashes);
}

TEST(KvStoreEvents, EvictionReportsTheRemovedBlocks) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  auto probe = Make(c);
  const int64_t page = probe->BytesForTokens(1) / 2;  // as PrefixCacheReusesWholeBlocks
  c.capacity_bytes = 4 * page;
  auto store = Make(c);
  Recorder rec;
  ASSERT_TRUE(store->SetEventListener(&rec).ok());
  std::mt19937 gen(2);
  ASSERT_TRUE(Feed(*store, c, 1, 16, gen).ok());
  store->PublishPrefix(1, Tokens(16, 7));
  store->Free(1);  // the two pages stay, cache-only
  ASSERT_EQ(rec.events.size(), 1u);
  const std::vector<uint64_t> stored = rec.events[0].block_hashes;
  // Needing all four pages evicts both cached blocks, least recently used first.
  ASSERT_TRUE(Feed(*store, c, 2, 32, gen).ok());
  ASSERT_GE(rec.events.size(), 2u);
  std::set<uint64_t> removed;
  for (size_t i = 1; i < rec.events.size(); ++i) {
    EXPECT_EQ(rec.events[i].kind, KvCacheEvent::Kind::kBlockRemoved);
    EXPECT_EQ(rec.events[i].medium, "CPU");
    removed.insert(rec.events[i].block_hashes.begin(), rec.events[i].block_hashes.end());
  }
  EXPECT_EQ(removed, std::set<uint64_t>(stored.begin(), stored.end()));
  EXPECT_EQ(store->Usage().cached_prefix_pages, 0);
}

TEST(KvStoreEvents, NoListenerNoEventsAndDetachStops) {
  const KvStoreConfig c = SmallConfig(KvMode::kFull);
  auto store = Make(c);
  std::mt19937 gen(3);
  ASSERT_TRUE(Feed(*store, c, 1, 16, gen).ok());
  store->PublishPrefix(1, Tokens(16, 1));  // no listener: nothing to call
  Recorder rec;
  ASSERT_TRUE(store->SetEventListener(&rec).ok());
  ASSERT_TRUE(store->SetEventListener(nullptr).ok());
  ASSERT_TRUE(Feed(*store, c, 2, 16, gen).ok());
  store->PublishPrefix(2, Tokens(16, 50));
  EXPECT_TRUE(rec.events.empty());
  EXPECT_EQ(store->Usage().cached_prefix_pages, 4);
}

TEST(KvStoreEvents, DemotedPagesAreNotPublished) {
  // Mixed mode demotes old tokens to INT8/INT4 pages: the run stops at the first block that
  // is not a whole full-precision page, and no event names it.
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  auto store = Make(c);
  Recorder rec;
  ASSERT_TRUE(store->SetEventListener(&rec).ok());
  std::mt19937 gen(5);
  ASSERT_TRUE(Feed(*store, c, 1, 40, gen).ok());
  kvtest::SettleNow(*store, 1);  // demotes what lies beyond the window
  store->PublishPrefix(1, Tokens(40, 3));
  for (const KvCacheEvent& e : rec.events) {
    EXPECT_EQ(e.kind, KvCacheEvent::Kind::kBlockStored);
    EXPECT_LT(e.block_hashes.size(), 5u);
  }
  EXPECT_EQ(store->Usage().cached_prefix_pages,
            rec.events.empty() ? 0 : static_cast<int64_t>(rec.events[0].block_hashes.size()));
}

TEST(KvStoreEvents, MixedModeKeepsBlocksPublishedBeforeTheirDemotion) {
  // The engine publishes a prompt after each prefill chunk: blocks cached while still full
  // precision stay cached (and matchable) after the sequence's own tokens are demoted, and
  // a later publish goes on through them.
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  auto store = Make(c);
  Recorder rec;
  ASSERT_TRUE(store->SetEventListener(&rec).ok());
  std::mt19937 gen(6);
  const std::vector<int32_t> t = Tokens(48, 11);
  ASSERT_TRUE(Feed(*store, c, 1, 16, gen).ok());
  store->PublishPrefix(1, std::span(t).subspan(0, 16));
  ASSERT_EQ(rec.events.size(), 1u);
  ASSERT_TRUE(Feed(*store, c, 1, 32, gen).ok());  // settles: the first blocks are demoted
  kvtest::SettleNow(*store, 1);
  store->PublishPrefix(1, t);  // blocks 0-1 cached; the rest as far as still full
  for (size_t i = 1; i < rec.events.size(); ++i) {
    EXPECT_EQ(*rec.events[i].parent_block_hash, rec.events[i - 1].block_hashes.back());
  }
  EXPECT_GE(store->MatchPrefix(2, t), 16);
}

TEST(KvStoreEvents, DenseCacheRefusesAListener) {
  // The f32 reference cache keeps no prefix cache: asking for its events is an error that
  // says so, not a listener that would never hear anything.
  DenseKvCache dense(2, 2, 16, 2, 64, 256);
  Recorder rec;
  const absl::Status st = dense.SetEventListener(&rec);
  EXPECT_EQ(st.code(), absl::StatusCode::kUnimplemented);
  EXPECT_THAT(std::string(st.message()), ::testing::HasSubstr("no prefix cache"));
}

}  // namespace
}  // namespace specnode
