// Storage formats of one cached K or V row (one token, one kv head, `head_dim` values) in
// the KV store, and the math on them that attention needs, without dequantising a whole
// cache. Pure functions, thread-safe.
//
// Precision classes and their row layouts (head_dim d, even, <= 256):
//   kFull  d x f16 (IEEE half)                                  2d bytes
//   kInt8  f32 scale, then d x int8; value = scale * q         4 + d bytes
//          symmetric: scale = max|x| / 127, q = round(x / scale) in [-127, 127]
//   kInt4  f16 scale, f16 min, then d/2 bytes of nibbles;       4 + d/2 bytes
//          value = min + scale * q, q in [0, 15]; asymmetric per row:
//          scale = (max - min) / 15, q = round((x - min) / scale);
//          byte i holds q[2i] in its low nibble and q[2i+1] in its high nibble
//   kInt2  f16 scale, f16 min, then ceil(d/4) bytes of 2-bit codes; 4 + ceil(d/4) bytes
//          value = min + scale * q, q in [0, 3]; byte i holds q[4i + j] in bits 2j, 2j + 1.
//          The four levels are centred on the row's mean and their spacing chosen for the
//          least squared error over the row (kvstore/kv_row_codec.h, EncodeInt2Row, the one
//          definition the CPU and the GPU run), so extreme values may be clipped.
// Classes. A token's slot holds a K and a V row per kv head, each in its class's format
// (KvRowFormat), except the cold class kInt2: its V rows are int2 and its K rows int4.
// Keys at 2 bits cost ~3.5x the perplexity of values at 2 bits on SmolLM2 (a key's error
// moves every score, and exp turns zero-mean noise into a bias toward the noisy tokens;
// a value's error averages out): docs/kvstore.md, "The cold tier".
// Rows are written with memcpy-safe layouts: no alignment is required of `row`.
// Full precision is f16 (not f32) so that byte ratios compare against what a GPU engine
// stores; CPU math converts on the fly.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string_view>

namespace specnode {

// Ordered from the most precise to the least (a demotion moves a token down this list).
enum class KvPrecision : uint8_t { kFull = 0, kInt8 = 1, kInt4 = 2, kInt2 = 3 };
inline constexpr int kNumKvPrecisions = 4;

std::string_view KvPrecisionName(KvPrecision p);  // "f16", "int8", "int4", "int2"

// Bytes of one row of head_dim values in format p.
size_t KvRowBytes(KvPrecision p, int head_dim);

// The format of class c's K rows (value false) or V rows (value true).
constexpr KvPrecision KvRowFormat(KvPrecision c, bool value) {
  return c == KvPrecision::kInt2 && !value ? KvPrecision::kInt4 : c;
}
// Bytes of one kv head's K and V rows of a token in class c (the slot holds n_kv_heads of
// these per layer: [kv_head][K row | V row]).
size_t KvPairBytes(KvPrecision c, int head_dim);

// Encodes x[head_dim] into row[KvRowBytes(p, head_dim)].
void KvEncodeRow(KvPrecision p, const float* x, int head_dim, uint8_t* row);

// Decodes row into out[head_dim].
void KvDecodeRow(KvPrecision p, const uint8_t* row, int head_dim, float* out);

// Worst-case absolute error of one decoded value for a row whose values span [lo, hi]
// (used by tests and the accuracy report): f16 relative rounding, int8 scale/2, int4 scale/2,
// int2 the row's span (it may clip).
double KvMaxAbsError(KvPrecision p, double lo, double hi);

// In-place orthonormal Walsh-Hadamard transform of x[n] (n a power of two), scaled by
// 1/sqrt(n) so that it is its own inverse. Rotating K and V rows before quantising spreads
// outlier channels over the whole row, which shrinks per-row INT4/INT8 scales (as in
// QuaRot); attention is unchanged when queries are rotated too: (Hq)·(Hk) = q·k, and
// Σ w·Hv = H(Σ w·v).
void HadamardInPlace(float* x, int n);
// The same transform as plain butterflies, one value at a time: the reference the SIMD
// stages of HadamardInPlace are bit-identical to (and its fallback).
void HadamardInPlaceScalar(float* x, int n);
bool IsPowerOfTwo(int n);

}  // namespace specnode
