// The KV manager over a page pool that can do less than the CPU's: the capability checks
// (a mode the pool cannot store is refused at creation, naming the device) and the page
// order a device pool may need (token p in slot p % page_tokens of the sequence's
// (p / page_tokens)-th page, kept through truncation and refill), checked on every pass by
// a pool that forwards to a CpuPagePool and reports a GPU-like set of capabilities.
#include <unistd.h>

#include <map>
#include <random>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/cpu_page_pool.h"
#include "kvstore/kv_store.h"
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
using kvtest::SmallConfig;

// Full precision only, unrotated, no slot copies, page order: what the first CUDA pool
// reported (a device pool without row formats or copies). Every pass's block tables are checked to
// be in page order.
class PageOrderPool final : public KvPagePool {
 public:
  explicit PageOrderPool(const KvPoolGeometry& g) : inner_(g, /*rotate=*/false) {}
  Device device() const override { return Device::Cuda(7); }
  const KvPoolGeometry& geometry() const override { return inner_.geometry(); }
  KvPoolCaps caps() const override {
    KvPoolCaps c;
    c.classes = {true, false, false};
    c.page_order = true;
    return c;
  }
  size_t PageBytes(KvPrecision p) const override { return inner_.PageBytes(p); }
  size_t SlotBytes(KvPrecision p) const override { return inner_.SlotBytes(p); }
  int64_t MaxPages() const override { return max_pages; }
  absl::Status AllocatePage(int32_t id, KvPrecision p) override {
    EXPECT_EQ(p, KvPrecision::kFull);
    return inner_.AllocatePage(id, p);
  }
  void ReleasePage(int32_t id) override { inner_.ReleasePage(id); }
  KvPrecision PageClass(int32_t id) const override { return inner_.PageClass(id); }
  void Recode(KvSlot, KvSlot) override { ADD_FAILURE() << "Recode on a pool without copies"; }
  void ReadSlot(KvSlot, uint8_t*) const override { ADD_FAILURE() << "ReadSlot"; }
  void WriteSlot(KvSlot, const uint8_t*) override { ADD_FAILURE() << "WriteSlot"; }
  absl::Status BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool* threads) override {
    const int P = geometry().page_tokens;
    for (const KvPoolPassSeq& s : seqs) {
      for (size_t p = 0; p < s.slots.size(); ++p) {
        EXPECT_EQ(s.slots[p].slot, static_cast<int32_t>(p % P)) << "seq " << s.seq << " pos " << p;
        if (p % P != 0) {
          EXPECT_EQ(s.slots[p].page, s.slots[p - 1].page) << "seq " << s.seq << " pos " << p;
        }
      }
      ++passes;
    }
    return inner_.BeginPass(seqs, threads);
  }
  absl::Status Write(int layer, const float* k, const float* v) override {
    return inner_.Write(layer, k, v);
  }
  absl::Status Attend(int layer, const float* q, float scale, int32_t window, float* out) override {
    return inner_.Attend(layer, q, scale, window, out);
  }

  int64_t max_pages = int64_t{1} << 20;
  int passes = 0;

 private:
  CpuPagePool inner_;
};

KvPoolGeometry GeometryOf(const KvStoreConfig& c) {
  return {c.n_layers, c.n_kv_heads, c.head_dim, c.gqa_group, c.page_tokens};
}

std::unique_ptr<KvStore> PageOrderStore(const KvStoreConfig& c, PageOrderPool** pool = nullptr) {
  auto p = std::make_unique<PageOrderPool>(GeometryOf(c));
  if (pool != nullptr) *pool = p.get();
  auto s = KvStore::Create(c, std::move(p));
  EXPECT_TRUE(s.ok()) << s.status();
  return s.ok() ? std::move(s).value() : nullptr;
}

TEST(KvStorePool, RefusesWhatThePoolCannotStoreNamingTheDevice) {
  for (KvMode mode : {KvMode::kInt8, KvMode::kInt4, KvMode::kMixed}) {
    KvStoreConfig c = SmallConfig(mode);
    auto s = KvStore::Create(c, std::make_unique<PageOrderPool>(GeometryOf(c)));
    ASSERT_FALSE(s.ok()) << KvModeName(mode);
    EXPECT_EQ(s.status().code(), absl::StatusCode::kInvalidArgument);
    EXPECT_NE(s.status().message().find("cuda:7"), std::string_view::npos) << s.status();
  }
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  c.rotate = true;
  auto rotated = KvStore::Create(c, std::make_unique<PageOrderPool>(GeometryOf(c)));
  ASSERT_FALSE(rotated.ok());
  EXPECT_NE(rotated.status().message().find("unrotated"), std::string_view::npos);
  c.rotate.reset();
  c.evict = true;
  c.evict_window = 64;
  EXPECT_FALSE(KvStore::Create(c, std::make_unique<PageOrderPool>(GeometryOf(c))).ok());
  c.evict = false;
  KvStoreConfig other = c;
  other.page_tokens = 4;  // geometry differs from the pool's
  EXPECT_FALSE(KvStore::Create(other, std::make_unique<PageOrderPool>(GeometryOf(c))).ok());
  // Dense is the reference cache, not a store mode.
  KvStoreConfig dense = SmallConfig(KvMode::kDense);
  EXPECT_FALSE(MakeHostKvStore(dense).ok());
  // Unset rotation: the device's default (here: unrotated), accepted.
  EXPECT_TRUE(KvStore::Create(c, std::make_unique<PageOrderPool>(GeometryOf(c))).ok());
}

// The same random life (growth by random amounts, rollbacks, frees, new sequences) on a
// page-order pool and on the CPU pool: every pass is in page order there, and attention
// outputs agree bit for bit (attention reads positions in order, whatever the slots).
TEST(KvStorePool, PageOrderHoldsThroughTruncationAndRefill) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  c.rotate = false;
  PageOrderPool* pool = nullptr;
  auto ordered = PageOrderStore(c, &pool);
  ASSERT_NE(ordered, nullptr);
  auto plain = MakeHostKvStore(c);
  ASSERT_TRUE(plain.ok());
  std::mt19937 rng(11), gen_a(5), gen_b(5);
  std::map<SeqId, int> len;
  for (int step = 0; step < 300; ++step) {
    const SeqId seq = 1 + static_cast<int>(rng() % 3);
    const int op = static_cast<int>(rng() % 10);
    if (op < 6) {
      const int n = 1 + static_cast<int>(rng() % 13);
      ASSERT_TRUE(Feed(*ordered, c, seq, n, gen_a).ok());
      ASSERT_TRUE(Feed(**plain, c, seq, n, gen_b).ok());
      len[seq] += n;
    } else if (op < 9 && len[seq] > 0) {
      const int to = static_cast<int>(rng() % len[seq]);
      ASSERT_TRUE(ordered->Truncate(seq, to).ok());
      ASSERT_TRUE((*plain)->Truncate(seq, to).ok());
      len[seq] = to;
    } else {
      ordered->Free(seq);
      (*plain)->Free(seq);
      len[seq] = 0;
    }
    if (len[seq] > 0) {
      ASSERT_EQ(Query(*ordered, c, seq, 100 + step), Query(**plain, c, seq, 100 + step))
          << "step " << step;
    }
    // Page order reuses a private page's tail after a rollback; the CPU pool may leave
    // dead slots instead, so it never uses fewer bytes.
    ASSERT_LE(ordered->Usage().used_bytes, (*plain)->Usage().used_bytes) << "step " << step;
  }
  EXPECT_GT(pool->passes, 300);
}

TEST(KvStorePool, SharingAndSwapAreRefusedWhereThePoolCannotCopy) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  auto store = PageOrderStore(c);
  ASSERT_NE(store, nullptr);
  std::mt19937 gen(3);
  ASSERT_TRUE(Feed(*store, c, 1, c.page_tokens + 3, gen).ok());
  // A fork inside a page would share the page both sequences append into.
  absl::Status fork = store->Fork(1, 2);
  EXPECT_EQ(fork.code(), absl::StatusCode::kUnimplemented) << fork;
  EXPECT_NE(fork.message().find("cuda:7"), std::string_view::npos);
  EXPECT_EQ(store->Length(2), 0);
  // At a page boundary both continue in pages of their own.
  ASSERT_TRUE(store->Truncate(1, c.page_tokens).ok());
  ASSERT_TRUE(store->Fork(1, 2).ok());
  ASSERT_TRUE(Feed(*store, c, 1, 5, gen).ok());
  ASSERT_TRUE(Feed(*store, c, 2, 5, gen).ok());
  // Rolling back into the shared page and appending again would write into it.
  ASSERT_TRUE(store->Truncate(2, c.page_tokens - 2).ok());
  const KvUsage before = store->Usage();
  absl::Status cow = store->Reserve(2, 1);
  EXPECT_EQ(cow.code(), absl::StatusCode::kFailedPrecondition) << cow;
  EXPECT_EQ(store->Usage().used_bytes, before.used_bytes);
  EXPECT_EQ(store->Length(2), c.page_tokens - 2);
  EXPECT_FALSE(store->CanSwap());
  EXPECT_EQ(store->SwapOut(1).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ(store->Length(1), c.page_tokens + 5);
}

// Page ids are bounded by the pool (a device's preallocated pages): beyond them a
// reservation is ResourceExhausted and changes nothing.
TEST(KvStorePool, PoolPageLimitIsResourceExhausted) {
  KvStoreConfig c = SmallConfig(KvMode::kFull);
  PageOrderPool* pool = nullptr;
  auto store = PageOrderStore(c, &pool);
  ASSERT_NE(store, nullptr);
  pool->max_pages = 2;
  std::mt19937 gen(1);
  ASSERT_TRUE(Feed(*store, c, 1, 2 * c.page_tokens, gen).ok());
  absl::Status s = store->Reserve(2, 1);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(store->Length(2), 0);
  EXPECT_EQ(store->Usage().pages, 2);
  store->Free(1);
  EXPECT_TRUE(store->Reserve(2, 1).ok());
}

// The forward pass refuses a cache whose pages live on another device than its backend.
TEST(KvStorePool, ForwardRefusesACacheOnAnotherDevice) {
  TinyModelOptions o;
  o.n_layers = 1;
  const std::string path = testing_support::TempFilePath("pool_device");
  ASSERT_TRUE(WriteTinyModel(o, path).ok());
  auto m = LlamaModel::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const LlamaConfig& mc = (*m)->config();
  KvStoreConfig c;
  c.mode = KvMode::kFull;
  c.n_layers = mc.n_layers;
  c.n_kv_heads = mc.n_kv_heads;
  c.head_dim = mc.head_dim;
  c.gqa_group = mc.gqa_group();
  c.max_seq_len = mc.context_length;
  c.capacity_bytes = 1 << 20;
  auto store = PageOrderStore(c);
  ASSERT_NE(store, nullptr);
  CpuLlamaForward fwd(mc, (*m)->weights(), nullptr);
  std::vector<int32_t> toks = {1, 2, 3};
  BatchEntry e{1, toks, false};
  std::vector<float> logits;
  absl::Status s = fwd.Forward({&e, 1}, store.get(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kFailedPrecondition) << s;
  EXPECT_NE(s.message().find("cuda:7"), std::string_view::npos);
  EXPECT_EQ(store->Length(1), 0);
}

}  // namespace
}  // namespace specnode
