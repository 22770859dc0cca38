// The tensor-core matmul's arithmetic and work layout on the host, no GPU needed:
//   - q16_order.h: the codes rebuild the file's dequantised values, and the canonical order
//     (CanonicalRow) agrees with the CPU's kernels to f32 rounding;
//   - q16_mma.h: the hi / lo split, fragment offsets inside the stage, and a whole thread
//     block of cuda_mma_kernels.cu replayed thread by thread — its staging and ApplyTile as
//     they run on the GPU, an emulator of mma.m16n8k16 written from the PTX ISA's fragment
//     tables in place of the instruction — equal to CanonicalRow bit for bit, over partial
//     row and token tiles and stages that end inside a range.
// The GPU side (cuda/tests/cuda_mma_test.cc) holds the real kernels to the same bits.
#include "cuda/q16_mma.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/q16_order.h"
#include "cuda/tests/q16_test_util.h"
#include "gtest/gtest.h"
#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_repack_kquant.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode {
namespace {

using q16_test::Bits;
using q16_test::kB;

TEST(Q16Mma, SplitHiLoRebuildsEveryValue) {
  std::mt19937 rng(5);
  for (int i = 0; i < 200000; ++i) {
    const uint32_t a = rng(), b = rng();
    uint32_t lo, hi;
    q16::SplitHiLo(a, b, &lo, &hi);
    const int16_t v[4] = {static_cast<int16_t>(a & 0xffff), static_cast<int16_t>(a >> 16),
                          static_cast<int16_t>(b & 0xffff), static_cast<int16_t>(b >> 16)};
    for (int k = 0; k < 4; ++k) {
      const int l = static_cast<int>((lo >> (8 * k)) & 0xff);
      const int h = static_cast<int8_t>((hi >> (8 * k)) & 0xff);
      ASSERT_EQ(256 * h + l, v[k]) << std::hex << a << " " << b << " value " << k;
    }
  }
}

void Dequantize(GgmlType type, const uint8_t* row, float* out, int64_t cols) {
  if (q16::IsKQuant(static_cast<int>(type))) {
    DequantizeConvertedRow(type, row, out, cols);
  } else {
    DequantizeRow(type, row, out, cols);
  }
}

// Int16 activations of n tokens in the kernels' layout: qs [n, cols], d and s [n, cols / 32].
struct Acts {
  std::vector<int16_t> qs;
  std::vector<float> d, s;
};
Acts MakeActs(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  Acts a;
  a.qs.resize(n * cols);
  a.d.resize(n * cols / kB);
  a.s.resize(n * cols / kB);
  std::vector<float> x(kB);
  for (int64_t b = 0; b < n * cols / kB; ++b) {
    for (int j = 0; j < kB; ++j) x[j] = normal(rng) * (j % 13 == 0 ? 20.0f : 1.0f);
    q16::QuantizeBlock16(x.data(), a.qs.data() + b * kB, &a.d[b], &a.s[b]);
  }
  return a;
}

template <int kType>
float Canonical(const uint8_t* row, int64_t cols, const Acts& a, int64_t t) {
  const int64_t subs = cols / kB;
  return q16::CanonicalRow<kType>(row, cols, a.qs.data() + t * cols, a.d.data() + t * subs,
                                  a.s.data() + t * subs);
}

template <int kType>
void CodesOf(const uint8_t* blk, int j, uint32_t cw[8], float* f1, float* f2) {
  q16::SubBlockCodes<kType>(blk, j, cw, f1, f2);
}
void SubBlockOf(GgmlType type, const uint8_t* blk, int j, uint32_t cw[8], float* f1, float* f2) {
  switch (type) {
    case GgmlType::kQ4_0:
      return CodesOf<q16::kTypeQ4_0>(blk, j, cw, f1, f2);
    case GgmlType::kQ4_1:
      return CodesOf<q16::kTypeQ4_1>(blk, j, cw, f1, f2);
    case GgmlType::kQ8_0:
      return CodesOf<q16::kTypeQ8_0>(blk, j, cw, f1, f2);
    case GgmlType::kQ4_K:
      return CodesOf<q16::kTypeQ4_K>(blk, j, cw, f1, f2);
    case GgmlType::kQ5_K:
      return CodesOf<q16::kTypeQ5_K>(blk, j, cw, f1, f2);
    default:
      return CodesOf<q16::kTypeQ6_K>(blk, j, cw, f1, f2);
  }
}

class Q16OrderTest : public ::testing::TestWithParam<GgmlType> {};

// f1 code + f2 (Q6_K: f_half code) is the file's dequantised value, for every value.
TEST_P(Q16OrderTest, CodesRebuildTheDequantisedBlocks) {
  const GgmlType type = GetParam();
  const int t = static_cast<int>(type);
  constexpr int64_t kCols = 1024;
  const std::vector<uint8_t> w = q16_test::Rows(type, 3, kCols, 17);
  const size_t row_bytes = GgmlRowBytes(type, kCols);
  std::vector<float> want(kCols);
  for (int r = 0; r < 3; ++r) {
    const uint8_t* row = w.data() + r * row_bytes;
    Dequantize(type, row, want.data(), kCols);
    for (int64_t sb = 0; sb < kCols / kB; ++sb) {
      const int per = q16::SubBlocksPerBlock(t);
      const uint8_t* blk = row + (sb / per) * q16::BlockBytes(t);
      uint32_t cw[8];
      float f1, f2;
      SubBlockOf(type, blk, static_cast<int>(sb % per), cw, &f1, &f2);
      for (int v = 0; v < kB; ++v) {
        const int8_t sc = static_cast<int8_t>((cw[v / 4] >> (8 * (v % 4))) & 0xff);
        const int code =
            type == GgmlType::kQ4_1 || type == GgmlType::kQ4_K || type == GgmlType::kQ5_K
                ? static_cast<uint8_t>(sc)
                : sc;
        const float got = type == GgmlType::kQ6_K ? (v < 16 ? f1 : f2) * static_cast<float>(code)
                                                  : f1 * static_cast<float>(code) + f2;
        const float x = want[sb * kB + v];
        ASSERT_NEAR(got, x, 1e-6f * (1.0f + std::fabs(x)))
            << "row " << r << " value " << sb * kB + v;
      }
    }
  }
}

// The canonical order against the CPU's own kernels (scalar table; the K-quant reference):
// the same integer dots and float terms, added in another order.
TEST_P(Q16OrderTest, CanonicalRowsAgreeWithTheCpu) {
  const GgmlType type = GetParam();
  constexpr int64_t kRows = 7, kCols = 1280, kTokens = 3;
  const std::vector<uint8_t> w = q16_test::Rows(type, kRows, kCols, 23);
  const size_t row_bytes = GgmlRowBytes(type, kCols);
  q16_test::ScalarActs acts;
  q16_test::QuantizeTokens(type, kTokens, kCols, kRows, 29, 31, &acts);
  std::vector<uint8_t> packed;
  if (q16::IsKQuant(static_cast<int>(type))) {
    packed = cpu_kernels::PackKQuantRows(WeightView{type, w.data(), kRows, kCols, row_bytes});
    acts.args.w = packed.data();
    acts.args.row_stride = (kCols / 256) * cpu_kernels::PackedKSuperBytes(type);
    cpu_kernels::PackedKQuantReference(acts.args, 0, kRows);
  } else {
    acts.args.w = w.data();
    acts.args.row_stride = row_bytes;
    cpu_kernels::kScalarKernels.matmul_quant(acts.args, 0, kRows);
  }
  Acts a;  // the same activations in the kernels' layout
  for (int64_t t = 0; t < kTokens; ++t) {
    const int16_t* qs = acts.qs.data() + t * acts.qs_stride;
    a.qs.insert(a.qs.end(), qs, qs + kCols);
    const float* d = acts.d.data() + t * acts.ds_stride;
    const float* s = acts.s.data() + t * acts.ds_stride;
    a.d.insert(a.d.end(), d, d + kCols / kB);
    a.s.insert(a.s.end(), s, s + kCols / kB);
  }
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t r = 0; r < kRows; ++r) {
      const float cpu = acts.y[t * kRows + r];
      const float got =
          q16_test::CanonicalOf(type, w.data() + r * row_bytes, kCols, a.qs.data() + t * kCols,
                                a.d.data() + t * kCols / kB, a.s.data() + t * kCols / kB);
      // Magnitude of the terms: bound the reordering error by 1e-5 of it.
      ASSERT_NEAR(got, cpu, 1e-5f * (1.0f + std::fabs(cpu)) + 2e-4f)
          << "token " << t << " row " << r;
    }
  }
}

// mma.m16n8k16 (.s8 or .u8 A, .s8 B, s32 C) for lane `lane` of a warp, from the PTX ISA's
// fragment tables: C element e is (token L/4 + 8 (e/2), row 2 (L%4) + e%2); A[m][k] sits in
// register m/8 of lane 4 (m%8) + k/4, byte k%4; B[k][n] in lane 4 n + k/4, byte k%4. Each
// lane's registers are what that lane loads at q16_mma.h's offsets.
struct EmulatedMma {
  const q16::MmaStage* st;
  int warp, lane;
  void operator()(q16::MmaInts& c, int k0, bool lo) const {
    const uint8_t* a = lo ? st->lo : st->hi;
    for (int mt = 0; mt < q16::kMmaTilesM; ++mt) {
      for (int nt = 0; nt < q16::kMmaTilesN; ++nt) {
        for (int e = 0; e < 4; ++e) {
          const int m = lane / 4 + 8 * (e / 2), n = 2 * (lane % 4) + e % 2;
          int sum = 0;
          for (int k = 0; k < 16; ++k) {
            const int la = 4 * (m % 8) + k / 4, lb = 4 * n + k / 4;
            const uint8_t av =
                a[q16::AFragOffset(la, q16::WarpToken0(warp) + 16 * mt, k0, m / 8) + k % 4];
            const uint8_t bv =
                st->w[q16::BFragOffset(lb, q16::WarpRow0(warp) + 8 * nt, k0) + k % 4];
            const int ai = lo ? static_cast<int>(av) : static_cast<int>(static_cast<int8_t>(av));
            sum += ai * static_cast<int8_t>(bv);
          }
          c[mt][nt][e] += sum;
        }
      }
    }
  }
};

// One thread block (row block rb, token tile tb) of Q16MmaKernel replayed on the host into
// y [n, rows].
template <int kType>
void ReplayBlock(const std::vector<uint8_t>& w, size_t row_bytes, int64_t rows, int64_t cols,
                 const Acts& a, int64_t n, int64_t rb, int64_t tb, std::vector<float>* y) {
  auto st = std::make_unique<q16::MmaStage>();
  const int64_t row0 = rb * q16::kMmaRows, tok0 = tb * q16::kMmaTokens, subs = cols / kB;
  std::vector<q16::MmaFloats> p(q16::kMmaThreads), total(q16::kMmaThreads);
  for (int th = 0; th < q16::kMmaThreads; ++th) {
    std::memset(&p[th], 0, sizeof(q16::MmaFloats));
    std::memset(&total[th], 0, sizeof(q16::MmaFloats));
  }
  for (int64_t sb0 = 0; sb0 < subs; sb0 += q16::kMmaStageSub) {
    const int nsub = static_cast<int>(std::min<int64_t>(q16::kMmaStageSub, subs - sb0));
    std::memset(st.get(), 0xa5, sizeof(q16::MmaStage));  // stale bytes must not matter
    for (int th = 0; th < q16::kMmaThreads; ++th) {
      for (int k = 0; k < q16::kMmaItems; ++k) {
        const int item = th + k * q16::kMmaThreads;
        const int64_t row = row0 + item / q16::kMmaStageSub;
        q16::StageWeightItem<kType>(row < rows ? w.data() + row * row_bytes : nullptr, sb0, nsub,
                                    item, st.get());
        const int64_t tok = tok0 + item / q16::kMmaStageSub;
        const bool here = tok < n;
        q16::StageActItem(here ? a.qs.data() + tok * cols : nullptr,
                          here ? a.d.data() + tok * subs : nullptr,
                          here ? a.s.data() + tok * subs : nullptr, sb0, nsub, item, st.get());
      }
    }
    for (int th = 0; th < q16::kMmaThreads; ++th) {
      EmulatedMma mma{st.get(), th / 32, th % 32};
      for (int j = 0; j < nsub; ++j) {
        q16::WarpSubBlock<kType>(*st, th / 32, th % 32, j, mma, p[th]);
      }
      if (q16::StageEndsRange<kType>(sb0 + nsub, subs)) q16::AddRange(p[th], total[th]);
    }
  }
  for (int th = 0; th < q16::kMmaThreads; ++th) {
    const int warp = th / 32, lane = th % 32;
    for (int mt = 0; mt < q16::kMmaTilesM; ++mt) {
      for (int nt = 0; nt < q16::kMmaTilesN; ++nt) {
        for (int e = 0; e < 4; ++e) {
          const int64_t tok = tok0 + q16::WarpToken0(warp) + 16 * mt + q16::CFragToken(lane, e);
          const int64_t row = row0 + q16::WarpRow0(warp) + 8 * nt + q16::CFragRow(lane, e);
          if (tok < n && row < rows) (*y)[tok * rows + row] = total[th][mt][nt][e];
        }
      }
    }
  }
}

template <int kType>
void ExpectReplayIsCanonical(GgmlType type, int64_t cols) {
  constexpr int64_t kRows = 70, kTokens = 70;  // two partial tiles each way
  const std::vector<uint8_t> w = q16_test::Rows(type, kRows, cols, 31);
  const size_t row_bytes = GgmlRowBytes(type, cols);
  const Acts a = MakeActs(kTokens, cols, 37);
  std::vector<float> y(kTokens * kRows, std::nanf(""));
  for (int64_t rb = 0; rb * q16::kMmaRows < kRows; ++rb) {
    for (int64_t tb = 0; tb * q16::kMmaTokens < kTokens; ++tb) {
      ReplayBlock<kType>(w, row_bytes, kRows, cols, a, kTokens, rb, tb, &y);
    }
  }
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t r = 0; r < kRows; ++r) {
      const float want = Canonical<kType>(w.data() + r * row_bytes, cols, a, t);
      ASSERT_EQ(Bits(y[t * kRows + r]), Bits(want))
          << "token " << t << " row " << r << ": " << y[t * kRows + r] << " vs " << want;
    }
  }
}

TEST_P(Q16OrderTest, ThreadBlockReplayEqualsTheCanonicalOrderBitForBit) {
  const GgmlType type = GetParam();
  // Q4_0 / Q4_1 / Q8_0: 11 sub-blocks (a last stage of 3); K-quants: 3 super-blocks (a
  // range spans two stages, the last range is whole).
  switch (type) {
    case GgmlType::kQ4_0:
      return ExpectReplayIsCanonical<q16::kTypeQ4_0>(type, 352);
    case GgmlType::kQ4_1:
      return ExpectReplayIsCanonical<q16::kTypeQ4_1>(type, 352);
    case GgmlType::kQ8_0:
      return ExpectReplayIsCanonical<q16::kTypeQ8_0>(type, 352);
    case GgmlType::kQ4_K:
      return ExpectReplayIsCanonical<q16::kTypeQ4_K>(type, 768);
    case GgmlType::kQ5_K:
      return ExpectReplayIsCanonical<q16::kTypeQ5_K>(type, 768);
    default:
      return ExpectReplayIsCanonical<q16::kTypeQ6_K>(type, 768);
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Q16OrderTest,
                         ::testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0,
                                           GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(GgmlTypeName(static_cast<uint32_t>(info.param)));
                         });

// Every lane's fragment loads and every stage item stay inside their staged matrices, and
// the fragments of a warp's k-slice cover each (row or token, value) exactly once.
TEST(Q16Mma, FragmentsCoverTheStageOnce) {
  for (int warp = 0; warp < q16::kMmaThreads / 32; ++warp) {
    for (int k0 = 0; k0 < q16::kMmaStageSub * kB; k0 += 16) {
      std::vector<int> a_hits(q16::kMmaTokens * q16::kMmaStride, 0);
      std::vector<int> b_hits(q16::kMmaRows * q16::kMmaStride, 0);
      for (int lane = 0; lane < 32; ++lane) {
        for (int mt = 0; mt < q16::kMmaTilesM; ++mt) {
          for (int i = 0; i < 2; ++i) {
            const int off = q16::AFragOffset(lane, q16::WarpToken0(warp) + 16 * mt, k0, i);
            ASSERT_EQ(off % 4, 0);
            ASSERT_LE(off + 4, q16::kMmaTokens * q16::kMmaStride);
            for (int b = 0; b < 4; ++b) ++a_hits[off + b];
          }
        }
        for (int nt = 0; nt < q16::kMmaTilesN; ++nt) {
          const int off = q16::BFragOffset(lane, q16::WarpRow0(warp) + 8 * nt, k0);
          ASSERT_EQ(off % 4, 0);
          ASSERT_LE(off + 4, q16::kMmaRows * q16::kMmaStride);
          for (int b = 0; b < 4; ++b) ++b_hits[off + b];
        }
      }
      for (int m = 0; m < 32; ++m) {
        for (int k = 0; k < 16; ++k) {
          ASSERT_EQ(a_hits[(q16::WarpToken0(warp) + m) * q16::kMmaStride + k0 + k], 1);
          ASSERT_EQ(b_hits[(q16::WarpRow0(warp) + m) * q16::kMmaStride + k0 + k], 1);
        }
      }
    }
  }
}

}  // namespace
}  // namespace specnode
