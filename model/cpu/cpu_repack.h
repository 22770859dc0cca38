// Row-interleaved ("x8") copies of quantised weight matrices, made once at load by the CPU
// backend for kernels that compute 8 output rows per instruction (cpu_kernels.h,
// KernelTable::matmul_quant_x8).
//
// Why: the natural layout puts one row's 32 values of a block in a vector, so every
// (row, token, block) pays an integer-to-float conversion, a scale FMA and, per row and
// token, a horizontal sum; and each row re-reads every token's activations. With 8 rows
// interleaved, one vector lane is one row: a token's activation pair is broadcast once and
// multiplied against 8 rows at a time, and one conversion + FMA serves 8 rows (the same
// idea as llama.cpp's CPU "repack" layouts; this one is ours).
//
// Layout of a packed matrix of `rows` rows and `blocks` blocks of 32 values per row:
// groups of kPackRows = 8 consecutive rows (the last group padded with all-zero rows),
// group g at g * PackedGroupBytes(type, blocks); inside a group, block j at
// j * PackedBlockBytes(type), each:
//   d[8]   f16, row i's block scale at d[i]
//   m[8]   f16, row i's block minimum (Q4_1 and Q5_1 only)
//   quants, as 16-byte chunks; byte 2i + h of chunk c (row i < 8, h < 2) is
//     Q4_0/Q4_1 (8 chunks):  row i's quant byte 2c + h of the block (ggml order: low nibble
//                            is value 2c + h, high nibble value 2c + h + 16), so the low
//                            nibbles of a chunk are the value pair (2c, 2c + 1) of 8 rows
//                            and the high nibbles the pair (2c + 16, 2c + 17);
//     Q5_0/Q5_1 (8 + 2):     the 8 chunks of Q4, holding bits 0-3 of the 5-bit codes, then
//                            2 high chunks with their bit 4 as a packed Q5_K sub-block
//                            holds it (cpu_repack_kquant.h: bit f of byte 2i + h of high
//                            chunk k is nibble chunk 4k + f / 2's, low nibble for even f);
//     Q8_0 (16 chunks):      row i's value 2c + h: chunk c is the value pair (2c, 2c + 1).
// Bytes equal the natural layout's (no extra memory traffic per token). Q5_0 / Q5_1 run on
// the x8 kernels only (KernelTable::q5_x8): without them they are converted at load.
//
// Arithmetic of the x8 kernels (row r of group lane i, token t, int16 activations in the
// natural order of cpu_kernels.h), per block b in order, one accumulator per (row, token):
//   dot  = Σ_j q_w[j] qs_t[j]                  (int32, exact; Q4: unsigned nibbles)
//   acc  = fma(float(dot), d_w * d_t, acc)      (float(dot) rounds to nearest)
//   acc  = fma(m_w, s_t, acc)                   Q4_1, Q5_1
//   acc  = fma(-8 d_w, s_t, acc)                Q4_0
//   acc  = fma(-16 d_w, s_t, acc)               Q5_0
// (Q5: q_w the unsigned 5-bit code, 0..31; a dot is at most 31 * 32767 * 32 < 2^31)
// with acc starting at +0 and y = acc. Every step is per lane, so a row's result does not
// depend on the number of tokens, the tile a token falls in or the rows around it (batch
// invariance, cpu_matmul.h); PackedMatMulReference computes exactly this in scalar code.
// Int8 activations (PackedMatMulReference8): the same steps over int8 values, except that a
// Q8_0 dot is Σ (q_w + 128) qs_t (the unsigned operand of vpdpbusd) and is corrected by
//   acc  = fma(-128 d_w, s_t, acc)              Q8_0 (int8 only)
// (llama.cpp's Q8_0 x Q8_1 arithmetic with the offset applied once per block).
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/cpu/cpu_kernels.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode::cpu_kernels {

inline constexpr int kPackRows = 8;

// True for the types with a packed layout (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0; and Q4_K, Q5_K,
// Q6_K, whose layout is cpu_repack_kquant.h's).
bool IsPackable(GgmlType type);
// True for the types MatMul runs from their packed copy only, on x8 kernels that take them
// (KernelTable::kquant_x8 / q5_x8): Q5_0, Q5_1 and the K-quants.
static constexpr bool RunsPackedOnly(GgmlType type) { return IsQ5Type(type) || IsKQuantType(type); }
// Bytes before the quants in a packed block: d[8] (and m[8] for Q4_1 / Q5_1). Constant
// expressions, so the kernels' templates use them too (static: see cpu_kernels.h).
static constexpr size_t PackedHeadBytes(GgmlType type) {
  return type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1 ? 32 : 16;
}
// Bytes of one block of 8 rows (of a packable type other than the K-quants).
static constexpr size_t PackedBlockBytes(GgmlType type) {
  return kPackRows * (type == GgmlType::kQ8_0   ? sizeof(BlockQ8_0)
                      : type == GgmlType::kQ4_1 ? sizeof(BlockQ4_1)
                      : type == GgmlType::kQ5_0 ? sizeof(BlockQ5_0)
                      : type == GgmlType::kQ5_1 ? sizeof(BlockQ5_1)
                                                : sizeof(BlockQ4_0));
}
// Bytes of one group of 8 rows of `blocks` blocks of 32 values (K-quants: blocks % 8 == 0).
size_t PackedGroupBytes(GgmlType type, int64_t blocks);

// The packed copy of `w` (IsPackable(w.type), cols a multiple of its type's block; a column
// slice view packs its slice). Size: ceil(rows / 8) * PackedGroupBytes.
std::vector<uint8_t> PackRows(const WeightView& w);

// The packed groups [begin, end) that hold rows [row_begin, row_end) of an x8 call
// (row_begin a multiple of 8), as the kernels walk them.
struct GroupSpan {
  int64_t begin = 0;
  int64_t end = 0;
};
static inline GroupSpan GroupsOf(int64_t row_begin, int64_t row_end) {
  return {row_begin / kPackRows, (row_end + kPackRows - 1) / kPackRows};
}
// Software prefetch of the weight stream, spread over the block loop. The kernels compute
// block b of the current group(s) while prefetching block b of the group kPrefetchGroupsAhead
// further on (PrefetchBlock), so requests leave at the pace the tile consumes data. Issuing a
// whole group's lines at once (3-9 KB, up to ~150 prefetches) instead filled the line-fill
// buffers, and the current group's own loads queued behind them: the weight stream and the
// arithmetic ran one after the other, not together (`bench_matmul DecodeStep/SmolLM2`, AVX-512
// int16, 1 thread: n = 1 5.48 -> 3.51 ms, n = 5 10.4 -> 6.36, n = 16 22.5 -> 17.4).
// Two groups = the next pair for the AVX-512 kernels (16 rows per tile), one group past the
// next for the AVX2 one.
inline constexpr int64_t kPrefetchGroupsAhead = 2;

// Prefetches the groups of `span` the block loop will not (the first kPrefetchGroupsAhead).
static inline void PrefetchLeadGroups(const uint8_t* w, size_t group_bytes, GroupSpan span) {
  const int64_t end = std::min(span.end, span.begin + kPrefetchGroupsAhead);
  for (int64_t g = span.begin; g < end; ++g) PrefetchBytes(w + g * group_bytes, group_bytes);
}

// The group kPrefetchGroupsAhead after `g` in `span` (nullptr past its end): the target of
// PrefetchBlock while group g is computed.
static inline const uint8_t* PrefetchTarget(const uint8_t* w, size_t group_bytes, GroupSpan span,
                                            int64_t g) {
  const int64_t p = g + kPrefetchGroupsAhead;
  return p < span.end ? w + p * group_bytes : nullptr;
}

// Block b's lines of a group (nullptr: nothing), as T0 prefetches at 64-byte steps from the
// block's first byte. A block of kBlockBytes (144-272, 3-5 lines) whose end falls in a line
// this misses leaves that line to the next block's first prefetch (blocks and groups are
// contiguous). Also requesting the block's last byte cost 30% (bench/README.md).
template <size_t kBlockBytes>
static inline void PrefetchBlock(const uint8_t* group, int64_t b) {
  if (group == nullptr) return;
  const uint8_t* p = group + b * kBlockBytes;
#pragma GCC unroll 8
  for (size_t o = 0; o < kBlockBytes; o += 64) __builtin_prefetch(p + o);
}

// The scalar references' walk (PackedMatMulReference, PackedKQuantReference): for rows r in
// [row_begin, row_end) (row_begin a multiple of 8) and tokens t < n, y[t * ldy + r] = acc
// folded over the row's blocks b in order from acc = +0 by
//   acc = block(group, lane, xb, b, d_t[b], s_t[b], acc)
// with group = r's packed group, lane = r % 8 and xb = token t's 32 activations of block b
// (x.qs8 for Act = int8_t, else x.qs).
template <typename Act, typename Block>
static inline void ReferenceWalk(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end,
                                 Block&& block) {
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* group = a.w + (r / kPackRows) * a.row_stride;
    const int lane = static_cast<int>(r % kPackRows);
    for (int64_t t = 0; t < a.n; ++t) {
      const Act* qs;
      if constexpr (sizeof(Act) == 1) {
        qs = a.x.qs8 + t * a.x.qs_stride;
      } else {
        qs = a.x.qs + t * a.x.qs_stride;
      }
      const float* dt = a.x.d + t * a.x.ds_stride;
      const float* st = a.x.s + t * a.x.ds_stride;
      float acc = 0.0f;
      for (int64_t b = 0; b < a.blocks; ++b) {
        acc = block(group, lane, qs + b * kQuantBlock, b, dt[b], st[b], acc);
      }
      a.y[t * a.ldy + r] = acc;
    }
  }
}

// y[t * ldy + r] for r in [row_begin, row_end), t < n, with the arithmetic above in scalar
// code: args.w = the packed copy, args.row_stride = PackedGroupBytes, row_begin a multiple
// of 8. Bit-identical to every table's matmul_quant_x8 (tests). K-quant types run
// PackedKQuantReference (cpu_repack_kquant.h).
void PackedMatMulReference(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
// The same over int8 activations (args.x.qs8): bit-identical to every matmul_quant8_x8.
void PackedMatMulReference8(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);

}  // namespace specnode::cpu_kernels
