// MatMul against MatMulReference for every weight type, a spread of shapes, and every
// kernel table this CPU runs (SPECNODE_CPU=scalar|avx2 narrows the set); plus the batch-
// and thread-count invariance that speculative verification relies on, and MatMulShared
// against separate MatMuls.
//
// Tolerances, with S = Σ_j |w_j||x_j| for the output in question:
//  * F32/F16/BF16 weights: only f32 accumulation order differs from the double reference:
//      |y - ref| <= 1e-5 S.
//  * Quantised weights: activations are rounded to 16 bits, at most d_b/2 per value
//    (d_b = max|x| in block b / 32767, 258x finer than 8-bit's / 127), so the exact
//    reference is within
//      Σ_b (d_b / 2) Σ_{j in b} |w_j| + 1e-5 S   (<= (1/65534 + 1e-5) S).
//    Each path is also compared with the reference run on the activations quantised and
//    dequantised by the documented rule (cpu_kernels.h), which leaves only float rounding:
//    |y - ref_q| <= 1e-5 S.
//  * Int8 activations (ActQuant::kInt8, tables with an int8 kernel): the same two bounds
//    with d_b = max|x| / 127.
#include <cmath>
#include <cstring>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "model/cpu/cpu_features.h"
#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_matmul.h"
#include "model/cpu/cpu_repack.h"
#include "model/cpu/thread_pool.h"
#include "model/gguf/ggml_types.h"
#include "tests/model/matmul_test_util.h"

namespace specnode {
namespace {

using namespace matmul_test;  // NOLINT: the helpers of this test

struct Shape {
  int64_t rows, cols, n;
  int64_t full_cols = 0;   // > cols: a column-slice view of wider rows
  int64_t col_offset = 0;  // where the slice starts (block boundary)
};

std::string ShapeName(const Shape& s) {
  std::string name =
      std::to_string(s.rows) + "x" + std::to_string(s.cols) + "x" + std::to_string(s.n);
  if (s.full_cols > s.cols) name += "_slice" + std::to_string(s.col_offset);
  return name;
}

// Readable parameters in gtest's failure messages.
void PrintTo(const Shape& s, std::ostream* os) { *os << ShapeName(s); }

using Param = std::tuple<GgmlType, Shape, ActQuant>;

class MatMulTest : public ::testing::TestWithParam<Param> {};

TEST_P(MatMulTest, MatchesReferenceOnEveryKernel) {
  const auto [type, shape, act] = GetParam();
  if (!IsQuantised(type) && act == ActQuant::kInt8) GTEST_SKIP() << "float weights: f32 acts";
  if (IsQuantised(type) &&
      (shape.cols % GgmlBlockSize(type) != 0 || shape.col_offset % GgmlBlockSize(type) != 0)) {
    GTEST_SKIP() << "not blockable";
  }
  const int64_t full = std::max(shape.full_cols, shape.cols);
  const TestWeights w = MakeWeights(type, shape.rows, shape.cols, full, shape.col_offset, 7);
  const std::vector<float> x = MakeActs(shape.n, shape.cols, 11);
  const int64_t outs = shape.n * shape.rows;

  std::vector<float> ref(outs);
  MatMulReference(w.view, x.data(), shape.n, ref.data());
  const std::vector<double> abs_x = AbsDot(w.view, x, shape.n);
  std::vector<float> ref_q, xq;
  std::vector<double> quant_bound(outs, 0.0);
  if (IsQuantised(type)) {
    std::vector<float> half_step;
    xq = RoundTripActs(x, shape.n, shape.cols, act, &half_step);
    ref_q.resize(outs);
    MatMulReference(w.view, xq.data(), shape.n, ref_q.data());
    quant_bound = AbsDot(w.view, half_step, shape.n);
  }

  ThreadPool pool(2);
  MatMulScratch scratch;
  std::vector<float> packed_ref;  // the scalar x8 reference's outputs
  for (const KernelRun& run : RunsFor(type, act)) {
    SCOPED_TRACE(run.name());
    std::vector<uint8_t> storage;
    const WeightView v = ViewFor(w.view, run.packed, &storage);
    std::vector<float> y(outs, NAN);
    cpu_kernels::MatMulWith(*run.table, v, x.data(), shape.n, y.data(), &pool, &scratch, act);
    if (run.packed) {
      if (packed_ref.empty()) {
        packed_ref = y;
      } else {
        EXPECT_EQ(0, std::memcmp(y.data(), packed_ref.data(), outs * sizeof(float)))
            << "differs from PackedMatMulReference";
      }
    }
    int bad = 0;
    for (int64_t i = 0; i < outs && bad < 5; ++i) {
      const double s = abs_x[i];
      const double tol = 1e-5 * s + quant_bound[i] + 1e-30;
      if (!(std::fabs(y[i] - ref[i]) <= tol)) {
        ADD_FAILURE() << "out " << i << " y=" << y[i] << " ref=" << ref[i] << " tol=" << tol;
        ++bad;
      }
      if (IsQuantised(type)) {
        const double tol_q = 1e-5 * s + 1e-30;
        if (!(std::fabs(y[i] - ref_q[i]) <= tol_q)) {
          ADD_FAILURE() << "out " << i << " y=" << y[i] << " ref_q=" << ref_q[i]
                        << " tol=" << tol_q;
          ++bad;
        }
      }
    }
  }
}

const Shape kShapes[] = {
    {1, 32, 1},
    {7, 64, 3},
    {5, 37, 3},
    {3, 96, 5},
    {33, 544, 6},
    {576, 576, 1},
    {192, 576, 4},
    {1536, 576, 16},
    {576, 1536, 5},
    {49152, 64, 2},
    {40, 64, 3, 160, 32},
    {24, 96, 9, 576, 64},
    // Whole 256-value super-blocks (the K-quants' unit), slices at one.
    {9, 256, 1},
    {17, 512, 7},
    {64, 2048, 12},
    {40, 256, 3, 768, 256},
};

INSTANTIATE_TEST_SUITE_P(
    AllTypes, MatMulTest,
    ::testing::Combine(::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                         GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                         GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                         GgmlType::kQ5_K, GgmlType::kQ6_K),
                       ::testing::ValuesIn(kShapes),
                       ::testing::Values(ActQuant::kInt16, ActQuant::kInt8)),
    [](const ::testing::TestParamInfo<Param>& info) {
      return std::string(GgmlTypeName(static_cast<uint32_t>(std::get<0>(info.param)))) + "_" +
             ShapeName(std::get<1>(info.param)) + "_" + ActName(std::get<2>(info.param));
    });

// y[t, :] at batch n must equal, bit for bit, the same token run alone, and the result must
// not depend on the thread count: for every type, activation mode and kernel table.
class InvarianceTest : public ::testing::TestWithParam<std::tuple<GgmlType, ActQuant>> {};

TEST_P(InvarianceTest, BatchAndThreadInvariant) {
  const auto [type, act] = GetParam();
  const int64_t rows = 200, cols = IsKQuantType(type) ? 512 : 576;
  const TestWeights w = MakeWeights(type, rows, cols, cols, 0, 3);
  // Every token-tile size of every kernel (avx512: 1..8, avx2: 1..4), and several tiles
  // per row (n > 8, where the avx512 kernel converts weight scales once per row block).
  for (const int64_t n : {16, 13, 9, 8, 7, 6, 5, 4, 3, 2}) {
    const std::vector<float> x = MakeActs(n, cols, 9);
    for (const KernelRun& run : RunsFor(type, act)) {
      SCOPED_TRACE(run.name() + " n=" + std::to_string(n));
      const KernelTable* k = run.table;
      std::vector<uint8_t> storage, shifted_storage;
      const WeightView view = ViewFor(w.view, run.packed, &storage);
      std::vector<float> batch(n * rows);
      cpu_kernels::MatMulWith(*k, view, x.data(), n, batch.data(), nullptr, nullptr, act);
      for (int64_t t = 0; t < n; ++t) {
        std::vector<float> one(rows);
        cpu_kernels::MatMulWith(*k, view, x.data() + t * cols, 1, one.data(), nullptr, nullptr,
                                act);
        ASSERT_EQ(0, std::memcmp(one.data(), batch.data() + t * rows, rows * sizeof(float)))
            << "token " << t;
      }
      // Dropping the first rows shifts every row's position inside the kernels' row blocks
      // (and the packed groups of 8); results must not move.
      WeightView shifted = w.view;
      shifted.data = static_cast<const uint8_t*>(w.view.data) + 5 * w.view.row_stride;
      shifted.rows = rows - 5;
      shifted = ViewFor(shifted, run.packed, &shifted_storage);
      std::vector<float> tail(n * (rows - 5));
      cpu_kernels::MatMulWith(*k, shifted, x.data(), n, tail.data(), nullptr, nullptr, act);
      for (int64_t t = 0; t < n; ++t) {
        ASSERT_EQ(0, std::memcmp(tail.data() + t * (rows - 5), batch.data() + t * rows + 5,
                                 (rows - 5) * sizeof(float)))
            << "row offset, token " << t;
      }
      for (int threads : {2, 3}) {
        ThreadPool pool(threads);
        std::vector<float> y(n * rows);
        cpu_kernels::MatMulWith(*k, view, x.data(), n, y.data(), &pool, nullptr, act);
        ASSERT_EQ(0, std::memcmp(y.data(), batch.data(), y.size() * sizeof(float)))
            << threads << " threads";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(
    AllTypes, InvarianceTest,
    ::testing::Combine(::testing::Values(GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16,
                                         GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1,
                                         GgmlType::kQ5_0, GgmlType::kQ5_1, GgmlType::kQ4_K,
                                         GgmlType::kQ5_K, GgmlType::kQ6_K),
                       ::testing::Values(ActQuant::kInt16, ActQuant::kInt8)),
    [](const ::testing::TestParamInfo<std::tuple<GgmlType, ActQuant>>& info) {
      return std::string(GgmlTypeName(static_cast<uint32_t>(std::get<0>(info.param)))) + "_" +
             ActName(std::get<1>(info.param));
    });

// MatMulShared (one quantisation and one dispatch for several matrices of one input) must
// give exactly what one MatMul per matrix gives, whether or not the matrices can share.
TEST(MatMulSharedTest, EqualsSeparateMatMuls) {
  struct Case {
    std::vector<GgmlType> types;
    std::vector<int64_t> rows;
  };
  const int64_t cols = 576;
  const Case cases[] = {
      {{GgmlType::kQ4_1, GgmlType::kQ4_1, GgmlType::kQ4_1}, {576, 192, 192}},  // Q, K, V
      {{GgmlType::kQ4_0, GgmlType::kQ4_0}, {40, 7}},  // rows off the 16-row grain
      {{GgmlType::kQ8_0, GgmlType::kQ8_0}, {33, 64}},
      {{GgmlType::kF16, GgmlType::kF32, GgmlType::kBF16}, {20, 9, 31}},   // float: shared
      {{GgmlType::kQ4_1, GgmlType::kQ8_0, GgmlType::kF16}, {24, 17, 5}},  // cannot share
  };
  for (const Case& c : cases) {
    std::vector<TestWeights> ws;
    std::vector<WeightView> views;
    for (size_t i = 0; i < c.types.size(); ++i) {
      ws.push_back(
          MakeWeights(c.types[i], c.rows[i], cols, cols, 0, 20 + static_cast<uint32_t>(i)));
    }
    // As the CPU backend uploads them: every quantised matrix with its packed copy too
    // (used by tables with an x8 kernel, ignored by the others).
    std::vector<std::vector<uint8_t>> packed(ws.size());
    for (size_t i = 0; i < ws.size(); ++i) views.push_back(ViewFor(ws[i].view, true, &packed[i]));
    for (const int64_t n : {1, 5, 12}) {
      const std::vector<float> x = MakeActs(n, cols, 8);
      for (const ActQuant act : {ActQuant::kInt16, ActQuant::kInt8})
      for (const KernelTable* k : TablesFor(act)) {
        for (int threads : {1, 2}) {
          SCOPED_TRACE(std::string(k->name) + " " + ActName(act) + " n=" + std::to_string(n) +
                       " threads=" + std::to_string(threads) +
                       " first=" + std::string(GgmlTypeName(static_cast<uint32_t>(c.types[0]))));
          ThreadPool pool(threads);
          MatMulScratch scratch;
          std::vector<std::vector<float>> shared(views.size()), alone(views.size());
          std::vector<float*> ys;
          for (size_t i = 0; i < views.size(); ++i) {
            shared[i].assign(n * views[i].rows, NAN);
            alone[i].assign(n * views[i].rows, NAN);
            ys.push_back(shared[i].data());
          }
          cpu_kernels::MatMulSharedWith(*k, views, x.data(), n, ys, &pool, &scratch, act);
          for (size_t i = 0; i < views.size(); ++i) {
            cpu_kernels::MatMulWith(*k, views[i], x.data(), n, alone[i].data(), nullptr, nullptr,
                                    act);
            EXPECT_EQ(
                0, std::memcmp(shared[i].data(), alone[i].data(), alone[i].size() * sizeof(float)))
                << "matrix " << i;
          }
        }
      }
    }
  }
}

TEST(CpuFeaturesTest, SelectedKernelsMatchFeatures) {
  const CpuFeatures& f = GetCpuFeatures();
  EXPECT_EQ(CpuKernelName(), cpu_kernels::SelectedKernels().name);
  EXPECT_EQ(cpu_kernels::SupportedKernels().back(), &cpu_kernels::SelectedKernels());
  // The levels nest: no AVX-512 without AVX2, no VNNI without AVX-512.
  EXPECT_TRUE(!f.avx512 || f.avx2);
  EXPECT_TRUE(!f.avx512_vnni || f.avx512);
  EXPECT_TRUE(!f.avx_vnni || f.avx2);
}

TEST(MatMulDispatchTest, MatMulUsesSelectedKernels) {
  const TestWeights w = MakeWeights(GgmlType::kQ4_1, 64, 576, 576, 0, 1);
  const std::vector<float> x = MakeActs(3, 576, 2);
  std::vector<float> a(3 * 64), b(3 * 64);
  ThreadPool pool(2);
  MatMul(w.view, x.data(), 3, a.data(), &pool, nullptr);
  cpu_kernels::MatMulWith(cpu_kernels::SelectedKernels(), w.view, x.data(), 3, b.data(), nullptr,
                          nullptr);
  EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
}

// A column slice must compute exactly what the same bytes copied out compactly compute.
TEST(MatMulSliceTest, SliceEqualsCompactCopy) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                        GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    for (const Shape& shape : {Shape{40, 64, 3, 160, 32}, Shape{24, 96, 9, 576, 64}}) {
      SCOPED_TRACE(std::string(GgmlTypeName(static_cast<uint32_t>(type))) + " " + ShapeName(shape));
      const TestWeights w =
          MakeWeights(type, shape.rows, shape.cols, shape.full_cols, shape.col_offset, 7);
      const size_t row_bytes = GgmlRowBytes(type, shape.cols);
      std::vector<uint8_t> compact(shape.rows * row_bytes);
      for (int64_t r = 0; r < shape.rows; ++r) {
        std::memcpy(compact.data() + r * row_bytes,
                    static_cast<const uint8_t*>(w.view.data) + r * w.view.row_stride, row_bytes);
      }
      WeightView cv = w.view;
      cv.data = compact.data();
      cv.row_stride = row_bytes;
      const std::vector<float> x = MakeActs(shape.n, shape.cols, 5);
      for (const KernelTable* k : cpu_kernels::SupportedKernels()) {
        SCOPED_TRACE(k->name);
        std::vector<float> a(shape.n * shape.rows), b(a.size());
        cpu_kernels::MatMulWith(*k, w.view, x.data(), shape.n, a.data(), nullptr, nullptr);
        cpu_kernels::MatMulWith(*k, cv, x.data(), shape.n, b.data(), nullptr, nullptr);
        EXPECT_EQ(0, std::memcmp(a.data(), b.data(), a.size() * sizeof(float)));
      }
    }
  }
}

// Edge values: all-zero activations give exact zeros; Q8_0 weights of -128 (legal in the
// format though ggml never writes it) and 127, Q4 nibbles 0 and 15, activations at ±max.
TEST(MatMulEdgeTest, ZerosAndExtremes) {
  const int64_t rows = 6, cols = 96, n = 2;
  for (const ActQuant act : {ActQuant::kInt16, ActQuant::kInt8})
    for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1})
      for (const KernelRun& run : RunsFor(type, act)) {
        SCOPED_TRACE(run.name() + " " + ActName(act));
        const KernelTable* k = run.table;
        {
          const size_t row_bytes = GgmlRowBytes(type, cols);
          std::vector<uint8_t> w(rows * row_bytes);
          std::mt19937 rng(3);
          for (size_t i = 0; i < w.size(); ++i) w[i] = static_cast<uint8_t>(rng());
          // Sane scales (random bytes could make inf/nan halves), extreme quants.
          const size_t bb = GgmlBlockBytes(type);
          for (size_t b = 0; b < w.size() / bb; ++b) {
            uint8_t* blk = w.data() + b * bb;
            const uint16_t d = Fp32ToFp16(0.01f * static_cast<float>(1 + b % 3));
            std::memcpy(blk, &d, 2);
            if (type == GgmlType::kQ4_1) {
              const uint16_t m = Fp32ToFp16(-0.05f);
              std::memcpy(blk + 2, &m, 2);
            }
            const size_t qoff = type == GgmlType::kQ4_1 ? 4 : 2;
            const uint8_t extreme =
                type == GgmlType::kQ8_0 ? (b % 2 ? 0x80 : 0x7F) : (b % 2 ? 0x00 : 0xFF);
            for (size_t j = qoff; j < qoff + 4; ++j) blk[j] = extreme;
          }
          std::vector<uint8_t> storage;
          const WeightView view =
              ViewFor(WeightView{type, w.data(), rows, cols, row_bytes}, run.packed, &storage);
          std::vector<float> x(n * cols, 0.0f), y(n * rows, NAN), ref(n * rows);
          cpu_kernels::MatMulWith(*k, view, x.data(), n, y.data(), nullptr, nullptr, act);
          for (float v : y) EXPECT_EQ(v, 0.0f);
          for (int64_t i = 0; i < n * cols; ++i) x[i] = (i % 3 == 0) ? -1000.0f : 1000.0f;
          MatMulReference(view, x.data(), n, ref.data());
          const std::vector<double> s = AbsDot(view, x, n);
          cpu_kernels::MatMulWith(*k, view, x.data(), n, y.data(), nullptr, nullptr, act);
          for (int64_t i = 0; i < n * rows; ++i) {
            EXPECT_NEAR(y[i], ref[i], 1e-5 * s[i]) << GgmlTypeName(static_cast<uint32_t>(type));
          }
        }
      }
}

// Every x8 kernel equals the scalar x8 reference bit for bit for every token count 1..16
// (each tile size and the two-tile splits), row counts around the packed groups of 8 and
// the AVX-512 kernels' pairs of groups (a lone last group), and widths of 1, 3 and 5 blocks
// (K-quants: 1 and 3 super-blocks).
TEST(PackedMatMulTest, EqualsReferenceForEveryTokenCount) {
  for (const ActQuant act : {ActQuant::kInt16, ActQuant::kInt8})
    for (GgmlType type : {GgmlType::kQ8_0, GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ5_0,
                          GgmlType::kQ5_1, GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K}) {
      const std::vector<KernelRun> runs = PackedRunsFor(type, act);
      const std::vector<int64_t> widths =
          IsKQuantType(type) ? std::vector<int64_t>{256, 768} : std::vector<int64_t>{32, 96, 160};
      for (const int64_t rows : {1, 8, 9, 17, 24, 45}) {
        for (const int64_t cols : widths) {
          const TestWeights w = MakeWeights(type, rows, cols, cols, 0, 13);
          std::vector<uint8_t> storage;
          const WeightView view = ViewFor(w.view, true, &storage);
          for (int64_t n = 1; n <= 16; ++n) {
            const std::vector<float> x = MakeActs(n, cols, 17 + static_cast<uint32_t>(n));
            std::vector<float> want(n * rows, NAN);
            cpu_kernels::MatMulWith(kPackedReference, view, x.data(), n, want.data(), nullptr,
                                    nullptr, act);
            for (const KernelRun& run : runs) {
              SCOPED_TRACE(run.name() + " " + ActName(act) + " " +
                           std::string(GgmlTypeName(static_cast<uint32_t>(type))) +
                           " rows=" + std::to_string(rows) + " cols=" + std::to_string(cols) +
                           " n=" + std::to_string(n));
              std::vector<float> y(n * rows, NAN);
              cpu_kernels::MatMulWith(*run.table, view, x.data(), n, y.data(), nullptr, nullptr,
                                      act);
              ASSERT_EQ(0, std::memcmp(y.data(), want.data(), y.size() * sizeof(float)));
            }
          }
        }
      }
    }
}

TEST(EmbeddingRowTest, MatchesDequantizeRow) {
  for (GgmlType type : {GgmlType::kF32, GgmlType::kF16, GgmlType::kBF16, GgmlType::kQ8_0,
                        GgmlType::kQ4_0, GgmlType::kQ4_1}) {
    const TestWeights w = MakeWeights(type, 10, 64, 128, 32, 4);
    std::vector<float> got(64), want(64);
    EmbeddingRow(w.view, 7, got.data());
    DequantizeRow(type, static_cast<const uint8_t*>(w.view.data) + 7 * w.view.row_stride,
                  want.data(), 64);
    EXPECT_EQ(got, want);
  }
}

}  // namespace
}  // namespace specnode
