// The KV manager's side of the protocol a device page pool relies on (cuda/cuda_page_pool.h),
// checked on the CPU: a pool that behaves as a GPU pool does — attention mass reaches the
// manager's rows only at EndPass, demotions are queued and run only before the next pass, a
// swap, a page release or a second job for the same slot, and the host tier moves only
// through the bulk ReadSlots / WriteSlots — must give the same attention outputs, classes
// and bytes as the CPU pool through a random life in mixed mode (prefill, decode,
// verification-like multi-row passes, rollbacks, swaps, forks, frees).
#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/cpu_page_pool.h"
#include "kvstore/kv_store.h"
#include "tests/kvstore/kv_store_test_util.h"

namespace specnode {
namespace {

using kvtest::SmallConfig;

class DeviceLikePool final : public KvPagePool {
 public:
  explicit DeviceLikePool(const KvPoolGeometry& g) : inner_(g, /*rotate=*/true) {}
  Device device() const override { return Device::Cuda(5); }
  const KvPoolGeometry& geometry() const override { return inner_.geometry(); }
  KvPoolCaps caps() const override { return inner_.caps(); }
  size_t PageBytes(KvPrecision p) const override { return inner_.PageBytes(p); }
  size_t SlotBytes(KvPrecision p) const override { return inner_.SlotBytes(p); }
  int64_t MaxPages() const override { return inner_.MaxPages(); }
  absl::Status AllocatePage(int32_t id, KvPrecision p) override {
    // A device arena can refuse a page the manager's byte budget allows (fragmentation).
    if (refuse_allocations) return absl::ResourceExhaustedError("test-device: arena fragmented");
    return inner_.AllocatePage(id, p);
  }
  void ReleasePage(int32_t id) override {
    Flush();  // the GPU pool's rule: a released frame may serve another page next
    inner_.ReleasePage(id);
  }
  KvPrecision PageClass(int32_t id) const override { return inner_.PageClass(id); }
  void Recode(KvSlot from, KvSlot to) override {
    for (const auto& [f, t] : queue_) {
      if (t.page == to.page && t.slot == to.slot) {
        Flush();
        break;
      }
    }
    queue_.push_back({from, to});
  }
  void ReadSlot(KvSlot, uint8_t*) const override { ADD_FAILURE() << "single-slot ReadSlot"; }
  void WriteSlot(KvSlot, const uint8_t*) override { ADD_FAILURE() << "single-slot WriteSlot"; }
  absl::Status ReadSlots(std::span<const KvSlot> slots, uint8_t* host) override {
    Flush();
    ++bulk_copies;
    for (const KvSlot& s : slots) {
      inner_.ReadSlot(s, host);
      host += SlotBytes(PageClass(s.page));
    }
    return absl::OkStatus();
  }
  absl::Status WriteSlots(std::span<const KvSlot> slots, const uint8_t* host) override {
    Flush();
    ++bulk_copies;
    for (const KvSlot& s : slots) {
      inner_.WriteSlot(s, host);
      host += SlotBytes(PageClass(s.page));
    }
    return absl::OkStatus();
  }
  absl::Status BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool* threads) override {
    EXPECT_FALSE(open_) << "BeginPass before the previous pass's EndPass";
    Flush();
    // The inner pool observes into shadow rows; the manager's rows get them at EndPass.
    pass_.assign(seqs.begin(), seqs.end());
    shadow_rows_.assign(seqs.size(), {});
    shadow_.clear();
    real_.clear();
    for (size_t i = 0; i < pass_.size(); ++i) {
      for (const KvMassRow& r : pass_[i].mass.rows) {
        const size_t n = static_cast<size_t>(geometry().n_kv_heads) *
                         (r.pos + 1 - pass_[i].mass.min_distance - r.lo);
        shadow_.push_back(std::make_unique<std::vector<float>>(2 * n, 0.0f));
        real_.push_back({r, n});
        // The manager's row starts at zero and must not be read before EndPass: poison
        // it, so that a read (a Settle before EndPass) turns that token's mass into NaN
        // and its class away from the CPU store's.
        std::fill(r.sum, r.sum + n, std::nanf(""));
        KvMassRow s = r;
        s.sum = shadow_.back()->data();
        s.cnt = shadow_.back()->data() + n;
        shadow_rows_[i].push_back(s);
      }
      pass_[i].mass.rows = shadow_rows_[i];
    }
    open_ = true;
    return inner_.BeginPass(pass_, threads);
  }
  absl::Status Write(int layer, const float* k, const float* v) override {
    return inner_.Write(layer, k, v);
  }
  absl::Status Attend(int layer, const float* q, float scale, int32_t window, float* out) override {
    return inner_.Attend(layer, q, scale, window, out);
  }
  absl::Status EndPass() override {
    EXPECT_TRUE(open_) << "EndPass without a pass";
    open_ = false;
    for (size_t r = 0; r < real_.size(); ++r) {
      const float* s = shadow_[r]->data();
      for (size_t j = 0; j < real_[r].n; ++j) {
        real_[r].row.sum[j] = s[j];  // was 0 (poisoned meanwhile)
        real_[r].row.cnt[j] += s[real_[r].n + j];
      }
    }
    real_.clear();
    ++end_passes;
    return absl::OkStatus();
  }

  bool refuse_allocations = false;
  int end_passes = 0;
  int bulk_copies = 0;
  int64_t recoded = 0;

 private:
  void Flush() {
    for (const auto& [from, to] : queue_) inner_.Recode(from, to);
    recoded += static_cast<int64_t>(queue_.size());
    queue_.clear();
  }
  struct RealRow {
    KvMassRow row;
    size_t n;
  };
  CpuPagePool inner_;
  std::vector<std::pair<KvSlot, KvSlot>> queue_;
  std::vector<KvPoolPassSeq> pass_;
  std::vector<std::vector<KvMassRow>> shadow_rows_;
  std::vector<std::unique_ptr<std::vector<float>>> shadow_;
  std::vector<RealRow> real_;
  bool open_ = false;
};

// n new tokens of seq with random K/V and queries: Reserve, BeginPass, Write + Attend per
// layer, Commit of `keep` of them (a verification pass that rejects the rest), and the
// outputs appended to *out.
absl::Status Step(KvCache& cache, const KvStoreConfig& c, SeqId seq, int n, int keep, uint32_t seed,
                  std::vector<float>* out) {
  const int32_t pos0 = cache.Length(seq);
  if (absl::Status s = cache.Reserve(seq, n); !s.ok()) return s;
  std::mt19937 gen(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t kv = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  std::vector<float> k(n * kv), v(n * kv), q(n * kv * c.gqa_group), o(q.size());
  const KvPassEntry e{seq, pos0, n};
  if (absl::Status s = cache.BeginPass({&e, 1}, nullptr); !s.ok()) return s;
  for (int l = 0; l < c.n_layers; ++l) {
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    // Peaked queries (a few keys get most of the mass) so that some tokens are critical.
    for (float& x : q) x = 3.0f * dist(gen);
    if (absl::Status s = cache.Write(l, k.data(), v.data()); !s.ok()) return s;
    if (absl::Status s = cache.Attend(l, q.data(), 0.25f, 0, o.data()); !s.ok()) return s;
    out->insert(out->end(), o.begin(), o.end());
  }
  cache.Commit(seq, pos0 + n);
  if (keep < n) return cache.Truncate(seq, pos0 + keep);
  return absl::OkStatus();
}

TEST(KvStoreDeviceProtocol, DeferredMassQueuedDemotionAndBulkSwapMatchTheCpuPool) {
  KvStoreConfig c = SmallConfig(KvMode::kMixed);
  c.demote_every = 4;
  c.mass_sample_every = 2;
  const KvPoolGeometry g{c.n_layers, c.n_kv_heads, c.head_dim, c.gqa_group, c.page_tokens};
  auto pool = std::make_unique<DeviceLikePool>(g);
  DeviceLikePool* dev = pool.get();
  auto device = KvStore::Create(c, std::move(pool));
  ASSERT_TRUE(device.ok()) << device.status();
  auto cpu = MakeHostKvStore(c);
  ASSERT_TRUE(cpu.ok()) << cpu.status();
  std::mt19937 rng(17);
  std::map<SeqId, bool> live;
  SeqId next_seq = 1;
  for (int step = 0; step < 400; ++step) {
    const int op = static_cast<int>(rng() % 20);
    // An existing id (1 .. next_seq - 1), or a new one.
    SeqId seq = next_seq > 1 ? 1 + static_cast<SeqId>(rng() % (next_seq - 1)) : 0;
    if (op == 0 || next_seq == 1) seq = next_seq++;
    const bool swapped = (*cpu)->IsSwapped(seq);
    ASSERT_EQ(swapped, (*device)->IsSwapped(seq));
    if (swapped) {
      ASSERT_TRUE((*cpu)->SwapIn(seq).ok());
      ASSERT_TRUE((*device)->SwapIn(seq).ok());
      continue;
    }
    if (op < 14) {
      // Multi-row passes within the boundary (the engine's PassBoundary contract).
      const int32_t len = (*cpu)->Length(seq);
      const int room = c.demote_every - len % c.demote_every;
      const int n = 1 + static_cast<int>(rng() % room);
      const int keep = op < 11 ? n : static_cast<int>(rng() % (n + 1));
      std::vector<float> a, b;
      const uint32_t seed = 1000 + step;
      ASSERT_TRUE(Step(**cpu, c, seq, n, keep, seed, &a).ok());
      ASSERT_TRUE(Step(**device, c, seq, n, keep, seed, &b).ok());
      ASSERT_EQ(a, b) << "step " << step;
      live[seq] = true;
    } else if (op < 16 && live[seq]) {
      ASSERT_TRUE((*cpu)->SwapOut(seq).ok());
      ASSERT_TRUE((*device)->SwapOut(seq).ok());
    } else if (op < 18 && live[seq] && (*cpu)->Length(seq) > 0) {
      const SeqId dst = next_seq++;
      const absl::Status a = (*cpu)->Fork(seq, dst);
      ASSERT_TRUE(a.ok()) << a;
      const absl::Status b = (*device)->Fork(seq, dst);
      ASSERT_TRUE(b.ok()) << b;
      live[dst] = true;
    } else {
      (*cpu)->Free(seq);
      (*device)->Free(seq);
      live[seq] = false;
    }
    ASSERT_EQ((*cpu)->Usage().bytes, (*device)->Usage().bytes) << "step " << step;
    ASSERT_EQ((*cpu)->Usage().tokens, (*device)->Usage().tokens) << "step " << step;
    ASSERT_EQ((*cpu)->Usage().host_bytes, (*device)->Usage().host_bytes) << "step " << step;
  }
  const KvUsage u = (*device)->Usage();
  // The life reached every class and the paths under test.
  EXPECT_GT(u.tokens[1], 0) << "no critical (int8) tokens";
  EXPECT_GT(u.tokens[2], 0) << "no int4 tokens";
  EXPECT_GT(dev->recoded, 0);
  EXPECT_GT(dev->bulk_copies, 0);
  EXPECT_GT(dev->end_passes, 200);
}

// A page the pool refuses although the byte budget had room: Reserve (of a new and of a
// growing sequence) and SwapIn fail with the pool's ResourceExhausted and leave the store
// as it was; once the pool has room again, both work.
TEST(KvStoreDeviceProtocol, APageThePoolRefusesChangesNothing) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  const KvPoolGeometry g{c.n_layers, c.n_kv_heads, c.head_dim, c.gqa_group, c.page_tokens};
  auto pool = std::make_unique<DeviceLikePool>(g);
  DeviceLikePool* dev = pool.get();
  auto store = KvStore::Create(c, std::move(pool));
  ASSERT_TRUE(store.ok()) << store.status();
  std::vector<float> out;
  ASSERT_TRUE(Step(**store, c, 1, c.page_tokens - 2, c.page_tokens - 2, 1, &out).ok());
  const KvUsage before = (*store)->Usage();
  dev->refuse_allocations = true;
  // Growing past the open page (2 slots left there) needs a page: refused, nothing taken.
  absl::Status grow = (*store)->Reserve(1, 5);
  EXPECT_EQ(grow.code(), absl::StatusCode::kResourceExhausted) << grow;
  absl::Status fresh = (*store)->Reserve(2, 3);
  EXPECT_EQ(fresh.code(), absl::StatusCode::kResourceExhausted) << fresh;
  EXPECT_EQ((*store)->Usage().used_bytes, before.used_bytes);
  EXPECT_EQ((*store)->Usage().tokens, before.tokens);
  EXPECT_EQ((*store)->Length(1), c.page_tokens - 2);
  EXPECT_EQ((*store)->Length(2), 0);
  // Swapped out, then in while the pool refuses: still swapped, host copy kept.
  dev->refuse_allocations = false;
  const std::vector<float> q1 = kvtest::Query(**store, c, 1, 9);
  ASSERT_TRUE((*store)->SwapOut(1).ok());
  const int64_t host = (*store)->Usage().host_bytes;
  EXPECT_GT(host, 0);
  dev->refuse_allocations = true;
  absl::Status in = (*store)->SwapIn(1);
  EXPECT_EQ(in.code(), absl::StatusCode::kResourceExhausted) << in;
  EXPECT_TRUE((*store)->IsSwapped(1));
  EXPECT_EQ((*store)->Usage().host_bytes, host);
  EXPECT_EQ((*store)->Usage().used_bytes, 0);
  dev->refuse_allocations = false;
  ASSERT_TRUE((*store)->SwapIn(1).ok());
  EXPECT_EQ(kvtest::Query(**store, c, 1, 9), q1);
  ASSERT_TRUE(Step(**store, c, 1, 5, 5, 2, &out).ok());
  ASSERT_TRUE(Step(**store, c, 2, 3, 3, 3, &out).ok());
}

}  // namespace
}  // namespace specnode
