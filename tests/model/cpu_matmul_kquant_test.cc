// K-quants (Q4_K, Q5_K, Q6_K) run natively by the x8 kernels (cpu_repack_kquant.h), beyond
// what cpu_matmul_test.cc's parameterised suites check for every type (reference bounds,
// bit-identity with PackedKQuantReference, batch invariance): the packed size, the factors
// and codes at their extremes (where an int32 sum of a Q6_K block would overflow if the
// halves were not kept apart), native against the load-time conversion it replaces, shared
// products, embedding rows, and which types MatMul runs as stored.
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

constexpr GgmlType kKTypes[] = {GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K};

std::string Name(GgmlType t) { return std::string(GgmlTypeName(static_cast<uint32_t>(t))); }

// The packed copy's bytes per 256 values and row: the file's, plus 4 for Q4_K / Q5_K (their
// 6-bit factors unpacked to bytes); 8 rows of every group, the last padded.
TEST(KQuantPackTest, PackedSizeIsTheFilesPlusUnpackedFactors) {
  const int per_row[] = {148, 180, 210};
  for (int i = 0; i < 3; ++i) {
    const GgmlType type = kKTypes[i];
    EXPECT_EQ(cpu_kernels::PackedKSuperBytes(type), 8u * per_row[i]) << Name(type);
    const TestWeights w = MakeWeights(type, 13, 768, 768, 0, 1);
    EXPECT_EQ(PackWeights(w.view).size(), 2u * 3 * 8 * per_row[i]) << Name(type);
    EXPECT_EQ(cpu_kernels::PackedGroupBytes(type, 768 / 32), 3u * 8 * per_row[i]);
  }
}

// Every super-block field at its extreme: the largest 6-bit factors (sc = m = 63), codes all
// at their maximum or zero, Q6_K scales of -128 and 127 with codes 0 (value -32) and 63,
// against activations at full scale, so every block's integer sums are as large as the
// format allows. Each kernel must stay within float rounding of the exact double product.
TEST(KQuantEdgeTest, ExtremeFactorsAndCodes) {
  const int64_t rows = 16, cols = 512, n = 3;
  for (const GgmlType type : kKTypes) {
    const size_t bb = GgmlBlockBytes(type);
    const size_t row_bytes = GgmlRowBytes(type, cols);
    std::vector<uint8_t> w(rows * row_bytes);
    for (size_t b = 0; b < w.size() / bb; ++b) {
      uint8_t* blk = w.data() + b * bb;
      const uint8_t fill = b % 2 ? 0xFF : 0x00;
      if (type == GgmlType::kQ6_K) {
        BlockQ6K k;
        std::memset(&k, fill, sizeof(k));  // codes 63 or 0
        for (int h = 0; h < 16; ++h) k.scales[h] = static_cast<int8_t>(h % 2 ? -128 : 127);
        k.d = Fp32ToFp16(0.002f);
        std::memcpy(blk, &k, sizeof(k));
      } else {
        std::memset(blk, 0xFF, bb);  // every 6-bit factor 63, every code its maximum
        if (b % 3 == 0) std::memset(blk + 16, fill, bb - 16);  // or all codes 0 (and m = 0)
        const uint16_t d = Fp32ToFp16(0.001f), dmin = Fp32ToFp16(0.0005f);
        std::memcpy(blk, &d, 2);
        std::memcpy(blk + 2, &dmin, 2);
      }
    }
    const WeightView raw{type, w.data(), rows, cols, row_bytes};
    std::vector<float> x(n * cols);
    for (int64_t i = 0; i < n * cols; ++i) {
      x[i] = (i / cols == 0) ? 1000.0f : ((i % 3 == 0) ? -1000.0f : 1000.0f);
    }
    std::vector<float> ref(n * rows);
    MatMulReference(raw, x.data(), n, ref.data());
    const std::vector<double> s = AbsDot(raw, x, n);
    // Activations of ±1000 round exactly at both widths (d = 1000 / qmax).
    for (const ActQuant act : {ActQuant::kInt16, ActQuant::kInt8}) {
      for (const KernelRun& run : PackedRunsFor(type, act)) {
        SCOPED_TRACE(run.name() + " " + Name(type) + " " + ActName(act));
        std::vector<uint8_t> storage;
        const WeightView view = ViewFor(raw, true, &storage);
        std::vector<float> y(n * rows, NAN);
        cpu_kernels::MatMulWith(*run.table, view, x.data(), n, y.data(), nullptr, nullptr, act);
        for (int64_t i = 0; i < n * rows; ++i) EXPECT_NEAR(y[i], ref[i], 1e-5 * s[i] + 1e-6);
      }
    }
  }
}

// What native kernels buy over the load-time conversion (ggml_converted_types.h): the
// native products differ from the exact product of the stored weights and the rounded
// activations by float rounding only; the converted matrices (Q4_K -> Q4_1 with f16
// factors, Q5_K / Q6_K requantised to Q8_0) by their conversion error, which must be larger.
TEST(KQuantFidelityTest, NativeIsCloserThanConversion) {
  const int64_t rows = 96, cols = 1024, n = 4;
  const std::vector<float> x = MakeActs(n, cols, 21);
  std::vector<float> half_step;
  const std::vector<float> xq = RoundTripActs(x, n, cols, ActQuant::kInt16, &half_step);
  for (const GgmlType type : kKTypes) {
    SCOPED_TRACE(Name(type));
    const TestWeights w = MakeWeights(type, rows, cols, cols, 0, 5);
    const NativeVsConverted e = CompareWithConversion(w.view, x, xq, n);
    RecordProperty(Name(type) + "_rms_native", std::to_string(std::sqrt(e.native_sq / (n * rows))));
    RecordProperty(Name(type) + "_rms_converted",
                   std::to_string(std::sqrt(e.converted_sq / (n * rows))));
    EXPECT_LT(e.native_sq * 4, e.converted_sq)
        << "native " << e.native_sq << " converted " << e.converted_sq;
  }
}

// Q, K and V of one K-quant type share one activation quantisation and one dispatch; the
// results equal one MatMul per matrix, as for the other types.
TEST(KQuantSharedTest, EqualsSeparateMatMuls) {
  for (const GgmlType type : kKTypes) ExpectSharedEqualsSeparate(type, 768, {48, 17, 17}, {1, 6});
}

// Embedding lookups read the stored rows (a tied K-quant output matrix keeps its file bytes).
TEST(KQuantEmbeddingTest, RowsMatchDequantizeRow) {
  for (const GgmlType type : kKTypes) {
    const TestWeights w = MakeWeights(type, 10, 256, 768, 256, 4);
    std::vector<float> got(256), want(256);
    EmbeddingRow(w.view, 7, got.data());
    DequantizeRow(type, static_cast<const uint8_t*>(w.view.data) + 7 * w.view.row_stride,
                  want.data(), 256);
    EXPECT_EQ(got, want) << Name(type);
  }
}

// Which storage types MatMul runs as stored, per activation width, on this CPU's kernels.
TEST(KQuantDispatchTest, RunsStorageTypeFollowsTheKernels) {
  const KernelTable& k = cpu_kernels::SelectedKernels();
  for (const GgmlType type : {GgmlType::kF32, GgmlType::kQ4_1, GgmlType::kQ8_0}) {
    EXPECT_TRUE(RunsStorageType(type, ActQuant::kInt16));
    EXPECT_TRUE(RunsStorageType(type, ActQuant::kInt8));
  }
  for (const GgmlType type : kKTypes) {
    EXPECT_EQ(RunsStorageType(type, ActQuant::kInt16),
              k.kquant_x8 && UsesPackedWeights(ActQuant::kInt16))
        << Name(type);
    // int8 where the table runs int8: its int8 K-quant kernel decides.
    const bool int8 = k.matmul_quant8 != nullptr;
    EXPECT_EQ(RunsStorageType(type, ActQuant::kInt8),
              (int8 ? k.kquant8_x8 : k.kquant_x8) && UsesPackedWeights(ActQuant::kInt8))
        << Name(type);
  }
}

}  // namespace
}  // namespace specnode
