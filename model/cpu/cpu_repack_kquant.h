// Row-interleaved ("x8") copies of K-quant matrices (Q4_K, Q5_K, Q6_K), made once at load
// so the x8 kernels run them natively (cpu_kernels.h, KernelTable::kquant_x8) instead of
// converting them to Q4_1 / Q8_0 (ggml_converted_types.h), which costs bytes per token
// (Q6_K 6.56 -> 8.5 bits per weight, Q5_K 5.5 -> 8.5, Q4_K 4.5 -> 5.0) and, for Q5_K / Q6_K,
// a requantisation.
//
// Layout: groups of 8 rows as cpu_repack.h (last group padded with zero rows); inside a
// group, super-block s (256 values) at s * PackedKSuperBytes(type):
//   head, per row i < 8:
//     Q4_K / Q5_K: d[8] f16 at 2i, dmin[8] f16 at 16 + 2i, the 6-bit factors unpacked to
//                  bytes: sc of sub-block j at 32 + 8j + i, m at 96 + 8j + i (160 bytes);
//     Q6_K:        d[8] f16 at 2i, the int8 scale of 16-value half k (< 16) at
//                  16 + 8k + i (144 bytes);
//   then sub-block j (< 8, values 32j .. 32j + 31) at head + j * PackedKSubBytes(type):
//     8 nibble chunks of 16 bytes: byte 2i + h of chunk c holds row i's code of value
//     2c + h in its low nibble (bits 0-3) and of value 2c + h + 16 in its high nibble: the
//     layout of a packed Q4_0 / Q4_1 block (cpu_repack.h), so the kernels widen it alike;
//     Q5_K: 2 high chunks of 16 bytes: bit f of byte 2i + h of high chunk k is bit 4 of the
//       code of nibble chunk 4k + f / 2, its low nibble's value for even f, its high
//       nibble's for odd f (the same row i, position h);
//     Q6_K: 4 high chunks: bits 2f, 2f + 1 of byte 2i + h of high chunk k are bits 4-5 of
//       the code of nibble chunk 2k + f / 2 (low nibble's value for even f, high for odd).
// So a nibble vector's high bits are one byte vector shifted by an immediate and masked.
// Bytes per 256 values and row: Q4_K 148 (the file's 144 + 4: unpacked 6-bit factors),
// Q5_K 180 (176 + 4), Q6_K 210 (the file's).
//
// Arithmetic of the kernels (int16 activations, natural order, cpu_kernels.h), per row,
// token and 32-value block b = 8s + j, acc starting at +0 (PackedKQuantReference):
//   Q4_K / Q5_K: dot = Σ_v q_v qs_t[v]                      (int32, exact)
//                acc = fma(float(dot), (d * float(sc_j)) * d_t, acc)
//                acc = fma((-dmin) * float(m_j), s_t, acc)
//   Q6_K:        dot_k = Σ_{v in half k} (q_v - 32) qs_t[v]  (the two 16-value halves)
//                acc = fma(float(dot_2j), (d * float(sc_2j)) * d_t, acc)
//                acc = fma(float(dot_2j+1), (d * float(sc_2j+1)) * d_t, acc)
// (Q6_K's halves stay apart because (q - 32) * sc * qs summed over 32 values can pass
// 2^31.) Every step is per lane and in a fixed order: batch invariant, and bit-identical
// between the reference and every table's kernel.
//
// Int8 activations (x.qs8, KernelTable::kquant8_x8; PackedKQuantReference8): the same
// steps. The codes are vpdpbusd's / vpmaddubsw's unsigned operand as they are (Q6_K too:
// q in [0, 63]), so a Q6_K half's dot is formed as Σ q qs - 32 h, with h = Σ qs over the
// half from QuantActs::h16, which the dispatcher fills for Q6_K: the same integer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "model/cpu/cpu_kernels.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode::cpu_kernels {

// Head bytes of a packed super-block (8 rows).
static constexpr size_t PackedKHeadBytes(GgmlType type) {
  return type == GgmlType::kQ6_K ? 144 : 160;
}
// Bytes of one 32-value sub-block of 8 rows: nibbles + high chunks.
static constexpr size_t PackedKSubBytes(GgmlType type) {
  return 128 + (type == GgmlType::kQ6_K ? 64 : type == GgmlType::kQ5_K ? 32 : 0);
}
// Bytes of one super-block of 8 rows.
static constexpr size_t PackedKSuperBytes(GgmlType type) {
  return PackedKHeadBytes(type) + 8 * PackedKSubBytes(type);
}
// High bits per code held in the high chunks (0: Q4_K). Q5_0 / Q5_1 blocks carry theirs in
// Q5_K's high-chunk layout (cpu_repack.h), so the helpers below serve them too.
static constexpr int KHighBits(GgmlType type) {
  return type == GgmlType::kQ6_K ? 2 : type == GgmlType::kQ5_K || IsQ5Type(type) ? 1 : 0;
}
// Nibble chunk c's high bits: high chunk KHighChunk(c), low nibble's field at bit
// KHighShift(c, 0), high nibble's at KHighShift(c, 1) (KHighBits(type) bits each).
static constexpr int KHighChunk(GgmlType type, int c) { return c / (4 / KHighBits(type)); }
static constexpr int KHighShift(GgmlType type, int c, int part) {
  return KHighBits(type) * (2 * (c % (4 / KHighBits(type))) + part);
}

// The packed copy of a K-quant matrix (IsKQuantType(w.type); a column-slice view packs its
// slice). Size: ceil(rows / 8) * (cols / 256) * PackedKSuperBytes.
std::vector<uint8_t> PackKQuantRows(const WeightView& w);

// y for rows [row_begin, row_end) (a multiple of 8) with the arithmetic above, in scalar
// code: args.type a K-quant, args.w the packed copy, args.row_stride its group bytes,
// args.blocks = cols / 32, int16 activations. Bit-identical to every table's kernel.
void PackedKQuantReference(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);
// The same over int8 activations (args.x.qs8): bit-identical to every kquant8_x8 kernel.
void PackedKQuantReference8(const QuantMatMulArgs& args, int64_t row_begin, int64_t row_end);

}  // namespace specnode::cpu_kernels
