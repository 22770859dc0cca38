// Q5_0 / Q5_1 run natively by the x8 kernels (cpu_repack.h, KernelTable::q5_x8), beyond what
// cpu_matmul_test.cc's parameterised suites check for every type (reference bounds,
// bit-identity with PackedMatMulReference, batch invariance): the packed copy's size and
// codes, codes and activations at their extremes (bit 4 of every value set, or none), the
// bytes a matmul reads against the load-time conversion to Q8_0 it replaces, the native
// products against the converted ones, shared products, and which types MatMul runs as
// stored.
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_matmul.h"
#include "model/cpu/cpu_repack.h"
#include "model/cpu/cpu_repack_kquant.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"
#include "tests/model/matmul_test_util.h"

namespace specnode {
namespace {

using namespace matmul_test;  // NOLINT: the helpers of these tests

constexpr GgmlType kQ5Types[] = {GgmlType::kQ5_0, GgmlType::kQ5_1};

std::string Name(GgmlType t) { return std::string(GgmlTypeName(static_cast<uint32_t>(t))); }

// The packed copy holds exactly the file's bytes per block (22 / 24 for 32 values), 8 rows
// per group with the last padded, and every row's factors and 5-bit codes where
// cpu_repack.h puts them.
TEST(Q5PackTest, PackedLayoutHoldsTheFilesCodes) {
  const int64_t rows = 13, cols = 96, blocks = cols / 32;
  for (const GgmlType type : kQ5Types) {
    SCOPED_TRACE(Name(type));
    const size_t per_block = GgmlBlockBytes(type);
    EXPECT_EQ(cpu_kernels::PackedBlockBytes(type), 8 * per_block);
    EXPECT_EQ(cpu_kernels::PackedGroupBytes(type, blocks), blocks * 8 * per_block);
    const TestWeights w = MakeWeights(type, rows, cols, cols, 0, 1);
    const std::vector<uint8_t> packed = PackWeights(w.view);
    ASSERT_EQ(packed.size(), 2 * blocks * 8 * per_block);
    const size_t head = cpu_kernels::PackedHeadBytes(type);
    for (int64_t r = 0; r < 16; ++r) {
      const int i = static_cast<int>(r % 8);
      for (int64_t b = 0; b < blocks; ++b) {
        const uint8_t* blk = packed.data() + (r / 8) * cpu_kernels::PackedGroupBytes(type, blocks) +
                             b * cpu_kernels::PackedBlockBytes(type);
        Q5Codes want;  // padding rows: all zero
        if (r < rows) {
          DecodeQ5Block(
              type,
              static_cast<const uint8_t*>(w.view.data) + r * w.view.row_stride + b * per_block,
              &want);
        }
        uint16_t d, m = 0;
        std::memcpy(&d, blk + 2 * i, 2);
        if (type == GgmlType::kQ5_1) std::memcpy(&m, blk + 16 + 2 * i, 2);
        EXPECT_EQ(d, want.d) << "row " << r << " block " << b;
        EXPECT_EQ(m, want.m) << "row " << r << " block " << b;
        for (int v = 0; v < 32; ++v) {
          // Value v: nibble chunk c = (v % 16) / 2, byte 2i + v % 2, high nibble for v >= 16.
          const int c = (v % 16) / 2, part = v >= 16 ? 1 : 0, e = 2 * i + v % 2;
          const uint8_t nib = blk[head + 16 * c + e];
          const uint8_t hb = blk[head + 128 + 16 * cpu_kernels::KHighChunk(type, c) + e];
          const int code = ((part ? nib >> 4 : nib) & 0x0F) |
                           (((hb >> cpu_kernels::KHighShift(type, c, part)) & 1) << 4);
          ASSERT_EQ(code, want.q[v]) << "row " << r << " block " << b << " value " << v;
        }
      }
    }
  }
}

// Codes at their extremes: every code 31 (bit 4 set everywhere, the largest unsigned dot)
// or 0, Q5_1 minimums of either sign, against activations at full scale at both widths:
// each kernel stays within float rounding of the exact double product. All-zero
// activations give exact zeros.
TEST(Q5EdgeTest, ExtremeCodesAndActivations) {
  const int64_t rows = 17, cols = 160, n = 3;
  for (const GgmlType type : kQ5Types) {
    const size_t bb = GgmlBlockBytes(type);
    const size_t row_bytes = GgmlRowBytes(type, cols);
    std::vector<uint8_t> w(rows * row_bytes);
    for (size_t b = 0; b < w.size() / bb; ++b) {
      uint8_t* blk = w.data() + b * bb;
      std::memset(blk, b % 3 == 0 ? 0x00 : 0xFF, bb);  // codes 0 or 31
      const uint16_t d = Fp32ToFp16(0.001f * static_cast<float>(1 + b % 4));
      std::memcpy(blk, &d, 2);
      if (type == GgmlType::kQ5_1) {
        const uint16_t m = Fp32ToFp16(b % 2 ? -0.02f : 0.015f);
        std::memcpy(blk + 2, &m, 2);
      }
    }
    const WeightView raw{type, w.data(), rows, cols, row_bytes};
    std::vector<float> x(n * cols, 0.0f), ref(n * rows);
    for (const ActQuant act : {ActQuant::kInt16, ActQuant::kInt8}) {
      for (const KernelRun& run : PackedRunsFor(type, act)) {
        SCOPED_TRACE(run.name() + " " + Name(type) + " " + ActName(act));
        std::vector<uint8_t> storage;
        const WeightView view = ViewFor(raw, true, &storage);
        std::vector<float> y(n * rows, NAN);
        std::fill(x.begin(), x.end(), 0.0f);
        cpu_kernels::MatMulWith(*run.table, view, x.data(), n, y.data(), nullptr, nullptr, act);
        for (float v : y) EXPECT_EQ(v, 0.0f);
        for (int64_t i = 0; i < n * cols; ++i) x[i] = (i % 3 == 0) ? -1000.0f : 1000.0f;
        MatMulReference(raw, x.data(), n, ref.data());
        const std::vector<double> s = AbsDot(raw, x, n);
        cpu_kernels::MatMulWith(*run.table, view, x.data(), n, y.data(), nullptr, nullptr, act);
        // Activations of ±1000 round exactly at both widths (d = 1000 / qmax).
        for (int64_t i = 0; i < n * rows; ++i) EXPECT_NEAR(y[i], ref[i], 1e-5 * s[i] + 1e-6);
      }
    }
  }
}

// What native kernels buy over the load-time conversion to Q8_0 (ggml_converted_types.h):
// the bytes a matmul reads drop to the file's (22 / 24 against 34 per 32 values) where the
// kernels take Q5; and the products keep their precision — Q5_0's conversion is exact, so
// native and converted agree to float rounding; Q5_1's is a requantisation, whose error the
// native path does not have.
TEST(Q5FidelityTest, NativeReadsFewerBytesAndIsAtLeastAsClose) {
  const int64_t rows = 96, cols = 896, n = 4;
  const std::vector<float> x = MakeActs(n, cols, 21);
  std::vector<float> half_step;
  const std::vector<float> xq = RoundTripActs(x, n, cols, ActQuant::kInt16, &half_step);
  for (const GgmlType type : kQ5Types) {
    SCOPED_TRACE(Name(type));
    const TestWeights w = MakeWeights(type, rows, cols, cols, 0, 5);
    if (RunsStorageType(type, ActQuant::kInt16)) {
      EXPECT_EQ(MatMulReadBytes(w.view, ActQuant::kInt16),
                static_cast<int64_t>(GgmlRowBytes(type, cols) * rows));
    }
    ASSERT_EQ(ComputeTypeOf(type), GgmlType::kQ8_0);
    EXPECT_EQ(GgmlRowBytes(GgmlType::kQ8_0, cols) * 22, GgmlRowBytes(GgmlType::kQ5_0, cols) * 34);
    const NativeVsConverted e = CompareWithConversion(w.view, x, xq, n);
    RecordProperty(Name(type) + "_rms_native", std::to_string(std::sqrt(e.native_sq / (n * rows))));
    RecordProperty(Name(type) + "_rms_converted",
                   std::to_string(std::sqrt(e.converted_sq / (n * rows))));
    if (type == GgmlType::kQ5_0) {
      // Both are the exact product up to float rounding.
      const std::vector<double> s = AbsDot(w.view, xq, n);
      for (int64_t i = 0; i < n * rows; ++i) {
        EXPECT_NEAR(e.native[i], e.exact[i], 1e-5 * s[i]);
        EXPECT_NEAR(e.converted[i], e.exact[i], 1e-5 * s[i]);
      }
    } else {
      EXPECT_LT(e.native_sq * 4, e.converted_sq)
          << "native " << e.native_sq << " converted " << e.converted_sq;
    }
  }
}

// Q, K and V of one Q5 type share one activation quantisation and one dispatch; the results
// equal one MatMul per matrix, as for the other types (rows off the groups of 8 and 16).
TEST(Q5SharedTest, EqualsSeparateMatMuls) {
  for (const GgmlType type : kQ5Types) ExpectSharedEqualsSeparate(type, 896, {40, 9, 9}, {1, 9});
}

// A column slice (tensor parallelism splitting the input) packs its slice and computes what
// the same bytes copied out compactly compute.
TEST(Q5SliceTest, SliceEqualsCompactCopy) {
  const int64_t rows = 24, full = 896, cols = 448, offset = 448, n = 3;
  for (const GgmlType type : kQ5Types) {
    const TestWeights w = MakeWeights(type, rows, cols, full, offset, 7);
    const size_t row_bytes = GgmlRowBytes(type, cols);
    std::vector<uint8_t> compact(rows * row_bytes);
    for (int64_t r = 0; r < rows; ++r) {
      std::memcpy(compact.data() + r * row_bytes,
                  static_cast<const uint8_t*>(w.view.data) + r * w.view.row_stride, row_bytes);
    }
    const WeightView cv{type, compact.data(), rows, cols, row_bytes};
    const std::vector<float> x = MakeActs(n, cols, 5);
    for (const ActQuant act : {ActQuant::kInt16, ActQuant::kInt8})
      for (const KernelRun& run : PackedRunsFor(type, act)) {
        SCOPED_TRACE(run.name() + " " + Name(type) + " " + ActName(act));
        std::vector<uint8_t> s1, s2;
        const WeightView a_view = ViewFor(w.view, true, &s1), b_view = ViewFor(cv, true, &s2);
        std::vector<float> a(n * rows), b(n * rows);
        cpu_kernels::MatMulWith(*run.table, a_view, x.data(), n, a.data(), nullptr, nullptr, act);
        cpu_kernels::MatMulWith(*run.table, b_view, x.data(), n, b.data(), nullptr, nullptr, act);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
      }
  }
}

// Which storage types MatMul runs as stored, per activation width, on this CPU's kernels:
// Q5_0 / Q5_1 where the selected table's x8 kernel for the width that runs takes them.
TEST(Q5DispatchTest, RunsStorageTypeFollowsTheKernels) {
  const KernelTable& k = cpu_kernels::SelectedKernels();
  for (const GgmlType type : kQ5Types) {
    EXPECT_EQ(RunsStorageType(type, ActQuant::kInt16),
              k.q5_x8 && UsesPackedWeights(ActQuant::kInt16))
        << Name(type);
    const bool int8 = k.matmul_quant8 != nullptr;
    EXPECT_EQ(RunsStorageType(type, ActQuant::kInt8),
              (int8 ? k.q5_8_x8 : k.q5_x8) && UsesPackedWeights(ActQuant::kInt8))
        << Name(type);
  }
  // Every table with an x8 kernel here takes Q5 at the widths it runs.
  for (const KernelTable* t : cpu_kernels::SupportedKernels()) {
    if (t->matmul_quant_x8 != nullptr) {
      EXPECT_TRUE(t->q5_x8) << t->name;
    }
    if (t->matmul_quant8_x8 != nullptr) {
      EXPECT_TRUE(t->q5_8_x8) << t->name;
    }
  }
}

}  // namespace
}  // namespace specnode
