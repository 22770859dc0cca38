// kQuantAct on tensor cores (cuda_mma_kernels.cu) against the dp2a kernel and the host's
// canonical order (q16::CanonicalRow), bit for bit: the same int16 activations (rounded on
// the host by QuantizeBlock16, which equals the GPU's rounding byte for byte), every weight
// type, token counts on both sides of kQ16MmaMinTokens and partial 64 x 64 tiles. A token's
// result alone (dp2a) equals its result inside a large pass (tensor cores). Skips without a
// GPU (cuda/tests/q16_mma_test.cc checks the same arithmetic on the host everywhere).
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "cuda/cuda_matmul.h"
#include "cuda/cuda_mma_kernels.h"
#include "cuda/q16_order.h"
#include "cuda/tests/cuda_test_util.h"
#include "cuda/tests/q16_test_util.h"
#include "gtest/gtest.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode {
namespace {

using cuda_test::CudaTestWithParam;
using cuda_test::Download;
using cuda_test::RandomVector;
using cuda_test::Upload;

struct MmaCase {
  GgmlType type;
  int64_t rows, cols;
};

std::string CaseName(const ::testing::TestParamInfo<MmaCase>& info) {
  return std::string(GgmlTypeName(static_cast<uint32_t>(info.param.type))) + "_" +
         std::to_string(info.param.rows) + "x" + std::to_string(info.param.cols);
}

class CudaMmaTest : public CudaTestWithParam<MmaCase> {};

TEST_P(CudaMmaTest, TensorCoresEqualDp2aAndTheCanonicalOrder) {
  const MmaCase& c = GetParam();
  constexpr int64_t kMaxTokens = 300;
  const size_t row_bytes = GgmlRowBytes(c.type, c.cols);
  const std::vector<uint8_t> w = q16_test::Rows(c.type, c.rows, c.cols, 3);
  std::vector<float> x = RandomVector(kMaxTokens * c.cols, 5);
  for (size_t i = 0; i < x.size(); i += 29) x[i] *= 30.0f;  // outliers
  // The activations as the GPU rounds them.
  const int64_t subs = c.cols / 32;
  std::vector<int16_t> qs(kMaxTokens * c.cols);
  std::vector<float> d(kMaxTokens * subs), s(kMaxTokens * subs);
  for (int64_t b = 0; b < kMaxTokens * subs; ++b) {
    q16::QuantizeBlock16(x.data() + b * 32, qs.data() + b * 32, &d[b], &s[b]);
  }
  absl::StatusOr<DeviceBuffer> w_dev = Upload(w), x_dev = Upload(x);
  ASSERT_TRUE(w_dev.ok() && x_dev.ok());
  absl::StatusOr<DeviceBuffer> y_dev = DeviceBuffer::Allocate(kMaxTokens * c.rows * sizeof(float));
  ASSERT_TRUE(y_dev.ok()) << y_dev.status();
  absl::StatusOr<std::unique_ptr<CudaMatMulContext>> ctx = CudaMatMulContext::Create(nullptr);
  ASSERT_TRUE(ctx.ok()) << ctx.status();
  const WeightView view{c.type, w_dev->data(), c.rows, c.cols, row_bytes};
  auto run = [&](int64_t n, int64_t t0, bool tensor_cores) -> std::vector<float> {
    (*ctx)->set_tensor_cores(tensor_cores);
    const absl::Status st = CudaMatMul(ctx->get(), view, x_dev->as<float>() + t0 * c.cols, n,
                                       y_dev->as<float>(), CudaMatMulAlgo::kQuantAct);
    EXPECT_TRUE(st.ok()) << st;
    absl::StatusOr<std::vector<float>> y = Download<float>(*y_dev, n * c.rows);
    EXPECT_TRUE(y.ok()) << y.status();
    return y.ok() ? *y : std::vector<float>();
  };
  for (int64_t n : {cuda_internal::kQ16MmaMinTokens, int64_t{64}, int64_t{100}, kMaxTokens}) {
    const std::vector<float> mma = run(n, 0, true);
    const std::vector<float> dp2a = run(n, 0, false);
    ASSERT_EQ(mma.size(), static_cast<size_t>(n * c.rows));
    ASSERT_EQ(dp2a.size(), mma.size());
    for (int64_t t = 0; t < n; ++t) {
      for (int64_t r = 0; r < c.rows; ++r) {
        const float want =
            q16_test::CanonicalOf(c.type, w.data() + r * row_bytes, c.cols, qs.data() + t * c.cols,
                                  d.data() + t * subs, s.data() + t * subs);
        const size_t i = t * c.rows + r;
        ASSERT_EQ(0, std::memcmp(&mma[i], &want, 4))
            << "n " << n << " token " << t << " row " << r << ": " << mma[i] << " vs " << want;
        ASSERT_EQ(0, std::memcmp(&dp2a[i], &want, 4))
            << "n " << n << " token " << t << " row " << r << ": " << dp2a[i] << " vs " << want;
      }
    }
  }
  // A token alone (dp2a) inside the large pass (tensor cores).
  const std::vector<float> pass = run(kMaxTokens, 0, true);
  for (int64_t t : {int64_t{0}, int64_t{63}, int64_t{64}, kMaxTokens - 1}) {
    const std::vector<float> alone = run(1, t, true);
    ASSERT_EQ(alone.size(), static_cast<size_t>(c.rows));
    EXPECT_EQ(0, std::memcmp(alone.data(), pass.data() + t * c.rows, c.rows * sizeof(float)))
        << "token " << t;
  }
}

INSTANTIATE_TEST_SUITE_P(
    Types, CudaMmaTest,
    ::testing::Values(MmaCase{GgmlType::kQ4_0, 70, 352}, MmaCase{GgmlType::kQ4_0, 576, 1536},
                      MmaCase{GgmlType::kQ4_1, 130, 576}, MmaCase{GgmlType::kQ8_0, 64, 4096},
                      MmaCase{GgmlType::kQ8_0, 33, 96}, MmaCase{GgmlType::kQ4_K, 70, 768},
                      MmaCase{GgmlType::kQ5_K, 64, 4096}, MmaCase{GgmlType::kQ6_K, 70, 768},
                      MmaCase{GgmlType::kQ6_K, 100, 14336}),
    CaseName);

}  // namespace
}  // namespace specnode
