// The GPU page pool (cuda_page_pool.h) against the CPU pool, kernel by kernel and through
// the one KV manager: encoding per class (bit for bit: both run the same row code on the
// same f32 rows), demotion, attention over pages of several classes, the attention mass,
// the host tier's round trip (bit-exact), forks and the prefix cache, capacity exhaustion.
//
// Tolerances: where both pools hold the same bytes (every mode but mixed), outputs differ
// only by the order of f32 accumulation: |gpu - cpu| <= 2e-3 (1 + |cpu|). In mixed mode a
// token near the criticality threshold may be demoted to another class on one device (its
// mass differs in the last bits), so outputs are held to the int4 step: 6e-2 (1 + |cpu|),
// and classes per token to within 5% + 2 tokens. Mass sums: 1e-3 relative, counts exact.
//
// Without a GPU every test here skips, except the capability check.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_page_pool.h"
#include "cuda/kv_attention_chunks.h"
#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/cpu_page_pool.h"
#include "kvstore/kv_store.h"

namespace specnode {
namespace {

// The GPU pool states what it stores (runs everywhere: no device needed).
TEST(CudaPagePoolCapsTest, EveryClassRotationAndSlotCopies) {
  const KvPoolCaps c = CudaPagePool::Caps(64, std::nullopt);
  EXPECT_TRUE(c.classes[0] && c.classes[1] && c.classes[2]);
  EXPECT_TRUE(c.rotated);
  EXPECT_TRUE(c.slot_copies);
  EXPECT_FALSE(c.page_order);
  EXPECT_FALSE(CudaPagePool::Caps(80, std::nullopt).rotated);  // not a power of two
  EXPECT_FALSE(CudaPagePool::Caps(64, false).rotated);
  for (KvMode mode : {KvMode::kFull, KvMode::kInt8, KvMode::kInt4, KvMode::kMixed}) {
    KvOptions o;
    o.mode = mode;
    EXPECT_TRUE(KvStore::CheckSupported(o, c, Device::Cuda(0)).ok()) << KvModeName(mode);
  }
  EXPECT_EQ(KvStore::ResolvedMode(KvMode::kAuto, c), KvMode::kMixed);
}

KvStoreConfig Config(KvMode mode, std::optional<bool> rotate, int64_t capacity) {
  KvStoreConfig kc;
  kc.mode = mode;
  kc.n_layers = 2;
  kc.n_kv_heads = 2;
  kc.head_dim = 64;
  kc.gqa_group = 3;
  kc.max_seq_len = 1024;
  kc.page_tokens = 8;
  kc.capacity_bytes = capacity;
  kc.host_capacity_bytes = 16 << 20;
  kc.rotate = rotate;
  kc.window_tokens = 8;
  kc.sink_tokens = 2;
  kc.demote_every = 4;
  kc.mass_sample_every = 1;
  kc.critical_threshold = 1.5f;
  return kc;
}

KvPoolGeometry GeometryOf(const KvStoreConfig& kc) {
  return {kc.n_layers, kc.n_kv_heads, kc.head_dim, kc.gqa_group, kc.page_tokens};
}

// A GPU store and a CPU store of the same config, driven pass by pass with the same rows.
struct Twin {
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<KvStore> gpu, cpu;
  KvStoreConfig kc;
  CudaPagePool* pool = nullptr;

  static std::unique_ptr<Twin> Make(const KvStoreConfig& kc) {
    auto t = std::make_unique<Twin>();
    t->kc = kc;
    auto backend = CudaBackend::Create({});
    EXPECT_TRUE(backend.ok()) << backend.status();
    if (!backend.ok()) return nullptr;
    t->backend = *std::move(backend);
    auto pool =
        CudaPagePool::Create(t->backend.get(), GeometryOf(kc), kc.capacity_bytes, kc.rotate);
    EXPECT_TRUE(pool.ok()) << pool.status();
    if (!pool.ok()) return nullptr;
    t->pool = pool->get();
    auto gpu = KvStore::Create(kc, *std::move(pool));
    auto cpu = MakeHostKvStore(kc);
    EXPECT_TRUE(gpu.ok() && cpu.ok());
    if (!gpu.ok() || !cpu.ok()) return nullptr;
    t->gpu = *std::move(gpu);
    t->cpu = *std::move(cpu);
    return t;
  }

  // n rows of seq (random K/V/Q from seed) through both stores; outputs compared per layer
  // within `tol`; commits `keep` of the n rows. Returns the GPU outputs.
  std::vector<float> Step(SeqId seq, int n, int keep, uint32_t seed, double tol) {
    const int kv = kc.n_kv_heads * kc.head_dim, q_row = kv * kc.gqa_group;
    return StepWith(seq, n, keep, cuda_test::RandomVector(n * kv, seed),
                    cuda_test::RandomVector(n * kv, seed + 1),
                    cuda_test::RandomVector(n * q_row, seed + 2, 3.0f), tol);
  }

  // The same with the pass's rows given: k, v [n, n_kv_heads * head_dim], q [n, query row].
  std::vector<float> StepWith(SeqId seq, int n, int keep, const std::vector<float>& k,
                              const std::vector<float>& v, const std::vector<float>& q,
                              double tol) {
    const int32_t pos0 = cpu->Length(seq);
    EXPECT_EQ(gpu->Length(seq), pos0);
    EXPECT_TRUE(cpu->Reserve(seq, n).ok());
    const absl::Status r = gpu->Reserve(seq, n);
    EXPECT_TRUE(r.ok()) << r;
    auto dk = cuda_test::Upload(k), dv = cuda_test::Upload(v), dq = cuda_test::Upload(q);
    auto dout = DeviceBuffer::Allocate(q.size() * sizeof(float));
    EXPECT_TRUE(dk.ok() && dv.ok() && dq.ok() && dout.ok());
    const KvPassEntry e{seq, pos0, n};
    std::vector<float> want(q.size()), all;
    const std::vector<int32_t> zeros(n, 0);
    EXPECT_TRUE(cpu->BeginPass({&e, 1}, nullptr).ok());
    EXPECT_TRUE(backend->BeginPass(zeros, zeros).ok());  // the step tables' ids/positions
    const absl::Status b = gpu->BeginPass({&e, 1}, nullptr);
    EXPECT_TRUE(b.ok()) << b;
    for (int l = 0; l < kc.n_layers; ++l) {
      EXPECT_TRUE(cpu->Write(l, k.data(), v.data()).ok());
      EXPECT_TRUE(cpu->Attend(l, q.data(), 0.125f, 0, want.data()).ok());
      EXPECT_TRUE(gpu->Write(l, dk->as<float>(), dv->as<float>()).ok());
      EXPECT_TRUE(gpu->Attend(l, dq->as<float>(), 0.125f, 0, dout->as<float>()).ok());
      auto got = cuda_test::Download<float>(*dout, q.size());
      EXPECT_TRUE(got.ok()) << got.status();
      if (!got.ok()) return {};
      int bad = 0;
      for (size_t i = 0; i < want.size() && bad < 3; ++i) {
        if (!(std::fabs((*got)[i] - want[i]) <= tol * (1 + std::fabs(want[i])))) {
          ADD_FAILURE() << "seq " << seq << " pos0 " << pos0 << " layer " << l << " value " << i
                        << ": gpu " << (*got)[i] << " cpu " << want[i];
          ++bad;
        }
      }
      all.insert(all.end(), got->begin(), got->end());
    }
    cpu->Commit(seq, pos0 + n);
    gpu->Commit(seq, pos0 + n);
    if (keep < n) {
      EXPECT_TRUE(cpu->Truncate(seq, pos0 + keep).ok());
      EXPECT_TRUE(gpu->Truncate(seq, pos0 + keep).ok());
    }
    return all;
  }
};

struct ModeCase {
  KvMode mode;
  bool rotate;
};

class CudaPagePoolModeTest : public cuda_test::CudaTestWithParam<ModeCase> {};

// A life of prefill, decode across page and demotion boundaries, verification passes with
// rollback, a fork and a second sequence: the GPU store's outputs, bytes and classes are
// the CPU store's.
TEST_P(CudaPagePoolModeTest, MatchesTheCpuStore) {
  const ModeCase mc = GetParam();
  auto t = Twin::Make(Config(mc.mode, mc.rotate, 8 << 20));
  ASSERT_NE(t, nullptr);
  const bool mixed = mc.mode == KvMode::kMixed;
  const double tol = mixed ? 6e-2 : 2e-3;
  uint32_t seed = 1;
  t->Step(1, 13, 13, seed += 10, tol);
  for (int i = 0; i < 30; ++i) {
    const int32_t len = t->cpu->Length(1);
    if (i % 5 == 4) {
      // A verification-like pass within the demotion boundary, half rejected.
      const int n = 4 - len % 4;
      t->Step(1, n, n / 2, seed += 10, tol);
    } else {
      t->Step(1, 1, 1, seed += 10, tol);
    }
    if (i == 10) {
      ASSERT_TRUE(t->cpu->Fork(1, 2).ok());
      ASSERT_TRUE(t->gpu->Fork(1, 2).ok());
    }
    if (i > 10) t->Step(2, 1, 1, seed += 10, tol);
  }
  const KvUsage g = t->gpu->Usage(), c = t->cpu->Usage();
  if (!mixed) {
    EXPECT_EQ(g.bytes, c.bytes);
    EXPECT_EQ(g.tokens, c.tokens);
  } else {
    const int64_t total = c.tokens[0] + c.tokens[1] + c.tokens[2];
    EXPECT_EQ(g.tokens[0] + g.tokens[1] + g.tokens[2], total);
    for (int k = 0; k < 3; ++k) {
      EXPECT_LE(std::abs(g.tokens[k] - c.tokens[k]), 2 + total / 20) << "class " << k;
    }
    EXPECT_GT(g.tokens[1] + g.tokens[2], 0) << "nothing demoted";
    EXPECT_GT(t->pool->recoded(), 0);
    // Demotions are batched: far fewer launches than jobs.
    EXPECT_LT(t->pool->recode_launches(), t->pool->recoded());
  }
}

INSTANTIATE_TEST_SUITE_P(
    Modes, CudaPagePoolModeTest,
    ::testing::Values(ModeCase{KvMode::kFull, false}, ModeCase{KvMode::kFull, true},
                      ModeCase{KvMode::kInt8, true}, ModeCase{KvMode::kInt4, false},
                      ModeCase{KvMode::kInt4, true}, ModeCase{KvMode::kMixed, true},
                      ModeCase{KvMode::kMixed, false}));

// A long context (12 chunks of kv_attention_chunks.h): a row attended in a pass of more
// than kChunkedRows rows (one block walking its chunks) and the same row alone in a
// decode-sized pass (its chunks spread over blocks, merged by the last) give the same bits,
// and both agree with the CPU. Twice, so the counters left by one launch serve the next.
TEST(CudaPagePoolTest, ChunkedAttentionEqualsOneBlockPerRow) {
  SPECNODE_SKIP_WITHOUT_CUDA();
  KvStoreConfig kc = Config(KvMode::kFull, true, 64 << 20);
  kc.max_seq_len = 4096;
  auto t = Twin::Make(kc);
  ASSERT_NE(t, nullptr);
  constexpr int kPrefix = 3000, kRows = kv_chunks::kChunkedRows + 6;
  t->Step(1, kPrefix, kPrefix, 7, 2e-3);
  const int kv = kc.n_kv_heads * kc.head_dim, q_row = kv * kc.gqa_group;
  const std::vector<float> k = cuda_test::RandomVector(kRows * kv, 11);
  const std::vector<float> v = cuda_test::RandomVector(kRows * kv, 12);
  const std::vector<float> q = cuda_test::RandomVector(kRows * q_row, 13, 3.0f);
  // All kRows in one pass; keep all but the last.
  const std::vector<float> big = t->StepWith(1, kRows, kRows - 1, k, v, q, 2e-3);
  ASSERT_EQ(big.size(), static_cast<size_t>(kc.n_layers * kRows * q_row));
  for (int rep = 0; rep < 2; ++rep) {
    const std::vector<float> one = t->StepWith(1, 1, 0, std::vector<float>(k.end() - kv, k.end()),
                                               std::vector<float>(v.end() - kv, v.end()),
                                               std::vector<float>(q.end() - q_row, q.end()), 2e-3);
    ASSERT_EQ(one.size(), static_cast<size_t>(kc.n_layers * q_row));
    for (int l = 0; l < kc.n_layers; ++l) {
      const float* want = big.data() + (static_cast<size_t>(l) * kRows + kRows - 1) * q_row;
      EXPECT_EQ(0, std::memcmp(one.data() + l * q_row, want, q_row * sizeof(float)))
          << "layer " << l << " repeat " << rep;
    }
  }
}

// Pool level: pages of every class, one sequence spread over them with an evicted position,
// a 4-row pass with two observed queries. Encoded bytes equal the CPU pool's exactly,
// Recode (demotion) too, and the attention output and mass agree within the tolerances.
TEST(CudaPagePoolTest, KernelsMatchTheCpuPool) {
  SPECNODE_SKIP_WITHOUT_CUDA();
  for (bool rotate : {false, true}) {
    auto backend = CudaBackend::Create({});
    ASSERT_TRUE(backend.ok()) << backend.status();
    const KvStoreConfig kc = Config(KvMode::kMixed, rotate, 1 << 20);
    const KvPoolGeometry geo = GeometryOf(kc);
    auto gpu = CudaPagePool::Create(backend->get(), geo, kc.capacity_bytes, rotate);
    ASSERT_TRUE(gpu.ok()) << gpu.status();
    CpuPagePool cpu(geo, rotate);
    KvPagePool* pools[2] = {&cpu, gpu->get()};
    const KvPrecision cls[3] = {KvPrecision::kFull, KvPrecision::kInt8, KvPrecision::kInt4};
    for (KvPagePool* p : pools) {
      for (int id = 0; id < 3; ++id) ASSERT_TRUE(p->AllocatePage(id, cls[id]).ok());
      ASSERT_TRUE(p->AllocatePage(3, KvPrecision::kFull).ok());  // demotion sources
    }
    // 20 positions: page 0 (f16) slots 0..7, page 1 (int4) 0..5, page 2 (int8) 0..5;
    // position 3 evicted.
    std::vector<KvSlot> slots;
    for (int j = 0; j < 20; ++j) {
      if (j < 8)
        slots.push_back({0, j});
      else if (j < 14)
        slots.push_back({1, j - 8});
      else
        slots.push_back({2, j - 14});
    }
    slots[3] = {-1, 0};
    const int n = 4, pos0 = 16;
    const int kv = kc.n_kv_heads * kc.head_dim, q_row = kv * kc.gqa_group;
    // Queries at 17 and 19 observed (min_distance 4, lo 2): widths 12 and 14.
    std::vector<std::vector<float>> sums(4), cnts(4);
    std::vector<KvMassRow> rows[2];
    for (int i = 0; i < 2; ++i) {
      for (int o = 0; o < 2; ++o) {
        const int32_t pos = o == 0 ? 17 : 19, width = pos + 1 - 4 - 2;
        sums[2 * i + o].assign(kc.n_kv_heads * width, 0.0f);
        cnts[2 * i + o].assign(kc.n_kv_heads * width, 0.0f);
        rows[i].push_back({pos, 2, sums[2 * i + o].data(), cnts[2 * i + o].data()});
      }
    }
    std::vector<float> outs[2];
    // Every position is written once (a prefill of 16 without mass), then the pass.
    for (int i = 0; i < 2; ++i) {
      KvPagePool* p = pools[i];
      for (int pass = 0; pass < 2; ++pass) {
        KvPoolPassSeq s;
        s.seq = 1;
        s.pos0 = pass == 0 ? 0 : pos0;
        s.n = pass == 0 ? pos0 : n;
        std::vector<KvSlot> table = slots;
        if (pass == 0) table[3] = {0, 3};  // written, then evicted for the pass
        s.slots = std::span<const KvSlot>(table.data(), s.pos0 + s.n);
        if (pass == 1) {
          s.mass.on = true;
          s.mass.min_distance = 4;
          s.mass.rows = rows[i];
        }
        const std::vector<int32_t> zeros(s.n, 0);
        if (i == 1) {
          ASSERT_TRUE((*backend)->BeginPass(zeros, zeros).ok());
        }
        ASSERT_TRUE(p->BeginPass({&s, 1}, nullptr).ok());
        const std::vector<float> k = cuda_test::RandomVector(s.n * kv, 100 + pass);
        const std::vector<float> v = cuda_test::RandomVector(s.n * kv, 200 + pass);
        const std::vector<float> q = cuda_test::RandomVector(s.n * q_row, 300 + pass, 3.0f);
        std::vector<float> out(q.size());
        for (int l = 0; l < kc.n_layers; ++l) {
          if (i == 0) {
            ASSERT_TRUE(p->Write(l, k.data(), v.data()).ok());
            ASSERT_TRUE(p->Attend(l, q.data(), 0.125f, 0, out.data()).ok());
          } else {
            auto dk = cuda_test::Upload(k), dv = cuda_test::Upload(v), dq = cuda_test::Upload(q);
            auto dout = DeviceBuffer::Allocate(q.size() * sizeof(float));
            ASSERT_TRUE(dk.ok() && dv.ok() && dq.ok() && dout.ok());
            ASSERT_TRUE(p->Write(l, dk->as<float>(), dv->as<float>()).ok());
            ASSERT_TRUE(p->Attend(l, dq->as<float>(), 0.125f, 0, dout->as<float>()).ok());
            auto got = cuda_test::Download<float>(*dout, q.size());
            ASSERT_TRUE(got.ok());
            out = *got;
          }
          if (pass == 1) outs[i].insert(outs[i].end(), out.begin(), out.end());
        }
        ASSERT_TRUE(p->EndPass().ok());
      }
      // Demotion: f16 slots 0 and 1 of page 0 into the int8 page's slots 6, 7 and the
      // int4 page's slot 7.
      p->Recode({0, 0}, {2, 6});
      p->Recode({0, 1}, {2, 7});
      p->Recode({0, 2}, {1, 7});
    }
    // Bytes: every stored slot, bit for bit.
    std::vector<KvSlot> stored;
    for (int j = 0; j < 20; ++j) {
      if (slots[j].page >= 0) stored.push_back(slots[j]);
    }
    stored.push_back({2, 6});
    stored.push_back({2, 7});
    stored.push_back({1, 7});
    size_t bytes = 0;
    for (const KvSlot& s : stored) bytes += cpu.SlotBytes(cpu.PageClass(s.page));
    std::vector<uint8_t> a(bytes), b(bytes, 0xcd);
    ASSERT_TRUE(cpu.ReadSlots(stored, a.data()).ok());
    ASSERT_TRUE((*gpu)->ReadSlots(stored, b.data()).ok());
    EXPECT_EQ(a, b) << "rotate " << rotate;
    ASSERT_EQ(outs[0].size(), outs[1].size());
    for (size_t i = 0; i < outs[0].size(); ++i) {
      ASSERT_NEAR(outs[1][i], outs[0][i], 2e-3 * (1 + std::fabs(outs[0][i]))) << i;
    }
    for (int o = 0; o < 2; ++o) {
      for (size_t j = 0; j < sums[o].size(); ++j) {
        EXPECT_NEAR(sums[2 + o][j], sums[o][j], 1e-3 * (1 + std::fabs(sums[o][j])))
            << o << " " << j;
        EXPECT_EQ(cnts[2 + o][j], cnts[o][j]) << o << " " << j;
      }
    }
  }
}

// Swap out to the host tier and back: the sequence's bytes and its attention output are
// bit-identical, in mixed mode (pages of every class), after other work reused the pages.
TEST(CudaPagePoolTest, SwapRoundTripIsBitExact) {
  SPECNODE_SKIP_WITHOUT_CUDA();
  auto t = Twin::Make(Config(KvMode::kMixed, true, 8 << 20));
  ASSERT_NE(t, nullptr);
  t->Step(1, 13, 13, 7, 6e-2);
  for (int i = 0; i < 20; ++i) t->Step(1, 1, 1, 100 + i, 6e-2);
  ASSERT_TRUE(t->cpu->Fork(1, 9).ok());
  ASSERT_TRUE(t->gpu->Fork(1, 9).ok());
  const std::vector<float> before = t->Step(9, 1, 0, 555, 6e-2);  // attends, keeps nothing
  ASSERT_TRUE(t->gpu->SwapOut(1).ok());
  ASSERT_TRUE(t->cpu->SwapOut(1).ok());
  EXPECT_TRUE(t->gpu->IsSwapped(1));
  EXPECT_EQ(t->gpu->Usage().host_bytes, t->cpu->Usage().host_bytes);
  EXPECT_GT(t->gpu->Usage().host_bytes, 0);
  t->gpu->Free(9);
  t->cpu->Free(9);
  for (int i = 0; i < 6; ++i) t->Step(2, 3, 3, 900 + i, 6e-2);  // reuse the freed pages
  ASSERT_TRUE(t->gpu->SwapIn(1).ok());
  ASSERT_TRUE(t->cpu->SwapIn(1).ok());
  EXPECT_EQ(t->gpu->Usage().host_bytes, 0);
  ASSERT_TRUE(t->cpu->Fork(1, 9).ok());
  ASSERT_TRUE(t->gpu->Fork(1, 9).ok());
  EXPECT_EQ(t->Step(9, 1, 0, 555, 6e-2), before);
}

// Forks share pages (no bytes until they diverge) and the prefix cache attaches published
// pages to a new sequence; both give the CPU store's outputs.
TEST(CudaPagePoolTest, ForksAndPrefixCacheShareGpuPages) {
  SPECNODE_SKIP_WITHOUT_CUDA();
  auto t = Twin::Make(Config(KvMode::kFull, true, 8 << 20));
  ASSERT_NE(t, nullptr);
  t->Step(1, 24, 24, 3, 2e-3);
  const int64_t used = t->gpu->Usage().used_bytes;
  ASSERT_TRUE(t->gpu->Fork(1, 2).ok());
  ASSERT_TRUE(t->cpu->Fork(1, 2).ok());
  EXPECT_EQ(t->gpu->Usage().used_bytes, used);
  for (int i = 0; i < 5; ++i) {
    t->Step(1, 1, 1, 40 + i, 2e-3);
    t->Step(2, 1, 1, 60 + i, 2e-3);
  }
  std::vector<int32_t> ids(t->cpu->Length(1));  // 29 tokens: 3 whole pages
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = 1000 + static_cast<int32_t>(i);
  t->gpu->PublishPrefix(1, ids);
  t->cpu->PublishPrefix(1, ids);
  EXPECT_EQ(t->gpu->MatchPrefix(3, ids), 24);
  EXPECT_EQ(t->cpu->MatchPrefix(3, ids), 24);
  EXPECT_EQ(t->gpu->Usage().cached_prefix_pages, t->cpu->Usage().cached_prefix_pages);
  for (int i = 0; i < 4; ++i) t->Step(3, 2, 2, 80 + i, 2e-3);
}

// A reservation beyond the capacity is ResourceExhausted and changes nothing; the store
// keeps serving.
TEST(CudaPagePoolTest, CapacityExhaustionChangesNothing) {
  SPECNODE_SKIP_WITHOUT_CUDA();
  const KvStoreConfig probe = Config(KvMode::kInt8, true, 8 << 20);
  CpuPagePool sizes(GeometryOf(probe), true);
  const int64_t page = static_cast<int64_t>(sizes.PageBytes(KvPrecision::kInt8));
  auto t = Twin::Make(Config(KvMode::kInt8, true, 6 * page));
  ASSERT_NE(t, nullptr);
  t->Step(1, 24, 24, 5, 2e-3);  // 3 pages
  const KvUsage before = t->gpu->Usage();
  const absl::Status s = t->gpu->Reserve(2, 40);  // 5 more pages
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(t->gpu->Usage().used_bytes, before.used_bytes);
  EXPECT_EQ(t->gpu->Length(2), 0);
  t->Step(1, 1, 1, 77, 2e-3);  // still serves
}

}  // namespace
}  // namespace specnode
