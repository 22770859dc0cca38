// Randomised property test: thousands of append / attend / truncate / fork / free /
// swap operations on a store with tight capacity. After every operation the byte
// accounting must hold, capacity must never be exceeded, a failed reservation must change
// nothing, swapped sequences must come back bit-exact, and (full-precision mode) every
// sequence's attention must match a dense cache rebuilt from its token history.
#include <map>
#include <random>

#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/kv_store.h"
#include "model/llama/dense_kv_cache.h"
#include "tests/kvstore/kv_store_test_util.h"

namespace specnode {
namespace {

using kvtest::Feed;
using kvtest::Query;
using kvtest::SettleNow;
using kvtest::SmallConfig;

// Per sequence: K/V of each position, [layer][K row | V row] (rows of n_kv*head_dim).
using History = std::vector<std::vector<float>>;

void AppendHistory(const KvStoreConfig& c, int n, const std::vector<float>& kv, History* h) {
  const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  for (int i = 0; i < n; ++i) {
    std::vector<float> pos;
    for (int l = 0; l < c.n_layers; ++l) {
      const float* k = kv.data() + l * 2 * n * row + i * row;
      const float* v = k + n * row;
      pos.insert(pos.end(), k, k + row);
      pos.insert(pos.end(), v, v + row);
    }
    h->push_back(std::move(pos));
  }
}

std::vector<float> DenseQuery(const KvStoreConfig& c, const History& h, uint32_t seed) {
  DenseKvCache dense(c.n_layers, c.n_kv_heads, c.head_dim, c.gqa_group, c.max_seq_len, 1 << 20);
  const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  EXPECT_TRUE(dense.Reserve(0, static_cast<int32_t>(h.size())).ok());
  for (size_t p = 0; p < h.size(); ++p) {
    for (int l = 0; l < c.n_layers; ++l) {
      const float* k = h[p].data() + l * 2 * row;
      dense.WriteSeq(0, l, static_cast<int32_t>(p), 1, k, k + row);
    }
  }
  dense.Commit(0, static_cast<int32_t>(h.size()));
  return Query(dense, c, 0, seed);
}

void CheckAccounting(const KvStore& store, const std::map<SeqId, History>& seqs) {
  const KvUsage u = store.Usage();
  ASSERT_LE(u.used_bytes, u.capacity_bytes);
  ASSERT_EQ(u.used_bytes, u.bytes[0] + u.bytes[1] + u.bytes[2] + u.bytes[3]);
  ASSERT_LE(u.host_bytes, store.config().host_capacity_bytes);
  for (const auto& [id, h] : seqs) {
    auto t = store.SequenceTokens(id);
    ASSERT_EQ(t[0] + t[1] + t[2] + t[3], static_cast<int64_t>(h.size())) << "seq " << id;
    ASSERT_EQ(store.Length(id), static_cast<int32_t>(h.size()));
  }
}

// (mode, cold threshold): mixed runs with and without the INT2 cold tier.
class PropertyTest : public ::testing::TestWithParam<std::pair<KvMode, float>> {
 protected:
  KvMode mode() const { return GetParam().first; }
};

TEST_P(PropertyTest, RandomOperationsKeepInvariants) {
  KvStoreConfig c = SmallConfig(mode());
  c.cold_threshold = GetParam().second;
  auto probe = MakeHostKvStore(c);
  ASSERT_TRUE(probe.ok());
  const int64_t page = (*probe)->BytesForTokens(1) / 2;
  c.capacity_bytes = 14 * page;
  c.host_capacity_bytes = 12 * page;
  auto created = MakeHostKvStore(c);
  ASSERT_TRUE(created.ok());
  KvStore& store = **created;
  std::mt19937 gen(mode() == KvMode::kFull ? 1234 : 4321);
  std::map<SeqId, History> seqs;
  std::map<SeqId, std::vector<float>> swapped_witness;
  SeqId next_id = 1;
  int exhausted = 0, swaps = 0, forks = 0;
  auto pick = [&]() -> SeqId {
    auto it = seqs.begin();
    std::advance(it, gen() % seqs.size());
    return it->first;
  };
  for (int op = 0; op < 3000; ++op) {
    const int kind = seqs.empty() ? 0 : static_cast<int>(gen() % 10);
    if (kind <= 4) {  // append to a live or new sequence
      SeqId id = (seqs.size() < 5 && gen() % 4 == 0) || seqs.empty() ? next_id++ : pick();
      if (swapped_witness.count(id)) continue;
      const int n = 1 + static_cast<int>(gen() % (gen() % 5 == 0 ? 24 : 3));
      // Reserve settles the previous commit before reserving (kept if the reservation then
      // fails): compare a failed reservation with the settled state.
      SettleNow(store, id);
      const KvUsage before = store.Usage();
      std::vector<float> kv;
      absl::Status s = Feed(store, c, id, n, gen, &kv);
      if (!s.ok()) {
        ASSERT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
        ASSERT_EQ(store.Usage().used_bytes, before.used_bytes);
        ++exhausted;
        // Preempt another sequence: swap it out, or drop it when the host tier is full.
        for (auto& [victim, h] : seqs) {
          if (victim == id || swapped_witness.count(victim) || h.empty()) continue;
          SettleNow(store, victim);  // as the next step's Reserve would: the witness's view
          auto w = Query(store, c, victim, 77);
          if (store.SwapOut(victim).ok()) {
            swapped_witness[victim] = w;
            ++swaps;
          } else {
            store.Free(victim);
            h.clear();
          }
          break;
        }
      } else {
        AppendHistory(c, n, kv, &seqs[id]);
      }
    } else if (kind == 5) {  // truncate (speculative rollback)
      SeqId id = pick();
      if (swapped_witness.count(id) || seqs[id].empty()) continue;
      const int32_t n = static_cast<int32_t>(gen() % (seqs[id].size() + 1));
      ASSERT_TRUE(store.Truncate(id, n).ok());
      seqs[id].resize(n);
    } else if (kind == 6) {  // fork
      SeqId id = pick();
      if (swapped_witness.count(id) || seqs[id].empty()) continue;
      const SeqId dst = next_id++;
      ASSERT_TRUE(store.Fork(id, dst).ok());
      seqs[dst] = seqs[id];
      ASSERT_EQ(Query(store, c, dst, 5), Query(store, c, id, 5));
      ++forks;
    } else if (kind == 7) {  // free
      SeqId id = pick();
      store.Free(id);
      seqs.erase(id);
      swapped_witness.erase(id);
    } else if (kind == 8) {  // swap in, checking bit-exact contents
      for (auto& [id, w] : swapped_witness) {
        if (store.SwapIn(id).ok()) {
          ASSERT_EQ(Query(store, c, id, 77), w) << "seq " << id << " changed across swap";
          swapped_witness.erase(id);
          break;
        }
      }
    } else if (!seqs.empty()) {  // attention check against the dense history
      SeqId id = pick();
      if (swapped_witness.count(id) || seqs[id].empty()) continue;
      if (mode() == KvMode::kFull) {
        auto got = Query(store, c, id, static_cast<uint32_t>(op));
        auto want = DenseQuery(c, seqs[id], static_cast<uint32_t>(op));
        for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 2e-3) << op;
      }
    }
    // Sequences dropped for recompute have empty histories and no store state.
    for (auto it = seqs.begin(); it != seqs.end();) {
      it = it->second.empty() && store.Length(it->first) == 0 && !swapped_witness.count(it->first)
               ? (store.Free(it->first), seqs.erase(it))
               : std::next(it);
    }
    CheckAccounting(store, seqs);
  }
  EXPECT_GT(exhausted, 10) << "capacity was never tight";
  EXPECT_GT(swaps, 3);
  EXPECT_GT(forks, 10);
  for (auto& [id, h] : seqs) store.Free(id);
  EXPECT_EQ(store.Usage().used_bytes, 0);
  EXPECT_EQ(store.Usage().host_bytes, 0);
}

INSTANTIATE_TEST_SUITE_P(
    Modes, PropertyTest,
    ::testing::Values(std::make_pair(KvMode::kFull, 0.0f), std::make_pair(KvMode::kMixed, 0.0f),
                      std::make_pair(KvMode::kMixed, 1.0f), std::make_pair(KvMode::kInt4, 0.0f),
                      std::make_pair(KvMode::kInt2, 0.0f)),
    [](const auto& info) {
      return std::string(KvModeName(info.param.first)) + (info.param.second > 0 ? "_cold" : "");
    });

}  // namespace
}  // namespace specnode
