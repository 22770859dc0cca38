#include "model/cpu/cpu_ops.h"

#include <algorithm>
#include <cmath>
#include <vector>

#include "model/cpu/cpu_kernels.h"

namespace specnode {

void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y) {
  for (int64_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim;
    float* yr = y + r * dim;
    double sum = 0.0;
    for (int64_t i = 0; i < dim; ++i) sum += static_cast<double>(xr[i]) * xr[i];
    const float scale = static_cast<float>(1.0 / std::sqrt(sum / dim + eps));
    for (int64_t i = 0; i < dim; ++i) yr[i] = xr[i] * scale * weight[i];
  }
}

void RopeAngles(const int32_t* positions, int64_t n, int rope_dim, float base, float* table,
                const float* freq_factors) {
  // Angles are computed in double: at positions in the thousands a float product loses the
  // low bits that separate neighbouring positions.
  for (int64_t t = 0; t < n; ++t) {
    const double pos = positions[t];
    for (int i = 0; i < rope_dim / 2; ++i) {
      double theta = pos * std::pow(static_cast<double>(base), -2.0 * i / rope_dim);
      if (freq_factors != nullptr) theta /= freq_factors[i];
      table[t * rope_dim + 2 * i] = static_cast<float>(std::cos(theta));
      table[t * rope_dim + 2 * i + 1] = static_cast<float>(std::sin(theta));
    }
  }
}

void RopeApply(float* x, const float* table, int64_t n, int n_heads, int head_dim, int rope_dim,
               bool neox) {
  // Pair i is dims (2i, 2i+1) or, NeoX, (i, i + rope_dim/2); same angle either way.
  const int stride = neox ? 1 : 2;
  const int other = neox ? rope_dim / 2 : 1;
  for (int64_t t = 0; t < n; ++t) {
    for (int i = 0; i < rope_dim / 2; ++i) {
      const float c = table[t * rope_dim + 2 * i];
      const float s = table[t * rope_dim + 2 * i + 1];
      for (int h = 0; h < n_heads; ++h) {
        float* p = x + (t * n_heads + h) * head_dim + stride * i;
        const float a = p[0], b = p[other];
        p[0] = a * c - b * s;
        p[other] = a * s + b * c;
      }
    }
  }
}

void RopeNorm(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim,
              int rope_dim, float base) {
  std::vector<float> table(static_cast<size_t>(n) * rope_dim);
  RopeAngles(positions, n, rope_dim, base, table.data());
  RopeApply(x, table.data(), n, n_heads, head_dim, rope_dim);
}

void SwiGlu(const float* gate, const float* up, int64_t n, float* out) {
  cpu_kernels::SelectedKernels().swiglu(gate, up, n, out);
}

void GeGlu(const float* gate, const float* up, int64_t n, float* out) {
  constexpr double kSqrt2OverPi = 0.79788456080286535588;
  for (int64_t i = 0; i < n; ++i) {
    const double g = gate[i];
    const double gelu = 0.5 * g * (1.0 + std::tanh(kSqrt2OverPi * (g + 0.044715 * g * g * g)));
    out[i] = static_cast<float>(gelu * up[i]);
  }
}

void ScaleInPlace(float* x, int64_t n, float s) {
  for (int64_t i = 0; i < n; ++i) x[i] *= s;
}

void AddInPlace(float* y, const float* x, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += x[i];
}

void SoftmaxInPlace(float* x, int64_t n) {
  if (n <= 0) return;
  const float max = *std::max_element(x, x + n);
  double sum = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = std::exp(x[i] - max);
    sum += x[i];
  }
  const float inv = static_cast<float>(1.0 / sum);
  for (int64_t i = 0; i < n; ++i) x[i] *= inv;
}

}  // namespace specnode
