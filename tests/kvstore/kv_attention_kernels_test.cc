// The attention kernels of every instruction set this CPU runs against the scalar
// reference, per precision class and head_dim, and the store-level guarantees that rest on
// them: a query's output does not depend on the batch it came in or on threads.
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/kv_attention_kernels.h"
#include "kvstore/kv_store.h"
#include "model/cpu/thread_pool.h"
#include "model/gguf/ggml_types.h"
#include "tests/kvstore/kv_store_test_util.h"

namespace specnode {
namespace {

using kv_kernels::KvAttentionKernels;
using kv_kernels::KvQuery;

// Rows of one class stored out of order at unaligned addresses, as pages hand them out.
struct Rows {
  std::vector<uint8_t> bytes;
  std::vector<const uint8_t*> ptr;
  std::vector<std::vector<float>> decoded;  // what the rows hold, for tolerance scales
  std::vector<float> abs_min;               // int4 / int2: |min| of each row (0 otherwise)
};

Rows MakeRows(KvPrecision p, int hd, int n, std::mt19937& gen) {
  std::normal_distribution<float> dist(0.2f, 1.0f);
  const size_t stride = KvRowBytes(p, hd) + 5;
  Rows r;
  r.bytes.resize(stride * n + 8);
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::shuffle(order.begin(), order.end(), gen);
  std::vector<float> x(hd);
  for (int i = 0; i < n; ++i) {
    for (float& v : x) v = dist(gen);
    if (i % 7 == 3) x[i % hd] = 9.0f;  // an outlier channel now and then
    uint8_t* row = r.bytes.data() + 3 + stride * order[i];
    KvEncodeRow(p, x.data(), hd, row);
    r.ptr.push_back(row);
    r.decoded.emplace_back(hd);
    KvDecodeRow(p, row, hd, r.decoded.back().data());
    uint16_t min_half = 0;
    if (p == KvPrecision::kInt4 || p == KvPrecision::kInt2) std::memcpy(&min_half, row + 2, 2);
    r.abs_min.push_back(std::abs(Fp16ToFp32(min_half)));
  }
  return r;
}

struct Query {
  std::vector<float> q, qsum;
  KvQuery view;
};

Query MakeQuery(int g, int hd, std::mt19937& gen) {
  std::normal_distribution<float> dist(0.0f, 1.0f / std::sqrt(static_cast<float>(hd)));
  Query q;
  q.q.resize(static_cast<size_t>(g) * hd);
  for (float& v : q.q) v = dist(gen);
  q.qsum.assign(g, 0.0f);
  for (int h = 0; h < g; ++h) {
    for (int d = 0; d < hd; ++d) q.qsum[h] += q.q[h * hd + d];
  }
  q.view = KvQuery{q.q.data(), q.qsum.data(), g, hd};
  return q;
}

// Relative tolerance of a score, against Σ |q| |row| (the scale of its rounding): f32
// reordering, plus for int8 / int4 the scale (and min) applied once per row, not per value.
double ScoreTolerance(KvPrecision p) { return p == KvPrecision::kFull ? 2e-6 : 4e-6; }

using Param = std::tuple<const KvAttentionKernels*, KvPrecision, int>;  // table, class, head_dim

class KvKernelsTest : public ::testing::TestWithParam<Param> {};

TEST_P(KvKernelsTest, ScoresMatchScalarReference) {
  const auto [kernels, p, hd] = GetParam();
  const KvAttentionKernels& ref = kv_kernels::kScalarKvKernels;
  std::mt19937 gen(hd * 3 + static_cast<int>(p));
  // g = 15: five tokens of a GQA group of 3 (a verification block), in chunks of rows.
  for (int g : {1, 2, 3, 4, 5, 15}) {
    for (int n : {1, 5, 16, 77, 201}) {
      const Rows rows = MakeRows(p, hd, n, gen);
      const Query q = MakeQuery(g, hd, gen);
      const size_t ld = n + 40;
      std::vector<float> want(g * ld, -1.0f), got(g * ld, -1.0f);
      ref.scores(p, rows.ptr.data(), n, q.view, want.data(), ld);
      kernels->scores(p, rows.ptr.data(), n, q.view, got.data(), ld);
      for (int h = 0; h < g; ++h) {
        for (int r = 0; r < n; ++r) {
          double scale = 0;
          for (int d = 0; d < hd; ++d) scale += std::abs(q.q[h * hd + d] * rows.decoded[r][d]);
          ASSERT_NEAR(got[h * ld + r], want[h * ld + r], ScoreTolerance(p) * scale + 1e-7)
              << kernels->name << " g=" << g << " n=" << n << " h=" << h << " r=" << r;
        }
        EXPECT_EQ(got[h * ld + n], -1.0f) << "wrote past its rows";
      }
    }
  }
}

TEST_P(KvKernelsTest, AccumulateMatchesScalarReference) {
  const auto [kernels, p, hd] = GetParam();
  const KvAttentionKernels& ref = kv_kernels::kScalarKvKernels;
  std::mt19937 gen(hd * 5 + static_cast<int>(p));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int g : {1, 3, 5, 12}) {
    for (int n : {1, 9, 64, 150}) {
      for (bool causal : {false, true}) {
        const Rows rows = MakeRows(p, hd, n, gen);
        const size_t ld = n + 16;
        std::vector<float> e(g * ld);
        for (float& v : e) v = unit(gen) * unit(gen);
        // causal: heads see fewer rows, as the earlier tokens of a block (some none of a
        // block of 64, some none at all).
        std::vector<int> head_rows(g, n);
        if (causal) {
          for (int h = 0; h < g; ++h) head_rows[h] = std::max(0, n - (g - 1 - h) * 7 - (h % 2));
        }
        std::vector<float> out0(g * hd);
        for (float& v : out0) v = unit(gen);
        std::vector<float> want = out0, got = out0;
        const int* hr = causal ? head_rows.data() : nullptr;
        ref.accumulate(p, rows.ptr.data(), n, e.data(), ld, g, hd, hr, want.data());
        kernels->accumulate(p, rows.ptr.data(), n, e.data(), ld, g, hd, hr, got.data());
        for (int h = 0; h < g; ++h) {
          for (int d = 0; d < hd; ++d) {
            double scale = std::abs(out0[h * hd + d]);
            // int4 sums Σ e * scale * code and Σ e * min apart: |scale * code| <= |value| + |min|.
            for (int r = 0; r < head_rows[h]; ++r) {
              scale += e[h * ld + r] * (std::abs(rows.decoded[r][d]) + 2 * rows.abs_min[r]);
            }
            ASSERT_NEAR(got[h * hd + d], want[h * hd + d], 3e-6 * scale + 1e-7)
                << kernels->name << " g=" << g << " n=" << n << " h=" << h << " d=" << d;
          }
        }
      }
    }
  }
}

// What CpuPagePool's query blocks rest on: a head's scores and accumulated sums come out
// the same, bit for bit, whether it is asked alone (with only the rows it sees) or with
// other heads that see more rows, and weights past a head's rows are never read (NaN here).
TEST_P(KvKernelsTest, HeadsOfABlockEqualHeadsAlone) {
  const auto [kernels, p, hd] = GetParam();
  std::mt19937 gen(hd * 11 + static_cast<int>(p));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  for (int n : {3, 70, 133}) {
    const int g = 15;
    const Rows rows = MakeRows(p, hd, n, gen);
    const Query q = MakeQuery(g, hd, gen);
    const size_t ld = n + 16;
    std::vector<float> block(g * ld);
    kernels->scores(p, rows.ptr.data(), n, q.view, block.data(), ld);
    std::vector<int> head_rows(g);
    for (int h = 0; h < g; ++h) head_rows[h] = std::max(1, n - (g - 1 - h) / 3);
    std::vector<float> e(g * ld, std::numeric_limits<float>::quiet_NaN());
    for (int h = 0; h < g; ++h) {
      for (int r = 0; r < head_rows[h]; ++r) e[h * ld + r] = unit(gen);
    }
    std::vector<float> acc_block(g * hd, 0.0f);
    kernels->accumulate(p, rows.ptr.data(), n, e.data(), ld, g, hd, head_rows.data(),
                        acc_block.data());
    for (int h = 0; h < g; ++h) {
      const KvQuery one{q.q.data() + h * hd, q.qsum.data() + h, 1, hd};
      std::vector<float> alone(ld);
      kernels->scores(p, rows.ptr.data(), head_rows[h], one, alone.data(), ld);
      for (int r = 0; r < head_rows[h]; ++r) {
        ASSERT_EQ(block[h * ld + r], alone[r]) << kernels->name << " n=" << n << " h=" << h;
      }
      std::vector<float> acc_alone(hd, 0.0f);
      kernels->accumulate(p, rows.ptr.data(), head_rows[h], e.data() + h * ld, ld, 1, hd, nullptr,
                          acc_alone.data());
      for (int d = 0; d < hd; ++d) {
        ASSERT_EQ(acc_block[h * hd + d], acc_alone[d])
            << kernels->name << " n=" << n << " h=" << h << " d=" << d;
      }
    }
  }
}

std::string ParamName(const ::testing::TestParamInfo<Param>& info) {
  const auto [kernels, p, hd] = info.param;
  return std::string(kernels->name) + "_" + std::string(KvPrecisionName(p)) + "_hd" +
         std::to_string(hd);
}

INSTANTIATE_TEST_SUITE_P(
    IsaClassDim, KvKernelsTest,
    ::testing::Combine(::testing::ValuesIn(kv_kernels::SupportedKvKernels()),
                       ::testing::Values(KvPrecision::kFull, KvPrecision::kInt8, KvPrecision::kInt4,
                                         KvPrecision::kInt2),
                       ::testing::Values(32, 64, 128)),
    ParamName);

class KvExpSumTest : public ::testing::TestWithParam<const KvAttentionKernels*> {};

TEST_P(KvExpSumTest, MatchesScalarReference) {
  const KvAttentionKernels* kernels = GetParam();
  const KvAttentionKernels& ref = kv_kernels::kScalarKvKernels;
  std::mt19937 gen(9);
  std::normal_distribution<float> dist(0.0f, 4.0f);
  for (int n : {1, 2, 15, 16, 17, 100, 1000}) {
    std::vector<float> s(n + kv_kernels::kScoresPad);
    for (int i = 0; i < n; ++i) s[i] = dist(gen);
    if (n > 1) s[n / 2] = -std::numeric_limits<float>::infinity();  // a masked position
    std::vector<float> want = s, got = s;
    const float sw = ref.exp_sum(want.data(), n);
    const float sg = kernels->exp_sum(got.data(), n);
    EXPECT_NEAR(sg, sw, 2e-6 * sw) << kernels->name << " n=" << n;
    if (n > 1) {
      EXPECT_EQ(got[n / 2], 0.0f);
    }
    for (int i = 0; i < n; ++i) ASSERT_NEAR(got[i], want[i], 1e-6 * want[i] + 1e-30) << i;
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, KvExpSumTest, ::testing::ValuesIn(kv_kernels::SupportedKvKernels()),
                         [](const auto& info) { return std::string(info.param->name); });

// encode_f16 equals Fp32ToFp16 bit for bit on every 4099th float bit pattern (all
// exponents, both signs, subnormal and NaN payloads) and on the rounding boundaries.
class KvEncodeF16Test : public ::testing::TestWithParam<const KvAttentionKernels*> {};

TEST_P(KvEncodeF16Test, EqualsScalarConversion) {
  const KvAttentionKernels* kernels = GetParam();
  std::vector<float> x;
  for (uint64_t bits = 0; bits <= 0xFFFFFFFFull; bits += 4099) {
    const uint32_t b = static_cast<uint32_t>(bits);
    float f;
    std::memcpy(&f, &b, 4);
    x.push_back(f);
  }
  for (float f :
       {0.0f, -0.0f, 65504.0f, 65519.996f, 65520.0f, 5.9604645e-08f, 2.9802322e-08f, 2.9802326e-08f,
        6.1035156e-05f, 6.1035152e-05f, 1.0009766f, 1.0004883f,
        std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
        std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::signaling_NaN(),
        std::numeric_limits<float>::denorm_min(), 1e-40f, -3e-39f}) {
    x.push_back(f);
  }
  while (x.size() % 16 != 0) x.push_back(1.5f);
  std::vector<uint8_t> got(2 * x.size()), want(2 * x.size());
  kv_kernels::kScalarKvKernels.encode_f16(x.data(), static_cast<int>(x.size()), want.data());
  kernels->encode_f16(x.data(), static_cast<int>(x.size()), got.data());
  for (size_t i = 0; i < x.size(); ++i) {
    uint16_t g, w;
    std::memcpy(&g, got.data() + 2 * i, 2);
    std::memcpy(&w, want.data() + 2 * i, 2);
    ASSERT_EQ(g, w) << kernels->name << " value " << x[i] << " index " << i;
    ASSERT_EQ(w, Fp32ToFp16(x[i]));
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, KvEncodeF16Test,
                         ::testing::ValuesIn(kv_kernels::SupportedKvKernels()),
                         [](const auto& info) { return std::string(info.param->name); });

// Store level: a prefill's outputs equal the same queries asked one at a time, bit for bit,
// in every mode (so speculative verification and plain decoding agree), and Attend for
// different kv heads on different threads gives what it gives sequentially.
class KvStoreDeterminism : public ::testing::TestWithParam<KvMode> {};

TEST_P(KvStoreDeterminism, BatchAndThreadsDoNotChangeOutputs) {
  KvStoreConfig c = kvtest::SmallConfig(GetParam());
  c.head_dim = 64;
  c.gqa_group = 3;
  c.mass_sample_every = 1000;  // no mass observation: this test calls Attend repeatedly
  auto store = MakeHostKvStore(c);
  ASSERT_TRUE(store.ok());
  std::mt19937 gen(4);
  ASSERT_TRUE(kvtest::Feed(**store, c, 1, 90, gen).ok());
  for (int i = 0; i < 6; ++i) ASSERT_TRUE(kvtest::Feed(**store, c, 1, 1, gen).ok());
  const int n = 12, pos0 = (*store)->Length(1) - n;
  const int n_heads = c.n_kv_heads * c.gqa_group;
  const size_t tok = static_cast<size_t>(n_heads) * c.head_dim;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> q(n * tok), batch(n * tok), single(n * tok), threaded(n * tok);
  for (float& v : q) v = dist(gen);
  ThreadPool pool(3);
  // Attention-only passes over committed positions: the whole block at once (one thread,
  // then split across the pool by kv head) and one position at a time.
  auto attend = [&](int32_t first, int32_t count, ThreadPool* threads, int layer, const float* qs,
                    float* out) {
    const KvPassEntry e{1, first, count};
    ASSERT_TRUE((*store)->BeginPass({&e, 1}, threads).ok());
    ASSERT_TRUE((*store)->Attend(layer, qs, 0.125f, 0, out).ok());
  };
  for (int layer = 0; layer < c.n_layers; ++layer) {
    attend(pos0, n, nullptr, layer, q.data(), batch.data());
    for (int i = 0; i < n; ++i) {
      attend(pos0 + i, 1, nullptr, layer, q.data() + i * tok, single.data() + i * tok);
    }
    attend(pos0, n, &pool, layer, q.data(), threaded.data());
    ASSERT_EQ(batch, single) << KvModeName(GetParam()) << " layer " << layer;
    ASSERT_EQ(batch, threaded) << KvModeName(GetParam()) << " layer " << layer;
  }
}

INSTANTIATE_TEST_SUITE_P(Modes, KvStoreDeterminism,
                         ::testing::Values(KvMode::kFull, KvMode::kInt8, KvMode::kInt4,
                                           KvMode::kInt2, KvMode::kMixed),
                         [](const auto& info) { return std::string(KvModeName(info.param)); });

}  // namespace
}  // namespace specnode
