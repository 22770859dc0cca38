// Fused dequantise-matmul on CPU: y = x · Wᵀ with W kept in its storage type.
//
// Weight layout (ggml): W has `rows` output features; each row holds `cols` input values
// encoded in `type` and starts `row_stride` bytes after the previous one. A column slice
// (tensor parallelism splitting the input dimension) is a view whose data points inside
// each row at a block boundary, with row_stride still the full row's bytes.
//
// Batch invariance: y[t, r] is computed by the same instruction sequence whatever the
// number of tokens n and however rows are split across threads, so a row's result is
// bit-identical at batch 1 and batch 16 (speculative verification relies on this).
//
// For quantised W the activations are first quantised to 16-bit blocks of 32 with one f32
// scale per block (llama.cpp's Q8_1 scheme with int16 instead of int8, which keeps greedy
// decoding on a float reference's path) and the dot products run in integer SIMD;
// F32/F16/BF16 W use f32 activations.
//
// ActQuant::kInt8 (opt-in, --activations int8) rounds activations to 8 bits instead, as
// llama.cpp does: on AVX-512 VNNI the integer dots take half the instructions, which speeds
// up batched matmuls (verification rows, many sequences per step); a single token's matmul
// is bound by weight bandwidth and gains little. Logits move by the coarser rounding (a
// greedy path can leave the float reference's at near-ties). Batch invariance holds in
// both modes. CPUs without an int8 kernel run the int16 path (ActQuantName reports it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "model/cpu/act_quant.h"
#include "model/cpu/finite.h"
#include "model/cpu/thread_pool.h"
#include "model/gguf/ggml_types.h"
#include "model/gguf/weight_view.h"

namespace specnode {

// "int16" / "int8": the name of what MatMul actually runs for `requested` on this CPU
// (int8 falls back to int16 where the selected kernel table has no int8 kernel).
const char* ActQuantName(ActQuant requested);

// True when MatMul with `act` on this CPU's kernels reads WeightView::packed (an x8 kernel for
// the activations that actually run): only then is a packed copy worth its memory.
// SPECNODE_REPACK=0 in the environment makes it false (the natural-layout kernels run:
// for A/B benchmarks and diagnosis, as llama.cpp's --no-repack); read once.
bool UsesPackedWeights(ActQuant act);
// True when MatMul with `act` on this CPU runs a matrix of `type` as stored (with its packed
// copy, PackWeights): every compute type (IsComputeGgmlType), and Q4_K / Q5_K / Q6_K / Q5_0 /
// Q5_1 where packed weights are used and the selected kernels have x8 kernels for the type
// and the activations that run (KernelTable::kquant_x8 / kquant8_x8, q5_x8 / q5_8_x8).
// Matrices of other types must be converted to their compute type first
// (ConvertToComputeType, llama_weights.h). SPECNODE_KQUANT_NATIVE=0 in the environment makes
// it false for the K-quants, SPECNODE_Q5_NATIVE=0 for Q5_0 / Q5_1 (converted as before
// native kernels existed: for A/B benchmarks and diagnosis); read once.
bool RunsStorageType(GgmlType type, ActQuant act);
// The row-interleaved copy of `w` that WeightView::packed may point at (cpu_repack.h), or
// an empty vector when w's type has no packed layout (float types).
std::vector<uint8_t> PackWeights(const WeightView& w);

// Bytes of weights one MatMul with `act` reads for a matrix stored as `w` on this CPU: its
// converted type when RunsStorageType says no, its packed copy's size when UsesPackedWeights
// and the type packs, else rows x GgmlRowBytes (what bandwidth fractions are stated from).
int64_t MatMulReadBytes(const WeightView& w, ActQuant act);

// Scratch for quantised activations, reused between calls to avoid allocation.
struct MatMulScratch {
  std::vector<uint8_t> buffer;
};

// y[n, w.rows] = x[n, w.cols] · Wᵀ. `pool` may be nullptr (single thread). A K-quant or
// Q5_0 / Q5_1 W needs its packed copy and an x8 kernel for its type (else: an assertion, NaN
// in release builds); it runs int16 activations where the table has no int8 kernel for it.
void MatMul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool,
            MatMulScratch* scratch, ActQuant act = ActQuant::kInt16);

// Several products of one input: ys[i][n, ws[i].rows] = x[n, cols] · ws[i]ᵀ (Q, K and V of
// a layer; gate and up). Results are bit-identical to one MatMul per matrix; when every
// matrix has the same cols and the same quantised type (or all are float types) the
// activations are quantised once and all rows are split across the pool in one dispatch,
// which saves a pool hand-off and a quantisation per extra matrix.
void MatMulShared(std::span<const WeightView> ws, const float* x, int64_t n,
                  std::span<float* const> ys, ThreadPool* pool, MatMulScratch* scratch,
                  ActQuant act = ActQuant::kInt16);

// Reference implementation: dequantise each row with DequantizeRow and accumulate in
// double. Used by tests only.
void MatMulReference(const WeightView& w, const float* x, int64_t n, float* y);

// Copy row `row` of an embedding matrix stored as W (any supported type) into dst[cols].
void EmbeddingRow(const WeightView& w, int64_t row, float* dst);

}  // namespace specnode
