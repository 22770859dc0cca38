// Internal to the CPU backend: the per-instruction-set kernels behind MatMul (and SwiGlu).
//
// Each of cpu_kernels_{scalar,avx2,avx512}.cc is compiled for its own ISA and exports one
// or two KernelTables. Only cpu_matmul.cc (and tests) call them, and only after
// GetCpuFeatures() confirmed the CPU has the ISA; the tables themselves are plain constant
// data, so merely linking them executes nothing.
//
// Quantised weights (Q4_0, Q4_1, Q8_0) multiply 16-bit activations: each token's row of
// `cols` floats is quantised once per MatMul call to blocks of 32 int16 values
//   qs[j] = round_nearest_even(x[j] * (1 / d_b)),  d_b = max|x| over block b / 32767,
// (|qs| <= 32767: the rounding error of x * (1/d_b) is far below 1/2), with two f32 side
// values per block: d_b and s_b = d_b * Σ_j qs[j]. That is llama.cpp's Q8_1 with 258x
// finer steps: with 8 bits, SmolLM2's logits moved ~0.3 RMS and greedy decoding left a
// float reference's path; with 16 it follows it.
// A weight block then contributes
//   Q4_1: d_w d_b Σ q_w qs + m_w s_b        (q_w = nibble, 0..15)
//   Q4_0: d_w d_b Σ q_w qs - 8 d_w s_b      (the same unsigned-nibble dot)
//   Q8_0: d_w d_b Σ q_w qs                  (q_w signed)
// The integer sums fit int32 (|Σ| <= 128 * 32767 * 32) and are products of int16 pairs:
// vpmaddwd / vpdpwssd after widening the weights to int16.
// F32/F16/BF16 weights use the f32 activations directly. The K-quants (Q4_K, Q5_K, Q6_K)
// run on the x8 path only: 32-value sub-blocks with their own factors (cpu_repack_kquant.h);
// so do Q5_0 / Q5_1 (unsigned 5-bit codes: Q5_0 corrected by -16 d_w s_b, Q5_1 by m_w s_b;
// cpu_repack.h).
//
// Int8 activations (ActQuant::kInt8, opt-in; llama.cpp's Q8_1 exactly): blocks of 32 int8
//   qs[j] = round_nearest_even(x[j] * (1 / d_b)),  d_b = max|x| over block b / 127,
// with the same d_b and s_b side values. The unsigned weight operand of vpdpbusd (u8 x s8,
// four products per int32 lane, no intermediate saturation) is the nibble for Q4 and, for
// Q8_0, the quant + 128 (a sign-bit flip), so a Q8_0 block contributes
//   Q8_0: d_w d_b Σ (q_w + 128) qs - 128 d_w s_b
// Half the dot instructions of the int16 path per weight group: batched (compute-bound)
// matmuls run faster, single-token (bandwidth-bound) ones do not care; logits move by
// the coarser rounding (see cpu_matmul.h). Tables without an int8 kernel leave
// quantize8/matmul_quant8 null and the dispatcher uses their int16 path.
//
// Batch invariance contract, for every kernel: y[t, r] depends only on row r and token t's
// activations, through an instruction sequence that does not depend on n, the token tile
// the token fell in, or [row_begin, row_end). Kernels may process several tokens per weight
// load (tiles), but each token keeps its own accumulators in a fixed order.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "model/cpu/cpu_matmul.h"
#include "model/cpu/thread_pool.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode {

namespace cpu_kernels {

// Token rows of quantised activations, laid out by the dispatcher:
//   qs[t * qs_stride + j]  int16, j < cols, in the order the table's `quantize` writes
//                          for weights of type `weight_type`: block order and, within a
//                          block, natural order, except in the avx512 tables, which order
//                          values the way their kernels widen the weights (a fixed shuffle,
//                          so weights need one permute and no per-token work):
//                          Q4_0/Q4_1: groups of 4 blocks b..b+3 (256 bytes), as 4 planes
//                            of 32 values: value p*32 + 2*(4m + k) + h (p, m, k < 4, h < 2)
//                            is block b+k's value v_p(2m + h), with v_0(i) = 2i,
//                            v_1(i) = 2i + 16, v_2(i) = 2i + 1, v_3(i) = 2i + 17: nibble p of
//                            the block's quant bytes 2i, 2i+1 read as a little-endian word;
//                          Q8_0: pairs of blocks b, b+1, dword-interleaved: value 2e + h
//                            (e < 32, h < 2) is block b + (e & 1)'s value 2*(e/2) + h;
//                          blocks past the last one of a group or pair are zero;
//                          zero from cols up to qs_stride (a multiple of 128 values) so a
//                          kernel may read whole 256-byte groups of 4 blocks
//   d[t * ds_stride + b], s[t * ds_stride + b]  f32, b < cols/32; zero up to ds_stride (a
//                          multiple of 16) so a kernel may load whole 16-block chunks
//
// Int8 tables (quantize8) use the same strides with int8 values in qs8:
//   scalar, avx2: natural order;
//   avx512-vnni: Q4_0/Q4_1: groups of 4 blocks (128 bytes) as 2 planes of 64: byte
//     p*64 + 4j + i (j = 4m + k; m, k, i < 4) is block b+k's value 4m + i + 16p (plane 0 pairs
//     with the low nibbles of quant bytes 4m..4m+3, plane 1 with the high ones);
//     Q8_0: pairs of blocks b, b+1 (64 bytes): byte 4l + i (l < 16, i < 4) is block
//     b + (l & 1)'s value 4(l / 2) + i.
struct QuantActs {
  const int16_t* qs = nullptr;  // [n, qs_stride] (int16 kernels)
  const int8_t* qs8 = nullptr;  // [n, qs_stride] (int8 kernels)
  const float* d = nullptr;     // [n, ds_stride]
  const float* s = nullptr;     // [n, ds_stride]
  // [n, 2 * ds_stride]: h16[t * 2 * ds_stride + k] = Σ qs8 over values 16k .. 16k + 15 of
  // token t (exact; zero past the last block). Set for int8 activations against Q6_K
  // weights only (cpu_repack_kquant.h); null otherwise.
  const int32_t* h16 = nullptr;
  int64_t qs_stride = 0;
  int64_t ds_stride = 0;
};

// y[t * ldy + r] = Σ over the row's blocks, for r in [row_begin, row_end), t < n.
struct QuantMatMulArgs {
  GgmlType type = GgmlType::kQ4_1;  // kQ4_0, kQ4_1 or kQ8_0
  const uint8_t* w = nullptr;       // row 0's first block
  size_t row_stride = 0;            // bytes between rows (>= blocks * block bytes)
  int64_t blocks = 0;               // blocks of 32 per row (cols / 32)
  QuantActs x;
  int64_t n = 0;
  float* y = nullptr;  // [n, ldy]
  int64_t ldy = 0;
};

// y[t * ldy + r] = Σ_j W[r, j] x[t * ldx + j] for F32/F16/BF16 weights.
struct FloatMatMulArgs {
  GgmlType type = GgmlType::kF32;  // kF32, kF16 or kBF16
  const uint8_t* w = nullptr;
  size_t row_stride = 0;
  int64_t cols = 0;          // any count, no block constraint
  const float* x = nullptr;  // [n, ldx]
  int64_t ldx = 0;
  int64_t n = 0;
  float* y = nullptr;  // [n, ldy]
  int64_t ldy = 0;
};

struct KernelTable {
  const char* name;  // "scalar", "avx2", "avx512", "avx512-vnni"
  // Quantises one token for weights of `weight_type`: x[blocks * 32] -> qs[blocks * 32],
  // d[blocks], s[blocks]. qs, d and s arrive zeroed past `blocks`; the quantiser may write
  // up to the next 128 values of qs.
  void (*quantize)(const float* x, int64_t blocks, GgmlType weight_type, int16_t* qs, float* d,
                   float* s);
  void (*matmul_quant)(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
  void (*matmul_float)(const FloatMatMulArgs& args, int64_t row_begin, int64_t row_end);
  // Int8 activations: as quantize/matmul_quant with d_b = max|x| / 127 and args.x.qs8.
  // Null in tables without an int8 kernel.
  void (*quantize8)(const float* x, int64_t blocks, GgmlType weight_type, int8_t* qs, float* d,
                    float* s);
  void (*matmul_quant8)(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
  // The row-interleaved ("x8") path (cpu_repack.h): activations quantised in natural order
  // by quantize_x8 / quantize8_x8 (bit for bit the scalar table's values), multiplied against
  // the packed copy: args.w = the packed matrix, args.row_stride = PackedGroupBytes,
  // row_begin a multiple of 8. matmul_quant_x8 (int16) is bit-identical to
  // PackedMatMulReference, matmul_quant8_x8 (int8) to PackedMatMulReference8. A null kernel
  // means the table has none for that width (the natural-layout kernel then runs).
  void (*quantize_x8)(const float* x, int64_t blocks, GgmlType weight_type, int16_t* qs, float* d,
                      float* s);
  void (*matmul_quant_x8)(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
  void (*quantize8_x8)(const float* x, int64_t blocks, GgmlType weight_type, int8_t* qs, float* d,
                       float* s);
  void (*matmul_quant8_x8)(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
  // out[i] = silu(gate[i]) * up[i] for n values (SwiGlu, cpu_ops.h), bit-identical in every
  // table: the swiglu_exp arithmetic below, lane by lane (out may alias gate or up).
  void (*swiglu)(const float* gate, const float* up, int64_t n, float* out);
  // True when matmul_quant_x8 also takes Q4_K, Q5_K and Q6_K, packed as cpu_repack_kquant.h
  // (bit-identical to PackedKQuantReference); kquant8_x8 the same for matmul_quant8_x8
  // (int8 activations, PackedKQuantReference8).
  bool kquant_x8 = false;
  bool kquant8_x8 = false;
  // True when matmul_quant_x8 (q5_8_x8: matmul_quant8_x8) also takes Q5_0 and Q5_1, packed
  // as cpu_repack.h (bit-identical to PackedMatMulReference / PackedMatMulReference8).
  bool q5_x8 = false;
  bool q5_8_x8 = false;
};

// Does table k's x8 kernel for the width (int8 or not) take `type`? The K-quants and
// Q5_0 / Q5_1 need kernels of their own (kquant_x8 / q5_x8 and the int8 flags); every other
// quantised type is taken by any x8 kernel.
static inline bool X8KernelTakes(const KernelTable& k, GgmlType type, bool int8) {
  if (IsKQuantType(type)) return int8 ? k.kquant8_x8 : k.kquant_x8;
  if (IsQ5Type(type)) return int8 ? k.q5_8_x8 : k.q5_x8;
  return true;
}

// SwiGLU's exponential, one arithmetic for every table so that scalar and SIMD results
// (and so the goldens of a level) do not depend on the vector width: for x = -gate,
//   x  = min(max(x, kLo), kHi)           (ordered as maxps(kLo, x): a NaN stays NaN)
//   kf = fma(x, log2(e), 1.5 * 2^23)     (round-to-nearest k in the low mantissa bits)
//   k  = kf - 1.5 * 2^23                 (exact)
//   r  = fma(k, -ln2_lo, fma(k, -ln2_hi, x))   (Cody-Waite, |r| <= ln2 / 2)
//   p  = Horner over kP with fma;  e = fma(p, r * r, r) + 1    (Cephes expf's polynomial)
//   2^k from the bits of kf: (bits(kf) + 127) << 23  (k in [-126, 127] after the clamp)
//   out = gate / fma(e, 2^k, 1) * up
// Every fma is explicit, so contraction cannot make one file differ from another. silu is
// within 3e-7 relative (~2.5 ulp) of the exact formula for |gate| <= 87 (tests); gate > 87
// gives silu = gate (exp(-87) is below the last bit), gate < -88 a tiny negative, not -0.
namespace swiglu_exp {
inline constexpr float kLo = -87.0f;
inline constexpr float kHi = 88.0f;
inline constexpr float kLog2e = 1.44269504088896341f;
inline constexpr float kMagic = 12582912.0f;  // 1.5 * 2^23
inline constexpr float kLn2Hi = 0.693359375f;
inline constexpr float kLn2Lo = -2.12194440e-4f;
inline constexpr float kP[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
}  // namespace swiglu_exp

// The helpers below are `static inline`: this header is included by files compiled for
// different ISAs, and a shared (ODR-merged) out-of-line copy built with AVX-512 flags could
// be what AVX2-only code calls.

// Weight rows are streamed once per call; hardware prefetch alone leaves the kernels
// waiting on DRAM between rows. The natural-layout kernels prefetch the row this many bytes
// ahead (the x8 kernels prefetch block by block instead: cpu_repack.h, PrefetchBlock).
inline constexpr size_t kPrefetchDistance = 4096;

// Rows a kernel should look ahead (at least 1).
static inline int64_t PrefetchRowsAhead(size_t row_bytes) {
  return static_cast<int64_t>(kPrefetchDistance / (row_bytes == 0 ? 1 : row_bytes)) + 1;
}

// Prefetches `bytes` from `p` into cache (a hint; never faults).
static inline void PrefetchBytes(const uint8_t* p, size_t bytes) {
  for (size_t o = 0; o < bytes; o += 64) __builtin_prefetch(p + o);
}

// Defined one per ISA file. Calling a table's functions needs the matching CPU support:
// avx2: CpuFeatures::avx2; avx512: avx512; avx512-vnni: avx512_vnni.
extern const KernelTable kScalarKernels;
extern const KernelTable kAvx2Kernels;
extern const KernelTable kAvx512Kernels;      // AVX-512BW, dot products via vpmaddwd
extern const KernelTable kAvx512VnniKernels;  // AVX-512 VNNI vpdpwssd
// The scalar table's swiglu: the reference for every table's (needs nothing).
void SwiGluScalar(const float* gate, const float* up, int64_t n, float* out);
// The AVX2 and AVX-512 tables' swiglu (cpu_kernels_avx2.cc; needs CpuFeatures::avx2).
void SwiGluAvx2(const float* gate, const float* up, int64_t n, float* out);
// The avx2 table's matmul_quant_x8 and matmul_quant8_x8 (cpu_kernels_avx2_x8.cc; need
// CpuFeatures::avx2).
void MatMulQuantX8Avx2(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
void MatMulQuant8X8Avx2(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
// The AVX-512 tables' x8 path (cpu_kernels_avx512_x8.cc): natural-order quantisers and the
// kernels (16 rows per instruction; needs CpuFeatures::avx512, the Vnni ones avx512_vnni).
void QuantizeNaturalAvx512(const float* x, int64_t blocks, GgmlType weight_type, int16_t* qs,
                           float* d, float* s);
void Quantize8NaturalAvx512(const float* x, int64_t blocks, GgmlType weight_type, int8_t* qs,
                            float* d, float* s);
void MatMulQuantX8Avx512(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
void MatMulQuantX8Avx512Vnni(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
void MatMulQuant8X8Avx512Vnni(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);

// The size of the next token tile when `left` tokens remain and a tile holds at most
// `max_tile`: as few tiles as possible, of near-equal sizes (9 tokens, max 8: 5 + 4).
static inline int NearEqualTile(int64_t left, int max_tile) {
  const int64_t tiles = (left + max_tile - 1) / max_tile;
  return static_cast<int>((left + tiles - 1) / tiles);
}
// The AVX-512 tables' matmul_float (cpu_kernels_avx512_float.cc; needs CpuFeatures::avx512).
void MatMulFloatAvx512(const FloatMatMulArgs& args, int64_t row_begin, int64_t row_end);

// The best table GetCpuFeatures() allows (honours SPECNODE_CPU), chosen once.
const KernelTable& SelectedKernels();
// Every table this CPU can run, scalar first (tests iterate over these).
std::vector<const KernelTable*> SupportedKernels();

// MatMul (see cpu_matmul.h) forced onto one kernel table.
void MatMulWith(const KernelTable& kernels, const WeightView& w, const float* x /*[n, cols]*/,
                int64_t n, float* y /*[n, rows]*/, ThreadPool* pool, MatMulScratch* scratch,
                ActQuant act = ActQuant::kInt16);
// MatMulShared (see cpu_matmul.h) forced onto one kernel table.
void MatMulSharedWith(const KernelTable& kernels, std::span<const WeightView> ws, const float* x,
                      int64_t n, std::span<float* const> ys, ThreadPool* pool,
                      MatMulScratch* scratch, ActQuant act = ActQuant::kInt16);

}  // namespace cpu_kernels
}  // namespace specnode
