#include "model/cpu/cpu_repack.h"

#include <cassert>
#include <cmath>
#include <cstring>

namespace specnode::cpu_kernels {
namespace {

// Bytes of one natural-layout block and where its quants start.
size_t NaturalBlockBytes(GgmlType type) {
  switch (type) {
    case GgmlType::kQ4_0:
      return sizeof(BlockQ4_0);
    case GgmlType::kQ4_1:
      return sizeof(BlockQ4_1);
    default:
      return sizeof(BlockQ8_0);
  }
}

size_t QuantOffset(GgmlType type) { return type == GgmlType::kQ4_1 ? 4 : 2; }

// Bytes before the quants in a packed block: d[8] (and m[8] for Q4_1).
size_t PackedHeadBytes(GgmlType type) { return type == GgmlType::kQ4_1 ? 32 : 16; }

}  // namespace

bool IsPackable(GgmlType type) {
  return type == GgmlType::kQ4_0 || type == GgmlType::kQ4_1 || type == GgmlType::kQ8_0;
}

size_t PackedBlockBytes(GgmlType type) {
  assert(IsPackable(type));
  return kPackRows * NaturalBlockBytes(type);
}

size_t PackedGroupBytes(GgmlType type, int64_t blocks) {
  return static_cast<size_t>(blocks) * PackedBlockBytes(type);
}

std::vector<uint8_t> PackRows(const WeightView& w) {
  assert(IsPackable(w.type) && w.cols % kQuantBlock == 0);
  const int64_t blocks = w.cols / kQuantBlock;
  const int64_t groups = (w.rows + kPackRows - 1) / kPackRows;
  const size_t nb = NaturalBlockBytes(w.type);
  const size_t pb = PackedBlockBytes(w.type);
  const size_t head = PackedHeadBytes(w.type);
  const size_t qoff = QuantOffset(w.type);
  const int chunks = w.type == GgmlType::kQ8_0 ? 16 : 8;
  std::vector<uint8_t> out(groups * PackedGroupBytes(w.type, blocks), 0);  // padding rows: 0
  const auto* src = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    const int64_t g = r / kPackRows;
    const int i = static_cast<int>(r % kPackRows);
    for (int64_t b = 0; b < blocks; ++b) {
      const uint8_t* from = src + r * w.row_stride + b * nb;
      uint8_t* to = out.data() + g * PackedGroupBytes(w.type, blocks) + b * pb;
      std::memcpy(to + 2 * i, from, 2);                                          // d
      if (w.type == GgmlType::kQ4_1) std::memcpy(to + 16 + 2 * i, from + 2, 2);  // m
      for (int c = 0; c < chunks; ++c) {
        std::memcpy(to + head + 16 * c + 2 * i, from + qoff + 2 * c, 2);
      }
    }
  }
  return out;
}

void PackedMatMulReference(const QuantMatMulArgs& a, int64_t row_begin, int64_t row_end) {
  assert(row_begin % kPackRows == 0);
  const GgmlType type = a.type;
  const size_t pb = PackedBlockBytes(type);
  const size_t head = PackedHeadBytes(type);
  for (int64_t r = row_begin; r < row_end; ++r) {
    const uint8_t* group = a.w + (r / kPackRows) * a.row_stride;
    const int i = static_cast<int>(r % kPackRows);
    for (int64_t t = 0; t < a.n; ++t) {
      const int16_t* qs = a.x.qs + t * a.x.qs_stride;
      const float* dt = a.x.d + t * a.x.ds_stride;
      const float* st = a.x.s + t * a.x.ds_stride;
      float acc = 0.0f;
      for (int64_t b = 0; b < a.blocks; ++b) {
        const uint8_t* blk = group + b * pb;
        uint16_t h;
        std::memcpy(&h, blk + 2 * i, 2);
        const float dw = Fp16ToFp32(h);
        const uint8_t* q = blk + head;
        const int16_t* xb = qs + b * kQuantBlock;
        int32_t dot = 0;
        if (type == GgmlType::kQ8_0) {
          for (int c = 0; c < 16; ++c) {
            for (int k = 0; k < 2; ++k) {
              dot += static_cast<int8_t>(q[16 * c + 2 * i + k]) * xb[2 * c + k];
            }
          }
        } else {
          for (int c = 0; c < 8; ++c) {
            for (int k = 0; k < 2; ++k) {
              const uint8_t byte = q[16 * c + 2 * i + k];
              dot += (byte & 0x0F) * xb[2 * c + k] + (byte >> 4) * xb[2 * c + k + 16];
            }
          }
        }
        acc = std::fma(static_cast<float>(dot), dw * dt[b], acc);
        if (type == GgmlType::kQ4_1) {
          std::memcpy(&h, blk + 16 + 2 * i, 2);
          acc = std::fma(Fp16ToFp32(h), st[b], acc);
        } else if (type == GgmlType::kQ4_0) {
          acc = std::fma(-8.0f * dw, st[b], acc);
        }
      }
      a.y[t * a.ldy + r] = acc;
    }
  }
}

}  // namespace specnode::cpu_kernels
