#include "model/cpu/cpu_repack.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "model/cpu/cpu_repack_kquant.h"

namespace specnode::cpu_kernels {
namespace {

// Where a natural-layout block's quants start.
size_t QuantOffset(GgmlType type) { return type == GgmlType::kQ4_1 ? 4 : 2; }

}  // namespace

bool IsPackable(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ8_0 ||
         RunsPackedOnly(type);
}

size_t PackedGroupBytes(GgmlType type, int64_t blocks) {
  if (IsKQuantType(type)) return static_cast<size_t>(blocks / 8) * PackedKSuperBytes(type);
  return static_cast<size_t>(blocks) * PackedBlockBytes(type);
}

namespace {

// Row i's 32 five-bit codes q into a packed Q5 block's nibble chunks `nib` and the 2 high
// chunks after them (cpu_repack.h: Q5_K's sub-block layout).
void PackQ5Codes(const uint8_t* q, int i, uint8_t* nib) {
  constexpr GgmlType kType = GgmlType::kQ5_0;  // Q5_1's high-bit layout is the same
  uint8_t* high = nib + 128;
  for (int c = 0; c < 8; ++c) {
    for (int h = 0; h < 2; ++h) {
      const int e = 2 * i + h;
      const uint8_t lo = q[2 * c + h], hi = q[2 * c + h + 16];
      nib[16 * c + e] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
      uint8_t& byte = high[16 * KHighChunk(kType, c) + e];
      byte |= static_cast<uint8_t>(((lo >> 4) & 1) << KHighShift(kType, c, 0));
      byte |= static_cast<uint8_t>(((hi >> 4) & 1) << KHighShift(kType, c, 1));
    }
  }
}

}  // namespace

std::vector<uint8_t> PackRows(const WeightView& w) {
  if (IsKQuantType(w.type)) return PackKQuantRows(w);
  assert(IsPackable(w.type) && w.cols % kQuantBlock == 0);
  const int64_t blocks = w.cols / kQuantBlock;
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  const size_t nb = GgmlBlockBytes(w.type);
  const size_t pb = PackedBlockBytes(w.type);
  const size_t group_bytes = PackedGroupBytes(w.type, blocks);
  const size_t head = PackedHeadBytes(w.type);
  const size_t qoff = QuantOffset(w.type);
  const int chunks = w.type == GgmlType::kQ8_0 ? 16 : 8;
  std::vector<uint8_t> out(groups * group_bytes, 0);  // padding rows: 0
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    const int i = static_cast<int>(r % kPackRows);
    const uint8_t* row = src + r * w.row_stride;
    uint8_t* group = out.data() + (r / kPackRows) * group_bytes;
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* from = row + b * nb;
      uint8_t* to = group + b * pb;
      if (IsQ5Type(w.type)) {
        Q5Codes k;
        DecodeQ5Block(w.type, from, &k);
        std::memcpy(to + 2 * i, &k.d, 2);
        if (w.type == GgmlType::kQ5_1) std::memcpy(to + 16 + 2 * i, &k.m, 2);
        PackQ5Codes(k.q, i, to + head);
        continue;
      }
      std::memcpy(to + 2 * i, from, 2);                                          // d
      if (w.type == GgmlType::kQ4_1) std::memcpy(to + 16 + 2 * i, from + 2, 2);  // m
      for (int c = 0; c < chunks; ++c) {
        std::memcpy(to + head + 16 * c + 2 * i, from + qoff + 2 * c, 2);
      }
    }
  }
  return out;
}

namespace {

// Both references: Act = int16_t (x.qs) or int8_t (x.qs8, Q8_0 with the +128 offset); the
// Q5 codes are unsigned at both widths (vpdpbusd's / vpmaddubsw's operand as they are).
template <typename Act>
void PackedReference(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  assert(row_begin % kPackRows == 0);
  constexpr bool kInt8 = sizeof(Act) == 1;
  const GgmlType type = a.type;
  const size_t pb = PackedBlockBytes(type);
  const size_t head = PackedHeadBytes(type);
  ReferenceWalk<Act>(
      a, row_begin, row_end,
      [&](const uint8_t* group, int i, const Act* xb, int64_t b, float dt, float st, float acc) {
        const uint8_t* blk = group + b * pb;
        uint16_t h;
        std::memcpy(&h, blk + 2 * i, 2);
        const float dw = Fp16ToFp32(h);
        const uint8_t* q = blk + head;
        int32_t dot = 0;
        if (type == GgmlType::kQ8_0) {
          const int offset = kInt8 ? 128 : 0;  // vpdpbusd's unsigned weight operand
          for (int c = 0; c < 16; ++c) {
            for (int k = 0; k < 2; ++k) {
              dot += (static_cast<int8_t>(q[16 * c + 2 * i + k]) + offset) * xb[2 * c + k];
            }
          }
        } else {
          const bool q5 = IsQ5Type(type);
          for (int c = 0; c < 8; ++c) {
            for (int k = 0; k < 2; ++k) {
              const uint8_t byte = q[16 * c + 2 * i + k];
              int lo = byte & 0x0F, hi = byte >> 4;
              if (q5) {  // bit 4 from the high chunks (Q5_K's layout)
                const uint8_t hb = q[128 + 16 * KHighChunk(type, c) + 2 * i + k];
                lo |= ((hb >> KHighShift(type, c, 0)) & 1) << 4;
                hi |= ((hb >> KHighShift(type, c, 1)) & 1) << 4;
              }
              dot += lo * xb[2 * c + k] + hi * xb[2 * c + k + 16];
            }
          }
        }
        acc = std::fma(static_cast<float>(dot), dw * dt, acc);
        if (type == GgmlType::kQ4_1 || type == GgmlType::kQ5_1) {
          std::memcpy(&h, blk + 16 + 2 * i, 2);
          acc = std::fma(Fp16ToFp32(h), st, acc);
        } else if (type == GgmlType::kQ4_0) {
          acc = std::fma(-8.0f * dw, st, acc);
        } else if (type == GgmlType::kQ5_0) {
          acc = std::fma(-16.0f * dw, st, acc);
        } else if (kInt8) {
          acc = std::fma(-128.0f * dw, st, acc);
        }
        return acc;
      });
}

}  // namespace

void PackedMatMulReference(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (IsKQuantType(a.type)) return PackedKQuantReference(a, row_begin, row_end);
  PackedReference<int16_t>(a, row_begin, row_end);
}

void PackedMatMulReference8(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  if (IsKQuantType(a.type)) return PackedKQuantReference8(a, row_begin, row_end);
  PackedReference<int8_t>(a, row_begin, row_end);
}

}  // namespace specnode::cpu_kernels
