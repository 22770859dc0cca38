// Element-wise and per-row CPU operations of the Llama forward pass (the reference
// Backend's small ops; the matmuls live in cpu_matmul.h). All functions are pure, work on
// f32 row-major data and are batch-invariant: a row's result never depends on other rows.
#pragma once

#include <cstdint>

namespace specnode {

// y[r] = x[r] / sqrt(mean(x[r]^2) + eps) * weight, for n rows of dim values.
// x, y: [n, dim] (may alias); weight: [dim]. Sum accumulated in double.
void RmsNorm(const float* x, const float* weight, int64_t n, int64_t dim, float eps, float* y);

// Rotary position embedding in ggml "NORM" mode (adjacent pairs), in place.
// x: [n, n_heads, head_dim]; positions: [n]. Pair (2i, 2i+1) of each head is rotated by
// positions[t] * base^(-2i / rope_dim) for 2i < rope_dim; dims beyond rope_dim are untouched.
void RopeNorm(float* x, const int32_t* positions, int64_t n, int n_heads, int head_dim,
              int rope_dim, float base);

// RopeNorm in two halves, so a forward pass computes the angles once for all its layers
// and heads: RopeAngles fills table [n, rope_dim] with (cos, sin) of pair i of token t at
// table[t * rope_dim + 2i], table[t * rope_dim + 2i + 1] (angles in double, rounded to f32
// as RopeNorm does); RopeApply rotates x [n, n_heads, head_dim] by them. Together they are
// bit-identical to RopeNorm. With neox, RopeApply rotates dims (i, i + rope_dim/2) by pair
// i's angle instead (GPT-NeoX / ggml "NEOX" mode: Qwen, Gemma; their Q/K rows are not
// permuted by the converter).
// freq_factors [rope_dim / 2] (Llama 3.1's rope_freqs.weight; null: none) divide pair i's
// angle, as ggml's rope_ext does with its frequency factors.
void RopeAngles(const int32_t* positions, int64_t n, int rope_dim, float base, float* table,
                const float* freq_factors = nullptr);
void RopeApply(float* x, const float* table, int64_t n, int n_heads, int head_dim, int rope_dim,
               bool neox = false);

// out[i] = silu(gate[i]) * up[i] for n values; silu(g) = g / (1 + exp(-g)), with the exp of
// cpu_kernels.h (swiglu_exp: within 3e-7 relative of the exact formula for |g| <= 87; the
// same bits on every kernel table, so SPECNODE_CPU does not change them). out may alias
// gate or up.
void SwiGlu(const float* gate, const float* up, int64_t n, float* out);

// out[i] = gelu(gate[i]) * up[i] with GELU's tanh approximation, 0.5 g (1 + tanh(
// sqrt(2/pi) (g + 0.044715 g^3))) (GeGLU: Gemma), computed in double and rounded once, so
// every kernel table gives the same bits. out may alias gate or up.
void GeGlu(const float* gate, const float* up, int64_t n, float* out);

// x[i] *= s for n values.
void ScaleInPlace(float* x, int64_t n, float s);

// y[i] += x[i] for n values.
void AddInPlace(float* y, const float* x, int64_t n);

// Numerically stable softmax of n values in place; returns nothing for n == 0.
void SoftmaxInPlace(float* x, int64_t n);

}  // namespace specnode
