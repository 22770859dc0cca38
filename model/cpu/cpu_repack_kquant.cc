#include "model/cpu/cpu_repack_kquant.h"

#include <cassert>
#include <cmath>
#include <cstring>

#include "model/cpu/cpu_repack.h"

namespace specnode::cpu_kernels {

std::vector<uint8_t> PackKQuantRows(const WeightView& w) {
  const GgmlType type = w.type;
  assert(IsKQuantType(type) && w.cols % kKQuantBlock == 0);
  const int64_t supers = w.cols / kKQuantBlock;
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  const size_t sb = PackedKSuperBytes(type);
  const size_t head = PackedKHeadBytes(type);
  const size_t sub = PackedKSubBytes(type);
  const size_t nb = GgmlBlockBytes(type);
  const int high_bits = KHighBits(type);
  std::vector<uint8_t> out(groups * supers * sb, 0);  // padding rows: 0
  const auto* src = static_cast<const uint8_t*>(w.data);
  KQuantCodes k;
  for (int64_t r = 0; r < w.rows; ++r) {
    const int i = static_cast<int>(r % kPackRows);
    uint8_t* group = out.data() + (r / kPackRows) * supers * sb;
    for (int64_t s = 0; s < supers; ++s) {
      DecodeKQuantBlock(type, src + r * w.row_stride + s * nb, &k);
      uint8_t* to = group + s * sb;
      std::memcpy(to + 2 * i, &k.d, 2);
      if (type == GgmlType::kQ6_K) {
        for (int h = 0; h < 16; ++h) to[16 + 8 * h + i] = k.sc[h];
      } else {
        std::memcpy(to + 16 + 2 * i, &k.dmin, 2);
        for (int j = 0; j < 8; ++j) {
          to[32 + 8 * j + i] = k.sc[j];
          to[96 + 8 * j + i] = k.m[j];
        }
      }
      for (int j = 0; j < 8; ++j) {
        const uint8_t* q = k.q + 32 * j;
        uint8_t* nib = to + head + j * sub;
        uint8_t* high = nib + 128;
        for (int c = 0; c < 8; ++c) {
          for (int h = 0; h < 2; ++h) {
            const int e = 2 * i + h;  // byte within a chunk
            const uint8_t lo = q[2 * c + h], hi = q[2 * c + h + 16];
            nib[16 * c + e] = static_cast<uint8_t>((lo & 0x0F) | ((hi & 0x0F) << 4));
            if (high_bits == 0) continue;
            const int mask = (1 << high_bits) - 1;
            uint8_t& byte = high[16 * KHighChunk(type, c) + e];
            byte |= static_cast<uint8_t>(((lo >> 4) & mask) << KHighShift(type, c, 0));
            byte |= static_cast<uint8_t>(((hi >> 4) & mask) << KHighShift(type, c, 1));
          }
        }
      }
    }
  }
  return out;
}

namespace {

// Both references: Act = int16_t (x.qs) or int8_t (x.qs8). The integer dots are the exact
// sums the kernels form (an int8 Q6_K kernel's Σ q qs - 32 Σ qs over a half is the same
// integer as Σ (q - 32) qs), so one definition serves both widths.
template <typename Act>
void KQuantReference(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  assert(row_begin % kPackRows == 0 && IsKQuantType(a.type) && a.blocks % 8 == 0);
  const GgmlType type = a.type;
  const bool q6 = type == GgmlType::kQ6_K;
  const size_t sb = PackedKSuperBytes(type);
  const size_t head = PackedKHeadBytes(type);
  const size_t sub = PackedKSubBytes(type);
  const int high_bits = KHighBits(type);
  const int mask = (1 << high_bits) - 1;
  ReferenceWalk<Act>(
      a, row_begin, row_end,
      [&](const uint8_t* group, int i, const Act* xb, int64_t b, float dt, float st, float acc) {
        const uint8_t* hd = group + (b / 8) * sb;
        const int j = static_cast<int>(b % 8);
        const uint8_t* nib = hd + head + j * sub;
        const uint8_t* high = nib + 128;
        int32_t dot[2] = {0, 0};  // values 0..15, 16..31 of the block
        for (int c = 0; c < 8; ++c) {
          for (int h = 0; h < 2; ++h) {
            const int e = 2 * i + h;
            const uint8_t byte = nib[16 * c + e];
            int lo = byte & 0x0F, hi = byte >> 4;
            if (high_bits > 0) {
              const uint8_t hb = high[16 * KHighChunk(type, c) + e];
              lo |= ((hb >> KHighShift(type, c, 0)) & mask) << 4;
              hi |= ((hb >> KHighShift(type, c, 1)) & mask) << 4;
            }
            if (q6) {
              lo -= 32;
              hi -= 32;
            }
            dot[0] += lo * xb[2 * c + h];
            dot[1] += hi * xb[2 * c + h + 16];
          }
        }
        uint16_t f16;
        std::memcpy(&f16, hd + 2 * i, 2);
        const float d = Fp16ToFp32(f16);
        if (q6) {
          for (int k = 0; k < 2; ++k) {
            const auto sc = static_cast<int8_t>(hd[16 + 8 * (2 * j + k) + i]);
            acc = std::fma(static_cast<float>(dot[k]), (d * static_cast<float>(sc)) * dt, acc);
          }
          return acc;
        }
        std::memcpy(&f16, hd + 16 + 2 * i, 2);
        const float dmin = Fp16ToFp32(f16);
        const float sc = hd[32 + 8 * j + i], m = hd[96 + 8 * j + i];
        acc = std::fma(static_cast<float>(dot[0] + dot[1]), (d * sc) * dt, acc);
        return std::fma((-dmin) * m, st, acc);
      });
}

}  // namespace

void PackedKQuantReference(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  KQuantReference<int16_t>(a, row_begin, row_end);
}

void PackedKQuantReference8(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  KQuantReference<int8_t>(a, row_begin, row_end);
}

}  // namespace specnode::cpu_kernels
