// cuda_ops.h against model/cpu_ops.h. Tolerances (relative to the CPU value, plus a tiny
// absolute floor for values near zero):
//   RmsNorm   1e-6 rel + 1e-7   double sum in another order, scale rounded once: ~1 ulp.
//   RopeNorm  1e-6 abs          double angle / sincos within 2 ulp of glibc's, f32 rotation
//                               of O(1) values with the same (unfused) operations.
//   SwiGlu    2e-6 rel + 1e-12  expf within 2 ulp of glibc's.
//   Add       exact.
// Every test skips without a GPU (argument-validation tests run everywhere).
#include "cuda/cuda_ops.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <ostream>
#include <span>
#include <string>
#include <tuple>
#include <vector>

#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"
#include "model/cpu/cpu_ops.h"
#include "model/llama/sampling.h"

namespace specnode {
namespace {

using cuda_test::CudaTest;
using cuda_test::CudaTestWithParam;
using cuda_test::Download;
using cuda_test::RandomVector;
using cuda_test::Upload;

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want, double rtol,
                 double atol, const std::string& what) {
  ASSERT_EQ(got.size(), want.size());
  int failures = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = atol + rtol * std::abs(static_cast<double>(want[i]));
    if (!(std::abs(static_cast<double>(got[i]) - want[i]) <= tol) && ++failures <= 5) {
      ADD_FAILURE() << what << "[" << i << "] = " << got[i] << ", want " << want[i];
    }
  }
  EXPECT_EQ(failures, 0) << what;
}

// (rows n, dim)
class CudaRmsNormTest : public CudaTestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(CudaRmsNormTest, MatchesCpu) {
  const auto [n, dim] = GetParam();
  const std::vector<float> x = RandomVector(n * dim, 1, 3.0f);
  const std::vector<float> w = RandomVector(dim, 2);
  std::vector<float> want(x.size());
  RmsNorm(x.data(), w.data(), n, dim, 1e-5f, want.data());

  absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
  absl::StatusOr<DeviceBuffer> w_dev = Upload(w);
  absl::StatusOr<DeviceBuffer> y_dev = DeviceBuffer::Allocate(x.size() * sizeof(float));
  ASSERT_TRUE(x_dev.ok() && w_dev.ok() && y_dev.ok());
  SPECNODE_ASSERT_OK(
      CudaRmsNorm(x_dev->as<float>(), w_dev->as<float>(), n, dim, 1e-5f, y_dev->as<float>()));
  absl::StatusOr<std::vector<float>> y = Download<float>(*y_dev, x.size());
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectClose(*y, want, 1e-6, 1e-7, "rmsnorm");

  // In place gives the same bits as out of place.
  SPECNODE_ASSERT_OK(
      CudaRmsNorm(x_dev->as<float>(), w_dev->as<float>(), n, dim, 1e-5f, x_dev->as<float>()));
  absl::StatusOr<std::vector<float>> in_place = Download<float>(*x_dev, x.size());
  ASSERT_TRUE(in_place.ok()) << in_place.status();
  EXPECT_EQ(*in_place, *y);
}

// SmolLM2's hidden size 576 at decode (1) and verify (16) batches; odd and large dims.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaRmsNormTest,
                         ::testing::Values(std::make_tuple(1, 576), std::make_tuple(16, 576),
                                           std::make_tuple(3, 1), std::make_tuple(5, 7),
                                           std::make_tuple(2, 1000), std::make_tuple(4, 8192),
                                           std::make_tuple(1, 4096), std::make_tuple(2, 10001)));

// The producers' int16 outputs (q16) are the bytes LaunchQuantizeActs16 makes of what they
// wrote: the RMSNorm's (with and without the residual add), SwiGLU's and GeGLU's.
std::vector<uint8_t> ScratchBytes(const DeviceBuffer& b, size_t bytes) {
  absl::StatusOr<std::vector<uint8_t>> v = Download<uint8_t>(b, bytes);
  EXPECT_TRUE(v.ok()) << v.status();
  return v.ok() ? *v : std::vector<uint8_t>();
}

class CudaQ16OutputTest : public CudaTestWithParam<std::tuple<int64_t, int64_t>> {};

TEST_P(CudaQ16OutputTest, ProducersWriteTheStandaloneRounding) {
  const auto [n, dim] = GetParam();
  const size_t bytes = cuda_internal::Q16ActsBytes(n, dim);
  absl::StatusOr<DeviceBuffer> fused = DeviceBuffer::Allocate(bytes);
  absl::StatusOr<DeviceBuffer> alone = DeviceBuffer::Allocate(bytes);
  absl::StatusOr<DeviceBuffer> x = Upload(RandomVector(n * dim, 3, 2.0f));
  absl::StatusOr<DeviceBuffer> h = Upload(RandomVector(n * dim, 4, 0.5f));
  absl::StatusOr<DeviceBuffer> w = Upload(RandomVector(dim, 5));
  absl::StatusOr<DeviceBuffer> y = DeviceBuffer::Allocate(n * dim * sizeof(float));
  ASSERT_TRUE(fused.ok() && alone.ok() && x.ok() && h.ok() && w.ok() && y.ok());
  const cuda_internal::Q16Acts qf = cuda_internal::Q16ActsAt(fused->data(), n, dim);
  const cuda_internal::Q16Acts qa = cuda_internal::Q16ActsAt(alone->data(), n, dim);
  for (int op = 0; op < 4; ++op) {
    SPECNODE_ASSERT_OK(fused->Zero());
    SPECNODE_ASSERT_OK(alone->Zero());
    if (op == 0) {
      SPECNODE_ASSERT_OK(
          CudaRmsNorm(x->as<float>(), w->as<float>(), n, dim, 1e-5f, y->as<float>(), nullptr, &qf));
    } else if (op == 1) {
      SPECNODE_ASSERT_OK(CudaAddRmsNorm(x->as<float>(), h->as<float>(), w->as<float>(), n, dim,
                                        1e-5f, y->as<float>(), nullptr, &qf));
    } else if (op == 2) {
      SPECNODE_ASSERT_OK(
          CudaSwiGlu(x->as<float>(), h->as<float>(), n * dim, y->as<float>(), nullptr, &qf));
    } else {
      SPECNODE_ASSERT_OK(
          CudaGeGlu(x->as<float>(), h->as<float>(), n * dim, y->as<float>(), nullptr, &qf));
    }
    ASSERT_EQ(cuda_internal::LaunchQuantizeActs16(y->as<float>(), n, dim, qa, nullptr),
              cudaSuccess);
    EXPECT_EQ(ScratchBytes(*fused, bytes), ScratchBytes(*alone, bytes)) << "op " << op;
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaQ16OutputTest,
                         ::testing::Values(std::make_tuple(1, 576), std::make_tuple(9, 576),
                                           std::make_tuple(1, 4096), std::make_tuple(3, 1536)));

struct RopeCase {
  const char* name;
  int64_t n;
  int n_heads;
  int head_dim;
  int rope_dim;
  float base;
};

void PrintTo(const RopeCase& c, std::ostream* os) { *os << c.name; }

class CudaRopeNormTest : public CudaTestWithParam<RopeCase> {};

TEST_P(CudaRopeNormTest, MatchesCpu) {
  const RopeCase c = GetParam();
  std::vector<float> x = RandomVector(c.n * c.n_heads * c.head_dim, 5);
  std::vector<int32_t> positions(c.n);
  // Small, large and repeated positions (a verify batch can hold any).
  const int32_t kPositions[] = {0, 1, 2, 17, 4095, 8191, 100000, 3};
  for (int64_t t = 0; t < c.n; ++t) positions[t] = kPositions[t % 8] + static_cast<int32_t>(t / 8);
  absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
  absl::StatusOr<DeviceBuffer> pos_dev = Upload(positions);
  ASSERT_TRUE(x_dev.ok() && pos_dev.ok());
  RopeNorm(x.data(), positions.data(), c.n, c.n_heads, c.head_dim, c.rope_dim, c.base);
  SPECNODE_ASSERT_OK(CudaRopeNorm(x_dev->as<float>(), pos_dev->as<int32_t>(), c.n, c.n_heads,
                                  c.head_dim, c.rope_dim, c.base));
  absl::StatusOr<std::vector<float>> y = Download<float>(*x_dev, x.size());
  ASSERT_TRUE(y.ok()) << y.status();
  ExpectClose(*y, x, 0.0, 1e-6, "rope");
}

// SmolLM2: 9 query heads, 3 KV heads, head_dim 64, base 100000; a partial rotary dimension
// (dims past rope_dim must stay untouched) and a verify-sized batch.
INSTANTIATE_TEST_SUITE_P(Shapes, CudaRopeNormTest,
                         ::testing::Values(RopeCase{"q_decode", 1, 9, 64, 64, 100000.0f},
                                           RopeCase{"k_decode", 1, 3, 64, 64, 100000.0f},
                                           RopeCase{"q_verify", 16, 9, 64, 64, 100000.0f},
                                           RopeCase{"partial", 7, 2, 64, 32, 10000.0f},
                                           RopeCase{"odd_rope_dim", 3, 2, 16, 9, 10000.0f}),
                         [](const ::testing::TestParamInfo<RopeCase>& info) {
                           return std::string(info.param.name);
                         });

// Q and K rotated in one launch: bit-identical to one CudaRopeNorm call each.
// NeoX pairs (Qwen, Gemma) and frequency factors (Llama 3's rope_freqs.weight) against the
// CPU's RopeAngles + RopeApply, on Q and K in one launch.
TEST_P(CudaRopeNormTest, NeoxAndFrequencyFactorsMatchCpu) {
  const RopeCase c = GetParam();
  std::vector<int32_t> positions(c.n);
  const int32_t kPositions[] = {0, 1, 2, 17, 4095, 8191, 100000, 3};
  for (int64_t t = 0; t < c.n; ++t) positions[t] = kPositions[t % 8] + static_cast<int32_t>(t / 8);
  std::vector<float> factors(c.rope_dim / 2);
  for (size_t i = 0; i < factors.size(); ++i) factors[i] = 1.0f + static_cast<float>(i % 5) * 0.75f;
  absl::StatusOr<DeviceBuffer> pos_dev = Upload(positions);
  absl::StatusOr<DeviceBuffer> f_dev = Upload(factors);
  ASSERT_TRUE(pos_dev.ok() && f_dev.ok());
  for (bool neox : {true, false}) {
    for (bool with_factors : {false, true}) {
      std::vector<float> q = RandomVector(c.n * c.n_heads * c.head_dim, 6);
      std::vector<float> k = RandomVector(c.n * 2 * c.head_dim, 7);
      absl::StatusOr<DeviceBuffer> q_dev = Upload(q), k_dev = Upload(k);
      ASSERT_TRUE(q_dev.ok() && k_dev.ok());
      std::vector<float> table(c.n * c.rope_dim);
      RopeAngles(positions.data(), c.n, c.rope_dim, c.base, table.data(),
                 with_factors ? factors.data() : nullptr);
      RopeApply(q.data(), table.data(), c.n, c.n_heads, c.head_dim, c.rope_dim, neox);
      RopeApply(k.data(), table.data(), c.n, 2, c.head_dim, c.rope_dim, neox);
      SPECNODE_ASSERT_OK(CudaRopePair(
          q_dev->as<float>(), k_dev->as<float>(), pos_dev->as<int32_t>(), c.n, c.n_heads, 2,
          c.head_dim, c.rope_dim, c.base, neox, with_factors ? f_dev->as<float>() : nullptr));
      absl::StatusOr<std::vector<float>> gq = Download<float>(*q_dev, q.size());
      absl::StatusOr<std::vector<float>> gk = Download<float>(*k_dev, k.size());
      ASSERT_TRUE(gq.ok() && gk.ok());
      const std::string what =
          std::string(neox ? "neox" : "norm") + (with_factors ? "+factors" : "");
      ExpectClose(*gq, q, 0.0, 1e-6, what + " q");
      ExpectClose(*gk, k, 0.0, 1e-6, what + " k");
    }
  }
}

TEST_P(CudaRopeNormTest, PairEqualsTwoCalls) {
  const RopeCase c = GetParam();
  const int heads2 = c.n_heads + 1;  // a different head count for the second tensor
  const std::vector<float> a = RandomVector(c.n * c.n_heads * c.head_dim, 15);
  const std::vector<float> b = RandomVector(c.n * heads2 * c.head_dim, 16);
  std::vector<int32_t> positions(c.n);
  for (int64_t t = 0; t < c.n; ++t) positions[t] = static_cast<int32_t>(3 * t + 40);
  absl::StatusOr<DeviceBuffer> a1 = Upload(a), b1 = Upload(b), a2 = Upload(a), b2 = Upload(b),
                               pos = Upload(positions);
  ASSERT_TRUE(a1.ok() && b1.ok() && a2.ok() && b2.ok() && pos.ok());
  SPECNODE_ASSERT_OK(CudaRopeNorm(a1->as<float>(), pos->as<int32_t>(), c.n, c.n_heads, c.head_dim,
                                  c.rope_dim, c.base));
  SPECNODE_ASSERT_OK(CudaRopeNorm(b1->as<float>(), pos->as<int32_t>(), c.n, heads2, c.head_dim,
                                  c.rope_dim, c.base));
  SPECNODE_ASSERT_OK(CudaRopeNormPair(a2->as<float>(), b2->as<float>(), pos->as<int32_t>(), c.n,
                                      c.n_heads, heads2, c.head_dim, c.rope_dim, c.base));
  EXPECT_EQ(*Download<float>(*a2, a.size()), *Download<float>(*a1, a.size()));
  EXPECT_EQ(*Download<float>(*b2, b.size()), *Download<float>(*b1, b.size()));
}

class CudaSwiGluTest : public CudaTestWithParam<int64_t> {};

TEST_P(CudaSwiGluTest, MatchesCpu) {
  const int64_t n = GetParam();
  std::vector<float> gate = RandomVector(n, 7, 4.0f);
  const std::vector<float> up = RandomVector(n, 8);
  // Saturating inputs: exp overflows / underflows.
  const float kExtremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 88.0f, -88.0f, 1e-30f};
  for (size_t i = 0; i < sizeof(kExtremes) / sizeof(float) && i < gate.size(); ++i) {
    gate[i] = kExtremes[i];
  }
  std::vector<float> want(n);
  SwiGlu(gate.data(), up.data(), n, want.data());
  absl::StatusOr<DeviceBuffer> g_dev = Upload(gate);
  absl::StatusOr<DeviceBuffer> u_dev = Upload(up);
  absl::StatusOr<DeviceBuffer> o_dev = DeviceBuffer::Allocate(n * sizeof(float));
  ASSERT_TRUE(g_dev.ok() && u_dev.ok() && o_dev.ok());
  SPECNODE_ASSERT_OK(CudaSwiGlu(g_dev->as<float>(), u_dev->as<float>(), n, o_dev->as<float>()));
  absl::StatusOr<std::vector<float>> out = Download<float>(*o_dev, n);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectClose(*out, want, 2e-6, 1e-12, "swiglu");
}

// SmolLM2's FFN width 1536 at batch 1 and 16, and sizes off the block size.
INSTANTIATE_TEST_SUITE_P(Sizes, CudaSwiGluTest, ::testing::Values(1, 7, 1536, 16 * 1536 + 3));

// GeGLU (Gemma 3) in double as the CPU computes it: within an ulp or so, extremes included.
TEST_P(CudaSwiGluTest, GeGluMatchesCpu) {
  const int64_t n = GetParam();
  std::vector<float> gate = RandomVector(n, 17, 4.0f);
  const std::vector<float> up = RandomVector(n, 18);
  const float kExtremes[] = {0.0f, -0.0f, 100.0f, -100.0f, 20.0f, -20.0f, 1e-30f};
  for (size_t i = 0; i < sizeof(kExtremes) / sizeof(float) && i < gate.size(); ++i) {
    gate[i] = kExtremes[i];
  }
  std::vector<float> want(n);
  GeGlu(gate.data(), up.data(), n, want.data());
  absl::StatusOr<DeviceBuffer> g_dev = Upload(gate);
  absl::StatusOr<DeviceBuffer> u_dev = Upload(up);
  absl::StatusOr<DeviceBuffer> o_dev = DeviceBuffer::Allocate(n * sizeof(float));
  ASSERT_TRUE(g_dev.ok() && u_dev.ok() && o_dev.ok());
  SPECNODE_ASSERT_OK(CudaGeGlu(g_dev->as<float>(), u_dev->as<float>(), n, o_dev->as<float>()));
  absl::StatusOr<std::vector<float>> out = Download<float>(*o_dev, n);
  ASSERT_TRUE(out.ok()) << out.status();
  ExpectClose(*out, want, 4e-7, 1e-12, "geglu");
}

class CudaScaleBiasTest : public CudaTest {};

// The embedding scale and the Q/K/V biases: one f32 operation each, exactly the CPU's.
TEST_F(CudaScaleBiasTest, EqualTheCpuExactly) {
  const int64_t n = 9;
  const int dim = 896;  // Qwen2.5-0.5B's width
  std::vector<float> x = RandomVector(n * dim, 31);
  const std::vector<float> bias = RandomVector(dim, 32);
  absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
  absl::StatusOr<DeviceBuffer> b_dev = Upload(bias);
  ASSERT_TRUE(x_dev.ok() && b_dev.ok());
  SPECNODE_ASSERT_OK(CudaScale(x_dev->as<float>(), n * dim, 33.941125f));
  SPECNODE_ASSERT_OK(CudaAddBias(x_dev->as<float>(), b_dev->as<float>(), n, dim));
  ScaleInPlace(x.data(), n * dim, 33.941125f);
  for (int64_t r = 0; r < n; ++r) AddInPlace(x.data() + r * dim, bias.data(), dim);
  absl::StatusOr<std::vector<float>> got = Download<float>(*x_dev, n * dim);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, x);
}

class CudaAddInPlaceTest : public CudaTest {};

TEST_F(CudaAddInPlaceTest, MatchesCpuExactly) {
  const int64_t n = 576 * 16 + 5;
  std::vector<float> y = RandomVector(n, 9);
  const std::vector<float> x = RandomVector(n, 10);
  absl::StatusOr<DeviceBuffer> y_dev = Upload(y);
  absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
  ASSERT_TRUE(y_dev.ok() && x_dev.ok());
  AddInPlace(y.data(), x.data(), n);
  SPECNODE_ASSERT_OK(CudaAddInPlace(y_dev->as<float>(), x_dev->as<float>(), n));
  absl::StatusOr<std::vector<float>> got = Download<float>(*y_dev, n);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(*got, y);
}

class CudaArgMaxTest : public CudaTest {};

// Each row's arg max equals the host's ArgMax (lowest id on ties, +0 == -0), for vocabulary
// sizes around the block's stride; a row with a NaN or an infinity gives -1.
TEST_F(CudaArgMaxTest, EqualsTheHostArgMaxAndFlagsNonFiniteRows) {
  for (int64_t cols :
       {int64_t{1}, int64_t{255}, int64_t{256}, int64_t{257}, int64_t{49152}, int64_t{128256}}) {
    const int64_t n = 9;
    std::vector<float> x = RandomVector(n * cols, 21);
    // Row 1: a tie for the maximum far apart; row 2: all equal; row 3: +0 and -0 maxima;
    // row 4: a NaN; row 5: +inf; row 6: -inf.
    x[1 * cols + cols / 2] = 50.0f;
    x[1 * cols + cols - 1] = 50.0f;
    for (int64_t c = 0; c < cols; ++c) x[2 * cols + c] = 0.5f;
    for (int64_t c = 0; c < cols; ++c) x[3 * cols + c] = -1.0f - static_cast<float>(c % 3);
    x[3 * cols + cols - 1] = -0.0f;
    x[3 * cols + cols / 3] = 0.0f;
    x[4 * cols + cols / 2] = std::nanf("");
    x[5 * cols] = INFINITY;
    x[6 * cols + cols - 1] = -INFINITY;
    absl::StatusOr<DeviceBuffer> x_dev = Upload(x);
    absl::StatusOr<DeviceBuffer> ids_dev = DeviceBuffer::Allocate(n * sizeof(int32_t));
    ASSERT_TRUE(x_dev.ok() && ids_dev.ok());
    SPECNODE_ASSERT_OK(CudaArgMaxRows(x_dev->as<float>(), n, cols, ids_dev->as<int32_t>()));
    absl::StatusOr<std::vector<int32_t>> got = Download<int32_t>(*ids_dev, n);
    ASSERT_TRUE(got.ok()) << got.status();
    for (int64_t r = 0; r < n; ++r) {
      const std::span<const float> row(x.data() + r * cols, cols);
      const bool finite =
          std::all_of(row.begin(), row.end(), [](float v) { return std::isfinite(v); });
      EXPECT_EQ((*got)[r], finite ? ArgMax(row) : -1) << "cols " << cols << " row " << r;
    }
  }
}

class CudaAddRmsNormTest : public CudaTestWithParam<std::tuple<int64_t, int64_t>> {};

// x += h then the norm, in one launch: bit-identical to CudaAddInPlace + CudaRmsNorm (x and
// y), with y aliasing h as the forward pass uses it; and close to the CPU's AddInPlace +
// RmsNorm like the plain norm.
TEST_P(CudaAddRmsNormTest, EqualsAddThenNorm) {
  const auto [n, dim] = GetParam();
  const std::vector<float> x = RandomVector(n * dim, 21);
  const std::vector<float> h = RandomVector(n * dim, 22, 0.5f);
  const std::vector<float> w = RandomVector(dim, 23);
  absl::StatusOr<DeviceBuffer> x1 = Upload(x), x2 = Upload(x), h1 = Upload(h), h2 = Upload(h),
                               w_dev = Upload(w);
  absl::StatusOr<DeviceBuffer> y1 = DeviceBuffer::Allocate(n * dim * sizeof(float));
  ASSERT_TRUE(x1.ok() && x2.ok() && h1.ok() && h2.ok() && w_dev.ok() && y1.ok());
  SPECNODE_ASSERT_OK(CudaAddInPlace(x1->as<float>(), h1->as<float>(), n * dim));
  SPECNODE_ASSERT_OK(
      CudaRmsNorm(x1->as<float>(), w_dev->as<float>(), n, dim, 1e-5f, y1->as<float>()));
  SPECNODE_ASSERT_OK(CudaAddRmsNorm(x2->as<float>(), h2->as<float>(), w_dev->as<float>(), n, dim,
                                    1e-5f, h2->as<float>()));
  absl::StatusOr<std::vector<float>> want_x = Download<float>(*x1, n * dim);
  absl::StatusOr<std::vector<float>> want_y = Download<float>(*y1, n * dim);
  absl::StatusOr<std::vector<float>> got_x = Download<float>(*x2, n * dim);
  absl::StatusOr<std::vector<float>> got_y = Download<float>(*h2, n * dim);
  ASSERT_TRUE(want_x.ok() && want_y.ok() && got_x.ok() && got_y.ok());
  EXPECT_EQ(*got_x, *want_x);
  EXPECT_EQ(*got_y, *want_y);
  std::vector<float> cpu_x = x, cpu_y(n * dim);
  AddInPlace(cpu_x.data(), h.data(), n * dim);
  RmsNorm(cpu_x.data(), w.data(), n, dim, 1e-5f, cpu_y.data());
  EXPECT_EQ(*got_x, cpu_x);
  ExpectClose(*got_y, cpu_y, 1e-6, 1e-7, "add+rmsnorm");
}

INSTANTIATE_TEST_SUITE_P(Shapes, CudaAddRmsNormTest,
                         ::testing::Values(std::make_tuple(int64_t{1}, int64_t{576}),
                                           std::make_tuple(int64_t{9}, int64_t{576}),
                                           std::make_tuple(int64_t{3}, int64_t{1000}),
                                           std::make_tuple(int64_t{2}, int64_t{7})));

// Validation precedes any CUDA call: these run (and pass) without a GPU.
TEST(CudaOpsArgs, RejectBadArgumentsAndAcceptEmptyWork) {
  const auto kInvalid = absl::StatusCode::kInvalidArgument;
  EXPECT_EQ(CudaRmsNorm(nullptr, nullptr, 1, 0, 1e-5f, nullptr).code(), kInvalid);
  EXPECT_EQ(CudaRmsNorm(nullptr, nullptr, 1, 8, 1e-5f, nullptr).code(), kInvalid);
  EXPECT_EQ(CudaRopeNorm(nullptr, nullptr, 1, 2, 8, 10, 1e4f).code(), kInvalid);  // rope > head
  EXPECT_EQ(CudaRopeNorm(nullptr, nullptr, 1, 2, 8, 8, 1e4f).code(), kInvalid);   // null x
  float* fx = reinterpret_cast<float*>(uintptr_t{1} << 20);
  const int32_t* fp = reinterpret_cast<const int32_t*>(uintptr_t{1} << 21);
  EXPECT_EQ(CudaRopeNormPair(fx, nullptr, fp, 1, 2, 1, 8, 8, 1e4f).code(), kInvalid);  // null x2
  EXPECT_EQ(CudaRopeNormPair(fx, fx, fp, 1, 2, -1, 8, 8, 1e4f).code(), kInvalid);
  EXPECT_EQ(CudaSwiGlu(nullptr, nullptr, -1, nullptr).code(), kInvalid);
  EXPECT_EQ(CudaAddInPlace(nullptr, nullptr, 3).code(), kInvalid);
  EXPECT_EQ(CudaGeGlu(nullptr, nullptr, 4, nullptr).code(), kInvalid);
  EXPECT_EQ(CudaScale(nullptr, 4, 2.0f).code(), kInvalid);
  EXPECT_EQ(CudaAddBias(nullptr, nullptr, 1, 0).code(), kInvalid);
  EXPECT_TRUE(CudaScale(nullptr, 0, 2.0f).ok());
  float* fake = reinterpret_cast<float*>(uintptr_t{1} << 20);
  EXPECT_EQ(CudaArgMaxRows(nullptr, 2, 8, nullptr).code(), kInvalid);
  EXPECT_EQ(CudaArgMaxRows(fake, 1, 0, reinterpret_cast<int32_t*>(fake)).code(), kInvalid);
  EXPECT_TRUE(CudaArgMaxRows(nullptr, 0, 8, nullptr).ok());
  EXPECT_EQ(CudaAddRmsNorm(fake, fake, fake + 64, 1, 8, 1e-5f, fake + 128).code(), kInvalid);
  EXPECT_EQ(CudaAddRmsNorm(fake, fake + 64, fake + 128, 1, 8, 1e-5f, fake).code(), kInvalid);
  EXPECT_EQ(CudaAddRmsNorm(fake, nullptr, fake + 128, 1, 8, 1e-5f, fake + 64).code(), kInvalid);
  EXPECT_EQ(CudaAddRmsNorm(fake, fake + 64, fake + 128, 1, 0, 1e-5f, fake + 64).code(), kInvalid);
  EXPECT_TRUE(CudaAddRmsNorm(nullptr, nullptr, nullptr, 0, 8, 1e-5f, nullptr).ok());
  EXPECT_TRUE(CudaRmsNorm(nullptr, nullptr, 0, 8, 1e-5f, nullptr).ok());
  EXPECT_TRUE(CudaRopeNorm(nullptr, nullptr, 0, 2, 8, 8, 1e4f).ok());
  EXPECT_TRUE(CudaSwiGlu(nullptr, nullptr, 0, nullptr).ok());
  EXPECT_TRUE(CudaAddInPlace(nullptr, nullptr, 0).ok());
  // int16 outputs need whole 32-value blocks.
  const cuda_internal::Q16Acts q{reinterpret_cast<int16_t*>(fake), fake, fake};
  EXPECT_EQ(CudaRmsNorm(fake, fake, 1, 48, 1e-5f, fake + 64, nullptr, &q).code(), kInvalid);
  EXPECT_EQ(CudaSwiGlu(fake, fake, 40, fake, nullptr, &q).code(), kInvalid);
}

}  // namespace
}  // namespace specnode
