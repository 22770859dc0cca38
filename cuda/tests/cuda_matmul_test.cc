// CudaMatMul against the CPU reference (MatMulReference: dequantise + double accumulation).
//
// Tolerance: for output y[t, r] the test allows
//     |y - ref| <= rtol * ||W[r]||_2 * ||x[t]||_2 + 1e-6
// (Cauchy-Schwarz bounds Σ|w x| by the norms, so this is relative to the size of the terms,
// not of their possibly cancelling sum). rtol per algorithm and type:
//   kFused, every type   2e-5  W is dequantised exactly (f16 scale x small int is exact in
//                              f32); only f32 accumulation over <= 1536 terms rounds.
//   kQuantAct            1e-4  x rounded to int16 blocks (<= 2^-16 of the block's max per
//                              value), as the CPU's MatMul rounds it; against the CPU's
//                              MatMul itself (same activations, same integer sums) 1e-5.
//   kCublas F32          2e-5  f32 GEMM (no TF32).
//   kCublas F16          1e-3  x rounded to f16 first: 2^-11 relative per product.
//   kCublas BF16         8e-3  x rounded to bf16 first: 2^-8 relative per product.
// Every kernel test skips without a GPU; the argument-validation tests run everywhere.
#include "cuda/cuda_matmul.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <ostream>
#include <random>
#include <string>
#include <vector>

#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"
#include "model/cpu/cpu_matmul.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode {

// Readable parameters in test listings (found by ADL; internal linkage, this file only).
static void PrintTo(GgmlType type, std::ostream* os) {
  *os << GgmlTypeName(static_cast<uint32_t>(type));
}

namespace {

using cuda_test::CudaTestWithParam;
using cuda_test::Download;
using cuda_test::Upload;

bool IsQuantised(GgmlType t) {
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0;
}

std::string Name(GgmlType t) { return std::string(GgmlTypeName(static_cast<uint32_t>(t))); }

// rows x cols view of a rows x full_cols matrix, starting col_offset values into each row.
struct Shape {
  const char* name;
  int64_t rows;
  int64_t cols;
  int64_t full_cols;
  int64_t col_offset;
};

// SmolLM2-135M projections (rows = output features), odd row counts that leave warps of a
// block idle, and column slices as tensor parallelism makes them. The slice at 32 columns
// starts Q4_0 / Q8_0 rows at 2-byte (not 4-byte) alignment.
const Shape kShapes[] = {
    {"q_576x576", 576, 576, 576, 0},
    {"up_1536x576", 1536, 576, 576, 0},
    {"down_576x1536", 576, 1536, 1536, 0},
    {"head_49152x576", 49152, 576, 576, 0},
    {"odd_37x96", 37, 96, 96, 0},
    {"odd_1x32", 1, 32, 32, 0},
    {"odd_1023x64", 1023, 64, 64, 0},
    {"slice_300x768_of_1536_at_32", 300, 768, 1536, 32},
    {"slice_576x512_of_1536_at_1024", 576, 512, 1536, 1024},
};

void PrintTo(const Shape& s, std::ostream* os) { *os << s.name; }

// A weight matrix in storage form on the host plus per-row L2 norms of its dequantised
// values (for the tolerance).
struct HostWeights {
  std::vector<uint8_t> bytes;
  std::vector<uint8_t> packed;  // K-quants: the CPU's packed copy (its MatMul needs it)
  WeightView view;              // host pointer
  std::vector<double> row_norm;
};

HostWeights MakeWeights(GgmlType type, const Shape& s, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(s.full_cols);
  HostWeights w;
  const size_t row_bytes = GgmlRowBytes(type, s.full_cols);
  w.bytes.resize(s.rows * row_bytes);
  for (int64_t r = 0; r < s.rows; ++r) {
    const float scale = 0.02f * (1.0f + static_cast<float>(r % 5));  // rows differ in range
    for (float& v : row) v = normal(rng) * scale + (r % 3 == 0 ? 0.01f : 0.0f);  // some offset
    QuantizeRow(type, row.data(), w.bytes.data() + r * row_bytes, s.full_cols);
  }
  w.view = {type, w.bytes.data() + GgmlRowBytes(type, s.col_offset), s.rows, s.cols, row_bytes};
  if (IsKQuantType(type)) {
    w.packed = PackWeights(w.view);
    w.view.packed = w.packed.data();
  }
  w.row_norm.resize(s.rows);
  for (int64_t r = 0; r < s.rows; ++r) {
    EmbeddingRow(w.view, r, row.data());
    double ss = 0.0;
    for (int64_t j = 0; j < s.cols; ++j) ss += static_cast<double>(row[j]) * row[j];
    w.row_norm[r] = std::sqrt(ss);
  }
  return w;
}

std::vector<float> MakeActs(int64_t n, int64_t cols, uint32_t seed) {
  std::vector<float> x = cuda_test::RandomVector(n * cols, seed);
  for (size_t i = 0; i < x.size(); i += 97) x[i] *= 20.0f;  // outliers, as real activations have
  return x;
}

// Weights and activations on the device, with the reference result for n_max tokens.
struct Problem {
  HostWeights host;
  std::vector<float> x;    // [n_max, cols]
  std::vector<float> ref;  // [n_max, rows]
  DeviceBuffer w_dev;
  DeviceBuffer x_dev;
  DeviceBuffer y_dev;
  WeightView view_dev;
};

absl::Status MakeProblem(GgmlType type, const Shape& s, int64_t n_max, Problem* p) {
  p->host = MakeWeights(type, s, 1234u + static_cast<uint32_t>(s.rows));
  p->x = MakeActs(n_max, s.cols, 99u + static_cast<uint32_t>(s.cols));
  p->ref.assign(n_max * s.rows, 0.0f);
  MatMulReference(p->host.view, p->x.data(), n_max, p->ref.data());
  absl::StatusOr<DeviceBuffer> w = Upload(p->host.bytes);
  if (!w.ok()) return w.status();
  p->w_dev = std::move(*w);
  absl::StatusOr<DeviceBuffer> x = Upload(p->x);
  if (!x.ok()) return x.status();
  p->x_dev = std::move(*x);
  absl::StatusOr<DeviceBuffer> y = DeviceBuffer::Allocate(n_max * s.rows * sizeof(float));
  if (!y.ok()) return y.status();
  p->y_dev = std::move(*y);
  p->view_dev = p->host.view;
  p->view_dev.packed = nullptr;
  p->view_dev.data = p->w_dev.as<uint8_t>() + GgmlRowBytes(type, s.col_offset);
  return absl::OkStatus();
}

// Runs n tokens and compares with the first n rows of `ref` (the problem's reference when
// null).
void ExpectMatchesReference(CudaMatMulContext* ctx, Problem& p, int64_t n, CudaMatMulAlgo algo,
                            double rtol, const std::vector<float>* ref = nullptr) {
  const std::vector<float>& want_rows = ref != nullptr ? *ref : p.ref;
  const WeightView& v = p.view_dev;
  SPECNODE_ASSERT_OK(p.y_dev.Zero());
  SPECNODE_ASSERT_OK(CudaMatMul(ctx, v, p.x_dev.as<float>(), n, p.y_dev.as<float>(), algo));
  absl::StatusOr<std::vector<float>> y = Download<float>(p.y_dev, n * v.rows);
  ASSERT_TRUE(y.ok()) << y.status();
  int failures = 0;
  for (int64_t t = 0; t < n; ++t) {
    double xs = 0.0;
    for (int64_t j = 0; j < v.cols; ++j)
      xs += static_cast<double>(p.x[t * v.cols + j]) * p.x[t * v.cols + j];
    const double x_norm = std::sqrt(xs);
    for (int64_t r = 0; r < v.rows; ++r) {
      const double want = want_rows[t * v.rows + r];
      const double got = (*y)[t * v.rows + r];
      const double tol = rtol * p.host.row_norm[r] * x_norm + 1e-6;
      if (!(std::abs(got - want) <= tol) && ++failures <= 5) {
        ADD_FAILURE() << "n=" << n << " y[" << t << ", " << r << "] = " << got << ", want " << want
                      << " (tol " << tol << ")";
      }
    }
  }
  EXPECT_EQ(failures, 0) << "n=" << n;
}

using MatMulParam = std::tuple<GgmlType, Shape>;

std::string ParamName(const ::testing::TestParamInfo<MatMulParam>& info) {
  return Name(std::get<0>(info.param)) + "_" + std::get<1>(info.param).name;
}

class CudaFusedMatMulTest : public CudaTestWithParam<MatMulParam> {};

TEST_P(CudaFusedMatMulTest, MatchesReference) {
  const auto& [type, shape] = GetParam();
  Problem p;
  SPECNODE_ASSERT_OK(MakeProblem(type, shape, 16, &p));
  // 9 crosses a token-tile boundary (8); all n share one reference.
  for (int64_t n : {1, 4, 9, 16}) {
    ExpectMatchesReference(nullptr, p, n, CudaMatMulAlgo::kFused, 2e-5);
  }
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaFusedMatMulTest,
                         ::testing::Combine(::testing::Values(GgmlType::kQ4_1, GgmlType::kQ4_0,
                                                              GgmlType::kQ8_0, GgmlType::kF16,
                                                              GgmlType::kBF16, GgmlType::kF32),
                                            ::testing::ValuesIn(kShapes)),
                         ParamName);

class CudaFusedInvarianceTest : public CudaTestWithParam<GgmlType> {};

// A token's output is bit-identical whether it runs alone or inside a batch (any position).
TEST_P(CudaFusedInvarianceTest, BatchInvariant) {
  const GgmlType type = GetParam();
  const Shape shape = {"up", 1536, 576, 576, 0};
  Problem p;
  SPECNODE_ASSERT_OK(MakeProblem(type, shape, 16, &p));
  const int64_t rows = shape.rows, cols = shape.cols;
  SPECNODE_ASSERT_OK(CudaMatMul(nullptr, p.view_dev, p.x_dev.as<float>(), 16, p.y_dev.as<float>()));
  absl::StatusOr<std::vector<float>> batch = Download<float>(p.y_dev, 16 * rows);
  ASSERT_TRUE(batch.ok()) << batch.status();
  absl::StatusOr<DeviceBuffer> single = DeviceBuffer::Allocate(4 * rows * sizeof(float));
  ASSERT_TRUE(single.ok()) << single.status();
  for (int64_t t : {0, 5, 9, 15}) {
    SPECNODE_ASSERT_OK(
        CudaMatMul(nullptr, p.view_dev, p.x_dev.as<float>() + t * cols, 1, single->as<float>()));
    absl::StatusOr<std::vector<float>> alone = Download<float>(*single, rows);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(0, std::memcmp(alone->data(), batch->data() + t * rows, rows * sizeof(float)))
        << "token " << t << " differs between batch 1 and batch 16";
  }
  // Tokens 9..12 as a batch of 4 starting mid-tile.
  SPECNODE_ASSERT_OK(
      CudaMatMul(nullptr, p.view_dev, p.x_dev.as<float>() + 9 * cols, 4, single->as<float>()));
  absl::StatusOr<std::vector<float>> four = Download<float>(*single, 4 * rows);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(0, std::memcmp(four->data(), batch->data() + 9 * rows, 4 * rows * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaFusedInvarianceTest,
                         ::testing::Values(GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0,
                                           GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return Name(info.param);
                         });

class CudaSharedInputTest : public CudaTestWithParam<GgmlType> {};

// Q/K/V-like matrices (different row counts, one not a multiple of the block's 4 warps) in
// one launch give bit-identical outputs to one CudaMatMul each, at n across token tiles;
// a matrix of another type falls back to separate launches with the same results.
TEST_P(CudaSharedInputTest, OneLaunchEqualsSeparateCalls) {
  const GgmlType type = GetParam();
  const Shape shapes[] = {{"q", 576, 576, 576, 0}, {"k", 190, 576, 576, 0}, {"v", 5, 576, 576, 0}};
  Problem p[3];
  for (int i = 0; i < 3; ++i) SPECNODE_ASSERT_OK(MakeProblem(type, shapes[i], 17, &p[i]));
  const float* x = p[0].x_dev.as<float>();  // shared input [17, 576]
  for (int64_t n : {1, 8, 9, 17}) {
    std::vector<std::vector<float>> separate(3);
    for (int i = 0; i < 3; ++i) {
      SPECNODE_ASSERT_OK(CudaMatMul(nullptr, p[i].view_dev, x, n, p[i].y_dev.as<float>()));
      absl::StatusOr<std::vector<float>> y = Download<float>(p[i].y_dev, n * shapes[i].rows);
      ASSERT_TRUE(y.ok()) << y.status();
      separate[i] = *y;
      SPECNODE_ASSERT_OK(p[i].y_dev.Zero());
    }
    const WeightView ws[] = {p[0].view_dev, p[1].view_dev, p[2].view_dev};
    float* const ys[] = {p[0].y_dev.as<float>(), p[1].y_dev.as<float>(), p[2].y_dev.as<float>()};
    SPECNODE_ASSERT_OK(CudaMatMulSharedInput(nullptr, ws, x, n, ys));
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::vector<float>> y = Download<float>(p[i].y_dev, n * shapes[i].rows);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(*y, separate[i]) << "matrix " << i << " n=" << n;
    }
  }
  // Mixed types: the last matrix in F32 instead.
  Problem f32;
  SPECNODE_ASSERT_OK(MakeProblem(GgmlType::kF32, shapes[2], 17, &f32));
  SPECNODE_ASSERT_OK(CudaMatMul(nullptr, f32.view_dev, x, 9, f32.y_dev.as<float>()));
  absl::StatusOr<std::vector<float>> want = Download<float>(f32.y_dev, 9 * shapes[2].rows);
  ASSERT_TRUE(want.ok()) << want.status();
  SPECNODE_ASSERT_OK(f32.y_dev.Zero());
  const WeightView mixed[] = {p[0].view_dev, f32.view_dev};
  float* const mixed_ys[] = {p[0].y_dev.as<float>(), f32.y_dev.as<float>()};
  SPECNODE_ASSERT_OK(CudaMatMulSharedInput(nullptr, mixed, x, 9, mixed_ys));
  absl::StatusOr<std::vector<float>> got = Download<float>(f32.y_dev, 9 * shapes[2].rows);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, *want);
}

INSTANTIATE_TEST_SUITE_P(AllTypes, CudaSharedInputTest,
                         ::testing::Values(GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0,
                                           GgmlType::kF16, GgmlType::kBF16, GgmlType::kF32),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return Name(info.param);
                         });

// The staged algorithm for a type: kStaged for F16 / BF16 (f32 activations, tolerance as
// kFused), kQuantAct for the quantised types.
CudaMatMulAlgo StagedAlgo(GgmlType t) {
  return t == GgmlType::kF16 || t == GgmlType::kBF16 ? CudaMatMulAlgo::kStaged
                                                     : CudaMatMulAlgo::kQuantAct;
}

absl::StatusOr<std::unique_ptr<CudaMatMulContext>> NewContext() {
  return CudaMatMulContext::Create(nullptr);
}

// Shapes beyond SmolLM2's for kQuantAct: Llama-3-8B's row lengths (4096: one stage of 128
// blocks; 14336: three and a half stages), short rows (4 lanes a row), a 2-byte-aligned slice.
const Shape kQuantActShapes[] = {
    {"q_576x576", 576, 576, 576, 0},
    {"down_576x1536", 576, 1536, 1536, 0},
    {"head_49152x576", 49152, 576, 576, 0},
    {"odd_37x96", 37, 96, 96, 0},
    {"odd_1x32", 1, 32, 32, 0},
    {"rows_33x4096", 33, 4096, 4096, 0},
    {"down_70x14336", 70, 14336, 14336, 0},
    {"slice_300x768_of_1536_at_32", 300, 768, 1536, 32},
    {"slice_576x512_of_1536_at_1024", 576, 512, 1536, 1024},
};

class CudaQuantActMatMulTest : public CudaTestWithParam<MatMulParam> {};

TEST_P(CudaQuantActMatMulTest, MatchesReferenceAndTheCpu) {
  const auto& [type, shape] = GetParam();
  absl::StatusOr<std::unique_ptr<CudaMatMulContext>> ctx = NewContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Problem p;
  SPECNODE_ASSERT_OK(MakeProblem(type, shape, 40, &p));
  // The CPU's own product with int16 activations (its default).
  std::vector<float> cpu(40 * shape.rows);
  MatMulScratch scratch;
  MatMul(p.host.view, p.x.data(), 40, cpu.data(), nullptr, &scratch, ActQuant::kInt16);
  // 17: three tiles from one staging (n <= 32); 40: tiles spread over thread blocks.
  for (int64_t n : {1, 8, 9, 17, 40}) {
    const CudaMatMulAlgo algo = StagedAlgo(type);
    ExpectMatchesReference(ctx->get(), p, n, algo, algo == CudaMatMulAlgo::kStaged ? 2e-5 : 1e-4);
    ExpectMatchesReference(ctx->get(), p, n, algo, 1e-5, &cpu);
  }
}

// The K-quants natively (rows of whole 256-value super-blocks; a slice on a super-block).
const Shape kKQuantShapes[] = {
    {"odd_5x256", 5, 256, 256, 0},
    {"rows_33x4096", 33, 4096, 4096, 0},
    {"down_70x14336", 70, 14336, 14336, 0},
    {"slice_300x768_of_1536_at_512", 300, 768, 1536, 512},
};

INSTANTIATE_TEST_SUITE_P(KQuants, CudaQuantActMatMulTest,
                         ::testing::Combine(::testing::Values(GgmlType::kQ4_K, GgmlType::kQ5_K,
                                                              GgmlType::kQ6_K),
                                            ::testing::ValuesIn(kKQuantShapes)),
                         ParamName);

// F16 / BF16 under kStaged (rows staged as kQuantAct's, f32 activations).
INSTANTIATE_TEST_SUITE_P(Plain16, CudaQuantActMatMulTest,
                         ::testing::Combine(::testing::Values(GgmlType::kF16, GgmlType::kBF16),
                                            ::testing::ValuesIn(kQuantActShapes)),
                         ParamName);

INSTANTIATE_TEST_SUITE_P(QuantTypes, CudaQuantActMatMulTest,
                         ::testing::Combine(::testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1,
                                                              GgmlType::kQ8_0),
                                            ::testing::ValuesIn(kQuantActShapes)),
                         ParamName);

using QuantActInvarianceParam = std::tuple<GgmlType, Shape>;
class CudaQuantActInvarianceTest : public CudaTestWithParam<QuantActInvarianceParam> {};

// As CudaFusedInvarianceTest, for kQuantAct: a token's output is bit-identical alone, in a
// batch of 16 (two token tiles) or in a batch of 4 starting mid-tile.
TEST_P(CudaQuantActInvarianceTest, BatchInvariant) {
  const auto& [type, shape] = GetParam();
  absl::StatusOr<std::unique_ptr<CudaMatMulContext>> ctx = NewContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Problem p;
  SPECNODE_ASSERT_OK(MakeProblem(type, shape, 16, &p));
  const int64_t rows = shape.rows, cols = shape.cols;
  const auto algo = StagedAlgo(type);
  const float* x = p.x_dev.as<float>();
  SPECNODE_ASSERT_OK(CudaMatMul(ctx->get(), p.view_dev, x, 16, p.y_dev.as<float>(), algo));
  absl::StatusOr<std::vector<float>> batch = Download<float>(p.y_dev, 16 * rows);
  ASSERT_TRUE(batch.ok()) << batch.status();
  absl::StatusOr<DeviceBuffer> part = DeviceBuffer::Allocate(4 * rows * sizeof(float));
  ASSERT_TRUE(part.ok()) << part.status();
  for (int64_t t : {0, 5, 9, 15}) {
    SPECNODE_ASSERT_OK(
        CudaMatMul(ctx->get(), p.view_dev, x + t * cols, 1, part->as<float>(), algo));
    absl::StatusOr<std::vector<float>> alone = Download<float>(*part, rows);
    ASSERT_TRUE(alone.ok()) << alone.status();
    EXPECT_EQ(0, std::memcmp(alone->data(), batch->data() + t * rows, rows * sizeof(float)))
        << "token " << t << " differs between batch 1 and batch 16";
  }
  SPECNODE_ASSERT_OK(CudaMatMul(ctx->get(), p.view_dev, x + 9 * cols, 4, part->as<float>(), algo));
  absl::StatusOr<std::vector<float>> four = Download<float>(*part, 4 * rows);
  ASSERT_TRUE(four.ok()) << four.status();
  EXPECT_EQ(0, std::memcmp(four->data(), batch->data() + 9 * rows, 4 * rows * sizeof(float)));
}

INSTANTIATE_TEST_SUITE_P(
    QuantTypes, CudaQuantActInvarianceTest,
    ::testing::Combine(::testing::Values(GgmlType::kQ4_0, GgmlType::kQ4_1, GgmlType::kQ8_0),
                       ::testing::Values(Shape{"up_1536x576", 1536, 576, 576, 0},
                                         Shape{"down_70x14336", 70, 14336, 14336, 0})),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    KQuants, CudaQuantActInvarianceTest,
    ::testing::Combine(::testing::Values(GgmlType::kQ4_K, GgmlType::kQ6_K),
                       ::testing::Values(Shape{"rows_33x4096", 33, 4096, 4096, 0},
                                         Shape{"down_70x14336", 70, 14336, 14336, 0})),
    ParamName);

INSTANTIATE_TEST_SUITE_P(
    Plain16, CudaQuantActInvarianceTest,
    ::testing::Combine(::testing::Values(GgmlType::kF16, GgmlType::kBF16),
                       ::testing::Values(Shape{"up_1536x576", 1536, 576, 576, 0},
                                         Shape{"down_70x14336", 70, 14336, 14336, 0})),
    ParamName);

class CudaQuantActSharedTest : public CudaTestWithParam<GgmlType> {};

// Q/K/V-like matrices in one kQuantAct launch equal one kQuantAct CudaMatMul each.
TEST_P(CudaQuantActSharedTest, OneLaunchEqualsSeparateCalls) {
  const GgmlType type = GetParam();
  absl::StatusOr<std::unique_ptr<CudaMatMulContext>> ctx = NewContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const auto algo = StagedAlgo(type);
  const Shape shapes[] = {{"q", 576, 576, 576, 0}, {"k", 190, 576, 576, 0}, {"v", 5, 576, 576, 0}};
  Problem p[3];
  for (int i = 0; i < 3; ++i) SPECNODE_ASSERT_OK(MakeProblem(type, shapes[i], 17, &p[i]));
  const float* x = p[0].x_dev.as<float>();
  for (int64_t n : {1, 9, 17}) {
    std::vector<std::vector<float>> separate(3);
    for (int i = 0; i < 3; ++i) {
      SPECNODE_ASSERT_OK(CudaMatMul(ctx->get(), p[i].view_dev, x, n, p[i].y_dev.as<float>(), algo));
      absl::StatusOr<std::vector<float>> y = Download<float>(p[i].y_dev, n * shapes[i].rows);
      ASSERT_TRUE(y.ok()) << y.status();
      separate[i] = *y;
      SPECNODE_ASSERT_OK(p[i].y_dev.Zero());
    }
    const WeightView ws[] = {p[0].view_dev, p[1].view_dev, p[2].view_dev};
    float* const ys[] = {p[0].y_dev.as<float>(), p[1].y_dev.as<float>(), p[2].y_dev.as<float>()};
    SPECNODE_ASSERT_OK(CudaMatMulSharedInput(ctx->get(), ws, x, n, ys, algo));
    for (int i = 0; i < 3; ++i) {
      absl::StatusOr<std::vector<float>> y = Download<float>(p[i].y_dev, n * shapes[i].rows);
      ASSERT_TRUE(y.ok()) << y.status();
      EXPECT_EQ(*y, separate[i]) << "matrix " << i << " n=" << n;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(QuantTypes, CudaQuantActSharedTest,
                         ::testing::Values(GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0,
                                           GgmlType::kF16, GgmlType::kBF16),
                         [](const ::testing::TestParamInfo<GgmlType>& info) {
                           return Name(info.param);
                         });

class CudaQuantActArgsTest : public cuda_test::CudaTest {};

// Float weights are kFused's or kCublas's, and kCublas takes no quantised ones: refused.
TEST_F(CudaQuantActArgsTest, EachAlgorithmRefusesTheOthersTypes) {
  absl::StatusOr<std::unique_ptr<CudaMatMulContext>> ctx = NewContext();
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  auto* fake = reinterpret_cast<float*>(uintptr_t{1} << 20);  // never read
  const WeightView f16{GgmlType::kF16, fake, 4, 64, GgmlRowBytes(GgmlType::kF16, 64)};
  const WeightView q80{GgmlType::kQ8_0, fake, 4, 64, GgmlRowBytes(GgmlType::kQ8_0, 64)};
  EXPECT_EQ(CudaMatMul(ctx->get(), f16, fake, 1, fake, CudaMatMulAlgo::kQuantAct).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(CudaMatMul(ctx->get(), q80, fake, 1, fake, CudaMatMulAlgo::kCublas).code(),
            absl::StatusCode::kInvalidArgument);
}

class CudaCublasMatMulTest : public CudaTestWithParam<MatMulParam> {};

TEST_P(CudaCublasMatMulTest, MatchesReference) {
  const auto& [type, shape] = GetParam();
  const double rtol = type == GgmlType::kF32 ? 2e-5 : type == GgmlType::kF16 ? 1e-3 : 8e-3;
  absl::StatusOr<std::unique_ptr<CudaMatMulContext>> ctx = CudaMatMulContext::Create(nullptr);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  Problem p;
  SPECNODE_ASSERT_OK(MakeProblem(type, shape, 64, &p));
  for (int64_t n : {1, 16, 64}) {
    ExpectMatchesReference(ctx->get(), p, n, CudaMatMulAlgo::kCublas, rtol);
  }
}

const Shape kCublasShapes[] = {
    {"q_576x576", 576, 576, 576, 0},
    {"down_576x1536", 576, 1536, 1536, 0},
    {"odd_37x96", 37, 96, 96, 0},
    {"slice_300x768_of_1536_at_32", 300, 768, 1536, 32},
};

INSTANTIATE_TEST_SUITE_P(PlainTypes, CudaCublasMatMulTest,
                         ::testing::Combine(::testing::Values(GgmlType::kF32, GgmlType::kF16,
                                                              GgmlType::kBF16),
                                            ::testing::ValuesIn(kCublasShapes)),
                         ParamName);

// Argument checks happen before any CUDA call, so these run (and pass) without a GPU.
// The pointers are never dereferenced: every case must be rejected.
TEST(CudaMatMulArgs, RejectsBadArgumentsBeforeTouchingTheDevice) {
  auto* fake = reinterpret_cast<float*>(uintptr_t{1} << 20);  // 16-byte aligned, never read
  const WeightView q41{GgmlType::kQ4_1, fake, 4, 64, GgmlRowBytes(GgmlType::kQ4_1, 64)};
  auto code = [](absl::Status s) { return s.code(); };
  const auto kInvalid = absl::StatusCode::kInvalidArgument;

  WeightView bad = q41;
  bad.type = static_cast<GgmlType>(7);  // not a type this engine computes with
  EXPECT_EQ(code(CudaMatMul(nullptr, bad, fake, 1, fake)), kInvalid);
  bad = q41;
  bad.cols = 48;  // not whole blocks
  EXPECT_EQ(code(CudaMatMul(nullptr, bad, fake, 1, fake)), kInvalid);
  bad = q41;
  bad.row_stride = GgmlRowBytes(GgmlType::kQ4_1, 64) - 1;
  EXPECT_EQ(code(CudaMatMul(nullptr, bad, fake, 1, fake)), kInvalid);
  bad = q41;
  bad.data = reinterpret_cast<const uint8_t*>(fake) + 2;  // Q4_1 needs 4-byte alignment
  EXPECT_EQ(code(CudaMatMul(nullptr, bad, fake, 1, fake)), kInvalid);
  EXPECT_EQ(code(CudaMatMul(nullptr, q41, fake + 1, 1, fake)), kInvalid);  // x not 16-aligned
  EXPECT_EQ(code(CudaMatMul(nullptr, q41, nullptr, 1, fake)), kInvalid);
  EXPECT_EQ(code(CudaMatMul(nullptr, q41, fake, -1, fake)), kInvalid);
  // kCublas and kQuantAct need a context (and their types: checked once one exists).
  EXPECT_EQ(code(CudaMatMul(nullptr, q41, fake, 1, fake, CudaMatMulAlgo::kCublas)), kInvalid);
  EXPECT_EQ(code(CudaMatMul(nullptr, q41, fake, 1, fake, CudaMatMulAlgo::kQuantAct)), kInvalid);
  const float* const one_x = fake;
  float* const one_y[] = {fake};
  EXPECT_EQ(code(CudaMatMulSharedInput(nullptr, std::span<const WeightView>(&q41, 1), one_x, 1,
                                       one_y, CudaMatMulAlgo::kQuantAct)),
            kInvalid);
  // kStaged: F16 / BF16 only, whole 32-value blocks.
  EXPECT_EQ(code(CudaMatMul(nullptr, q41, fake, 1, fake, CudaMatMulAlgo::kStaged)), kInvalid);
  const WeightView f16_48{GgmlType::kF16, fake, 4, 48, GgmlRowBytes(GgmlType::kF16, 48)};
  EXPECT_EQ(code(CudaMatMul(nullptr, f16_48, fake, 1, fake, CudaMatMulAlgo::kStaged)), kInvalid);
  // K-quants run under kQuantAct only.
  const WeightView q4k{GgmlType::kQ4_K, fake, 4, 256, GgmlRowBytes(GgmlType::kQ4_K, 256)};
  EXPECT_EQ(code(CudaMatMul(nullptr, q4k, fake, 1, fake)), kInvalid);
  // Nothing to do: OK without touching the pointers or the device.
  EXPECT_TRUE(CudaMatMul(nullptr, q41, nullptr, 0, nullptr).ok());
}

TEST(CudaMatMulArgs, SharedInputRejectsBadArgumentsBeforeTouchingTheDevice) {
  auto* fake = reinterpret_cast<float*>(uintptr_t{1} << 20);
  const WeightView q41{GgmlType::kQ4_1, fake, 4, 64, GgmlRowBytes(GgmlType::kQ4_1, 64)};
  WeightView wide = q41;
  wide.cols = 96;
  wide.row_stride = GgmlRowBytes(GgmlType::kQ4_1, 96);
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  float* const one_y[] = {fake};
  float* const two_y[] = {fake, fake};
  float* const four_y[] = {fake, fake, fake, fake};
  const WeightView two[] = {q41, wide};  // cols differ
  const WeightView four[] = {q41, q41, q41, q41};
  EXPECT_EQ(CudaMatMulSharedInput(nullptr, two, fake, 1, two_y).code(), kInvalid);
  EXPECT_EQ(CudaMatMulSharedInput(nullptr, four, fake, 1, four_y).code(), kInvalid);
  EXPECT_EQ(
      CudaMatMulSharedInput(nullptr, std::span<const WeightView>(two, 1), fake, 1, two_y).code(),
      kInvalid);  // counts differ
  EXPECT_EQ(CudaMatMulSharedInput(nullptr, {}, fake, 1, {}).code(), kInvalid);
  EXPECT_EQ(
      CudaMatMulSharedInput(nullptr, std::span<const WeightView>(two, 1), nullptr, 1, one_y).code(),
      kInvalid);
  EXPECT_TRUE(CudaMatMulSharedInput(nullptr, std::span<const WeightView>(two, 1), nullptr, 0,
                                    std::span<float* const>(one_y, 1))
                  .ok());
}

}  // namespace
}  // namespace specnode
