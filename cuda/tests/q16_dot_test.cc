// cuda/q16_dot.h, the arithmetic of CudaMatMulAlgo::kQuantAct, on the host against the
// CPU's scalar kernels (model/cpu/cpu_kernels_scalar.cc), byte for byte. No GPU needed: the
// kernels in cuda_qmatvec_kernels.cu call these same functions (on the GPU the dp2a
// instructions replace Dp2aLo / Dp2aHi, whose sums are exact either way).
#include "cuda/q16_dot.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_qmatvec_kernels.h"
#include "cuda/q16_kquant.h"
#include "cuda/q16_stage.h"
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
using q16_test::QuantizeTokens;
using q16_test::Rows;
using q16_test::ScalarActs;

// Blocks that exercise the rounding: random normals with outliers, an all-zero block,
// values exactly halfway between levels (amax 32767 makes d = 1), subnormals, a block whose
// max is negative, and huge values.
std::vector<float> TrickyBlocks(int random_blocks) {
  std::vector<float> x;
  std::mt19937 rng(7);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (int b = 0; b < random_blocks; ++b) {
    for (int j = 0; j < kB; ++j) x.push_back(normal(rng) * (j % 11 == 0 ? 30.0f : 1.0f));
  }
  for (int j = 0; j < kB; ++j) x.push_back(0.0f);
  for (int j = 0; j < kB; ++j) x.push_back(j == 0 ? 32767.0f : static_cast<float>(j) + 0.5f);
  for (int j = 0; j < kB; ++j) x.push_back(j == 0 ? 32767.0f : -(static_cast<float>(j) + 0.5f));
  for (int j = 0; j < kB; ++j) x.push_back(1e-40f * static_cast<float>(j - 16));
  for (int j = 0; j < kB; ++j) x.push_back(j == 5 ? -3.0f : 0.25f * static_cast<float>(j % 3));
  for (int j = 0; j < kB; ++j) x.push_back(3e38f * static_cast<float>(j - 16) / 16.0f);
  return x;
}

TEST(Q16Dot, QuantizeBlockMatchesTheCpuByteForByte) {
  const std::vector<float> x = TrickyBlocks(500);
  const int64_t blocks = static_cast<int64_t>(x.size()) / kB;
  // The CPU quantiser may write up to 128 values past the last block.
  std::vector<int16_t> cpu_qs(blocks * kB + 128, 0);
  std::vector<float> cpu_d(blocks + 16, 0.0f), cpu_s(blocks + 16, 0.0f);
  cpu_kernels::kScalarKernels.quantize(x.data(), blocks, GgmlType::kQ4_0, cpu_qs.data(),
                                       cpu_d.data(), cpu_s.data());
  for (int64_t b = 0; b < blocks; ++b) {
    int16_t qs[kB];
    float d, s;
    q16::QuantizeBlock16(x.data() + b * kB, qs, &d, &s);
    ASSERT_EQ(0, std::memcmp(qs, cpu_qs.data() + b * kB, sizeof(qs))) << "block " << b;
    ASSERT_EQ(Bits(d), Bits(cpu_d[b])) << "block " << b;
    ASSERT_EQ(Bits(s), Bits(cpu_s[b])) << "block " << b;
  }
}

TEST(Q16Dot, Dp2aSpellsTheSignedProducts) {
  std::mt19937 rng(3);
  for (int i = 0; i < 100000; ++i) {
    const uint32_t a = rng(), b = rng();
    const int acc = static_cast<int>(rng() % 2001) - 1000;
    const auto a0 = static_cast<int16_t>(a & 0xffff), a1 = static_cast<int16_t>(a >> 16);
    int8_t bb[4];
    std::memcpy(bb, &b, 4);
    ASSERT_EQ(q16::Dp2aLo(a, b, acc), acc + a0 * bb[0] + a1 * bb[1]);
    ASSERT_EQ(q16::Dp2aHi(a, b, acc), acc + a0 * bb[2] + a1 * bb[3]);
  }
}

TEST(Q16Dot, MinusEightIsBytewise) {
  for (uint32_t v = 0; v < 16; ++v) {
    for (uint32_t w = 0; w < 16; ++w) {
      const uint32_t nib = v | (w << 8) | ((15 - v) << 16) | ((v ^ w) << 24);
      const uint32_t got = q16::MinusEight(nib);
      for (int k = 0; k < 4; ++k) {
        const int want = static_cast<int>((nib >> (8 * k)) & 0xff) - 8;
        ASSERT_EQ(static_cast<int8_t>((got >> (8 * k)) & 0xff), want) << v << " " << w;
      }
    }
  }
}

// The words the kernel loads from a weight block and an activation block.
void Words(const uint8_t* quants, int n_words, uint32_t* qw) {
  std::memcpy(qw, quants, 4 * static_cast<size_t>(n_words));
}

// One row's result spelled as the scalar table's RowDot spells it (block after block, the
// float terms in its order) from q16's integer dots: equal to the CPU bit for bit, which
// checks the dots and the word layouts against the CPU's own kernel.
float RowFromQ16(GgmlType type, const uint8_t* row, int64_t blocks, const int16_t* qs,
                 const float* d, const float* s) {
  float acc = 0.0f, acc_min = 0.0f;
  const size_t bytes = type == GgmlType::kQ4_0 ? 18 : type == GgmlType::kQ4_1 ? 20 : 34;
  for (int64_t b = 0; b < blocks; ++b) {
    const uint8_t* blk = row + b * bytes;
    uint32_t xw[16], qw[8];
    std::memcpy(xw, qs + b * kB, sizeof(xw));
    uint16_t dh;
    std::memcpy(&dh, blk, 2);
    const float dd = Fp16ToFp32(dh) * d[b];
    int isum;
    if (type == GgmlType::kQ8_0) {
      Words(blk + 2, 8, qw);
      isum = q16::DotQ8(qw, xw);
    } else if (type == GgmlType::kQ4_0) {
      Words(blk + 2, 4, qw);
      isum = q16::DotQ4<8>(qw, xw);
    } else {
      Words(blk + 4, 4, qw);
      isum = q16::DotQ4<0>(qw, xw);
      uint16_t mh;
      std::memcpy(&mh, blk + 2, 2);
      acc_min += Fp16ToFp32(mh) * s[b];
    }
    acc += static_cast<float>(isum) * dd;
  }
  return acc + acc_min;
}

class Q16RowTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(Q16RowTest, RowsEqualTheCpuScalarKernel) {
  const GgmlType type = GetParam();
  constexpr int64_t kRows = 9, kCols = 512, kTokens = 3;
  const int64_t blocks = kCols / kB;
  const size_t row_bytes = GgmlRowBytes(type, kCols);
  const std::vector<uint8_t> w = Rows(type, kRows, kCols, 11);
  ScalarActs acts;
  QuantizeTokens(type, kTokens, kCols, kRows, 12, 37, &acts);
  cpu_kernels::QuantMatMulArgs& args = acts.args;
  args.w = w.data();
  args.row_stride = row_bytes;
  const int64_t qs_stride = acts.qs_stride, ds_stride = acts.ds_stride;
  const std::vector<int16_t>& qs = acts.qs;
  const std::vector<float>&d = acts.d, &s = acts.s, &y = acts.y;
  cpu_kernels::kScalarKernels.matmul_quant(args, 0, kRows);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t r = 0; r < kRows; ++r) {
      const float got =
          RowFromQ16(type, w.data() + r * row_bytes, blocks, qs.data() + t * qs_stride,
                     d.data() + t * ds_stride, s.data() + t * ds_stride);
      ASSERT_EQ(Bits(got), Bits(y[t * kRows + r])) << "token " << t << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Types, Q16RowTest,
                         ::testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(GgmlTypeName(static_cast<uint32_t>(info.param)));
                         });

uint32_t CodesOf(GgmlType type, const uint8_t* blk, int j, int w) {
  uint32_t cw[8];
  if (type == GgmlType::kQ4_K) q16::Q4KCodes(blk, j, cw);
  if (type == GgmlType::kQ5_K) q16::Q5KCodes(blk, j, cw);
  if (type == GgmlType::kQ6_K) q16::Q6KCodes(blk, j, cw);
  return cw[w];
}

class Q16KQuantTest : public ::testing::TestWithParam<GgmlType> {};

TEST_P(Q16KQuantTest, CodesAndFactorsAreTheDecodedBlocks) {
  const GgmlType type = GetParam();
  const std::vector<uint8_t> w = Rows(type, 3, 1024, 5);
  const size_t bytes = GgmlRowBytes(type, q16::kSuperValues);
  for (size_t off = 0; off < w.size(); off += bytes) {
    KQuantCodes want;
    DecodeKQuantBlock(type, w.data() + off, &want);
    for (int j = 0; j < q16::kSubBlocks; ++j) {
      for (int v = 0; v < 32; ++v) {
        const uint32_t word = CodesOf(type, w.data() + off, j, v / 4);
        const auto got = static_cast<uint8_t>((word >> (8 * (v % 4))) & 0xffu);
        const int q = want.q[32 * j + v];
        if (type == GgmlType::kQ6_K) {
          ASSERT_EQ(static_cast<int8_t>(got), q - 32) << off << " " << j << " " << v;
        } else {
          ASSERT_EQ(got, q) << off << " " << j << " " << v;
        }
      }
      if (type != GgmlType::kQ6_K) {
        int sc, m;
        q16::KScaleMin(w.data() + off + 4, j, &sc, &m);
        ASSERT_EQ(sc, want.sc[j]);
        ASSERT_EQ(m, want.m[j]);
      }
    }
  }
}

// One lane going through every super-block of a row in order is the CPU's K-quant
// reference kernel, bit for bit.
TEST_P(Q16KQuantTest, SequentialRowsEqualTheCpuReference) {
  const GgmlType type = GetParam();
  constexpr int64_t kRows = 8, kCols = 768, kTokens = 2;
  const int64_t blocks = kCols / 32;
  const std::vector<uint8_t> w = Rows(type, kRows, kCols, 9);
  const size_t row_bytes = GgmlRowBytes(type, kCols);
  const WeightView view{type, w.data(), kRows, kCols, row_bytes};
  const std::vector<uint8_t> packed = cpu_kernels::PackKQuantRows(view);
  ScalarActs acts;
  QuantizeTokens(type, kTokens, kCols, kRows, 4, 41, &acts);
  cpu_kernels::QuantMatMulArgs& args = acts.args;
  args.w = packed.data();
  args.row_stride = (kCols / q16::kSuperValues) * cpu_kernels::PackedKSuperBytes(type);
  const int64_t qs_stride = acts.qs_stride, ds_stride = acts.ds_stride;
  const std::vector<int16_t>& qs = acts.qs;
  const std::vector<float>&d = acts.d, &sx = acts.s, &y = acts.y;
  cpu_kernels::PackedKQuantReference(args, 0, kRows);
  for (int64_t t = 0; t < kTokens; ++t) {
    for (int64_t r = 0; r < kRows; ++r) {
      float acc = 0.0f;
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = w.data() + r * row_bytes + (b / 8) * GgmlRowBytes(type, 256);
        uint32_t xw[16];
        std::memcpy(xw, qs.data() + t * qs_stride + b * 32, sizeof(xw));
        const float dt = d[t * ds_stride + b], st = sx[t * ds_stride + b];
        const int j = static_cast<int>(b % 8);
        if (type == GgmlType::kQ4_K) acc = q16::KSubBlock<12>(blk, j, xw, dt, st, acc);
        if (type == GgmlType::kQ5_K) acc = q16::KSubBlock<13>(blk, j, xw, dt, st, acc);
        if (type == GgmlType::kQ6_K) acc = q16::KSubBlock<14>(blk, j, xw, dt, st, acc);
      }
      ASSERT_EQ(Bits(acc), Bits(y[t * kRows + r])) << "token " << t << " row " << r;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(KQuants, Q16KQuantTest,
                         ::testing::Values(GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return std::string(GgmlTypeName(static_cast<uint32_t>(info.param)));
                         });

// The staging of Q16MatVecKernel replayed on the host (q16_stage.h): every thread's 16-byte
// copies into a stage of StageUnits bytes, then every lane's reads of its blocks, for
// each type's block size (F16 / BF16's 64-byte blocks too), row lengths that take one stage or
// several, column slices and data 2 or 4 bytes past a 16-byte boundary. Each block must read back
// the bytes of global memory, every copy must stay inside the stage and inside the (16-byte padded)
// buffer.
struct StageCase {
  int block_bytes, values, per_lane;
};

void ReplayStages(const StageCase& c, int64_t rows, int64_t full_blocks, int64_t col_block,
                  int64_t blocks, size_t misalign) {
  const size_t full_row = static_cast<size_t>(full_blocks) * c.block_bytes;
  const size_t bytes = (misalign + rows * full_row + 15) / 16 * 16;  // padded as DeviceBuffer
  std::vector<uint8_t> store(bytes + 16);
  std::mt19937 rng(static_cast<uint32_t>(rows * 131 + blocks));
  for (uint8_t& b : store) b = static_cast<uint8_t>(rng());
  const uintptr_t lo = (reinterpret_cast<uintptr_t>(store.data()) + 15) & ~uintptr_t{15};
  const uintptr_t hi = lo + bytes;
  const uintptr_t data = lo + misalign + static_cast<size_t>(col_block) * c.block_bytes;
  const int lanes = cuda_internal::Q16LanesPerRow(blocks, c.per_lane);
  const int rows_per_block = q16::kStageThreads / lanes;
  const int chunk = c.per_lane * lanes;
  const int upr = q16::UnitsPerRow(chunk, c.block_bytes);
  const int stage_units = q16::StageUnits(c.per_lane, c.block_bytes);
  ASSERT_LE(rows_per_block * upr, stage_units) << "lanes " << lanes;
  const int slots = (stage_units + q16::kStageThreads - 1) / q16::kStageThreads;
  std::vector<uint8_t> stage(static_cast<size_t>(stage_units) * 16);
  for (int64_t row0 = 0; row0 < rows; row0 += rows_per_block) {
    const int rows_here = static_cast<int>(std::min<int64_t>(rows_per_block, rows - row0));
    for (int64_t c0 = 0; c0 < blocks; c0 += chunk) {
      const int cb = static_cast<int>(std::min<int64_t>(chunk, blocks - c0));
      const size_t chunk_bytes = static_cast<size_t>(cb) * c.block_bytes;
      std::fill(stage.begin(), stage.end(), 0xee);
      for (int t = 0; t < q16::kStageThreads; ++t) {
        for (int k = 0; k < slots; ++k) {
          const int u = t + k * q16::kStageThreads;
          int r, unit;
          q16::StageSlot(u, upr, &r, &unit);
          if (r >= rows_here || u >= rows_here * upr) continue;
          const uintptr_t start = data + (row0 + r) * full_row + c0 * c.block_bytes;
          if (unit >= q16::UnitsCovering(start, chunk_bytes)) continue;
          const uintptr_t src = (start & ~uintptr_t{15}) + 16 * static_cast<uintptr_t>(unit);
          ASSERT_GE(src, lo);
          ASSERT_LE(src + 16, hi) << "reads past the buffer";
          ASSERT_LE(static_cast<size_t>(u + 1) * 16, stage.size());
          std::memcpy(stage.data() + static_cast<size_t>(u) * 16,
                      reinterpret_cast<const void*>(src), 16);
        }
      }
      for (int r = 0; r < rows_here; ++r) {
        const uintptr_t start = data + (row0 + r) * full_row + c0 * c.block_bytes;
        const size_t off = q16::StagedRowOffset(r, upr, start);
        ASSERT_LE(off + chunk_bytes, stage.size());
        ASSERT_EQ(
            0, std::memcmp(stage.data() + off, reinterpret_cast<const void*>(start), chunk_bytes))
            << "row " << row0 + r << " chunk " << c0 << " blocks " << blocks;
      }
    }
  }
}

TEST(Q16Stage, EveryBlockReadsBackItsBytes) {
  const StageCase cases[] = {{18, 32, 4},   {20, 32, 4},   {34, 32, 4},  {64, 32, 2},
                             {144, 256, 1}, {176, 256, 1}, {210, 256, 1}};
  for (const StageCase& c : cases) {
    const int64_t per_4096 = 4096 / c.values;
    for (int64_t blocks : {int64_t{1}, int64_t{3}, per_4096 / 8 + 1, per_4096, 3 * per_4096 + 2}) {
      for (int64_t rows : {1, 5, 37, 70}) {
        for (size_t misalign : {size_t{0}, size_t{2}, size_t{4}, size_t{6}}) {
          // Q4_1 and the 4-byte K-quant blocks are 4-byte aligned; the rest 2.
          const bool four = c.block_bytes == 20 || c.block_bytes == 144 || c.block_bytes == 176;
          if (four && misalign % 4 != 0) continue;
          SCOPED_TRACE(::testing::Message() << "block " << c.block_bytes << " blocks " << blocks
                                            << " rows " << rows << " misalign " << misalign);
          ReplayStages(c, rows, blocks, 0, blocks, misalign);
          ReplayStages(c, rows, blocks + 3, 2, blocks, misalign);  // a column slice
          if (HasFatalFailure()) return;
        }
      }
    }
  }
}

// The launch-shape and scratch arithmetic the host side of the kernels uses.
TEST(Q16Launch, LanesPerRowDependOnTheRowLengthOnly) {
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(1, 4), 4);
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(16, 4), 4);
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(18, 4), 8);    // SmolLM2's 576 columns
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(48, 4), 16);   // 1536
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(128, 4), 32);  // 4096
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(448, 4), 32);  // 14336
  // K-quant super-blocks, one a lane per stage.
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(16, 1), 16);  // 4096
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(56, 1), 32);  // 14336: two stages
  EXPECT_EQ(cuda_internal::Q16LanesPerRow(3, 1), 4);
}

TEST(Q16Launch, ScratchLayoutIsAlignedAndDisjoint) {
  for (int64_t n : {1, 3, 17}) {
    for (int64_t cols : {32, 96, 576, 14336}) {
      const uintptr_t base = uintptr_t{1} << 20;  // never dereferenced
      const cuda_internal::Q16Acts a =
          cuda_internal::Q16ActsAt(reinterpret_cast<void*>(base), n, cols);
      const auto off = [&](const void* p) {
        return static_cast<size_t>(reinterpret_cast<uintptr_t>(p) - base);
      };
      EXPECT_EQ(off(a.qs), 0u);
      EXPECT_EQ(off(a.d) % 16, 0u);
      EXPECT_EQ(off(a.s) % 16, 0u);
      EXPECT_GE(off(a.d), static_cast<size_t>(n * cols) * 2);
      EXPECT_GE(off(a.s), off(a.d) + static_cast<size_t>(n * cols / 32) * 4);
      EXPECT_GE(cuda_internal::Q16ActsBytes(n, cols),
                off(a.s) + static_cast<size_t>(n * cols / 32) * 4);
    }
  }
}

}  // namespace
}  // namespace specnode
