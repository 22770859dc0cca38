#include "model/cpu/cpu_matmul.h"

#include <algorithm>
#include <cassert>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <vector>

#include "model/cpu/cpu_features.h"
#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_repack.h"
#include "model/gguf/ggml_converted_types.h"

namespace specnode {
namespace cpu_kernels {
namespace {

// Rows per scheduling unit: keeps each thread's share a whole number of row groups and
// stops tiny matrices (where a hand-off costs more than the work) from being split.
constexpr int64_t kRowGrain = 16;
// Below this many weight-values x tokens a matmul runs on the calling thread alone.
constexpr int64_t kMinParallelWork = 16 * 1024;
// Quantising activations is parallelised over tokens only from this many values on.
constexpr int64_t kMinParallelQuantize = 64 * 1024;
// Matrices per shared call whose bookkeeping stays on the stack.
constexpr size_t kMaxShared = 8;

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

// Does `act` run as int8 on table k (requested, and k has an int8 kernel)?
bool RunsInt8(const KernelTable& k, ActQuant act) {
  return act == ActQuant::kInt8 && k.matmul_quant8 != nullptr;
}

// Is the environment variable `name` set to "0" (the A/B switches below)?
bool EnvIsZero(const char* name) {
  const char* env = std::getenv(name);
  return env != nullptr && std::string(env) == "0";
}

bool IsQuantised(GgmlType t) {
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0 || RunsPackedOnly(t);
}

void RunRows(ThreadPool* pool, int64_t rows, int64_t work,
             const std::function<void(int64_t, int64_t, int)>& fn) {
  if (pool == nullptr || pool->n_threads() == 1 || work < kMinParallelWork) {
    fn(0, rows, 0);
  } else {
    pool->ParallelFor(rows, kRowGrain, fn);
  }
}

}  // namespace

const KernelTable& SelectedKernels() {
  static const KernelTable* const selected = [] {
    const std::vector<const KernelTable*> all = SupportedKernels();
    return all.back();
  }();
  return *selected;
}

std::vector<const KernelTable*> SupportedKernels() {
  const CpuFeatures& f = GetCpuFeatures();
  std::vector<const KernelTable*> tables = {&kScalarKernels};
  if (f.avx2) tables.push_back(&kAvx2Kernels);
  if (f.avx512) tables.push_back(&kAvx512Kernels);
  if (f.avx512_vnni) tables.push_back(&kAvx512VnniKernels);
  return tables;
}

void MatMulWith(const KernelTable& kernels, const WeightView& w, const float* x, int64_t n,
                float* y, ThreadPool* pool, MatMulScratch* scratch, ActQuant act) {
  MatMulSharedWith(kernels, std::span<const WeightView>(&w, 1), x, n,
                   std::span<float* const>(&y, 1), pool, scratch, act);
}

void MatMulSharedWith(const KernelTable& kernels, std::span<const WeightView> ws, const float* x,
                      int64_t n, std::span<float* const> ys, ThreadPool* pool,
                      MatMulScratch* scratch, ActQuant act) {
  assert(ws.size() == ys.size());
  if (n <= 0 || ws.empty()) return;
  for (const WeightView& w : ws) {
    assert((IsComputeGgmlType(w.type) || RunsPackedOnly(w.type)) &&
           "other types are converted at load (ggml_converted_types.h)");
    (void)w;
  }
  // One quantisation and one dispatch serve every matrix only if they agree on the input
  // width and on how it is consumed (activation order depends on the weight type).
  for (size_t i = 1; i < ws.size(); ++i) {
    const bool same =
        ws[i].cols == ws[0].cols &&
        (IsQuantised(ws[i].type) ? ws[i].type == ws[0].type : !IsQuantised(ws[0].type));
    if (!same || ws.size() > kMaxShared) {
      for (size_t j = 0; j < ws.size(); ++j) {
        MatMulSharedWith(kernels, ws.subspan(j, 1), x, n, ys.subspan(j, 1), pool, scratch, act);
      }
      return;
    }
  }
  const int64_t cols = ws[0].cols;
  // The matrices' rows, concatenated, each padded to whole grains so that a chunk boundary
  // is a row-block boundary in every matrix: part i covers [start[i], start[i] + rows).
  int64_t starts[kMaxShared + 1];
  int64_t rows = 0;
  starts[0] = 0;
  for (size_t i = 0; i < ws.size(); ++i) {
    starts[i + 1] = starts[i] + RoundUp(ws[i].rows, kRowGrain);
    rows += ws[i].rows;
  }
  const int64_t total = starts[ws.size()];
  if (total == 0) return;
  if (cols == 0) {
    for (size_t i = 0; i < ws.size(); ++i) std::fill(ys[i], ys[i] + n * ws[i].rows, 0.0f);
    return;
  }
  const int64_t work = rows * cols * n;
  // Calls fn(i, begin, end) for the rows of matrix i inside virtual rows [b, e).
  auto for_parts = [&](int64_t b, int64_t e, auto&& fn) {
    for (size_t i = 0; i < ws.size(); ++i) {
      const int64_t lo = std::max(b, starts[i]) - starts[i];
      const int64_t hi = std::min(e - starts[i], ws[i].rows);
      if (lo < hi) fn(i, lo, hi);
    }
  };
  if (!IsQuantised(ws[0].type)) {
    RunRows(pool, total, work, [&](int64_t b, int64_t e, int) {
      for_parts(b, e, [&](size_t i, int64_t lo, int64_t hi) {
        const WeightView& w = ws[i];
        const FloatMatMulArgs args{
            w.type, static_cast<const uint8_t*>(w.data), w.row_stride, cols, x, cols, n, ys[i],
            w.rows};
        kernels.matmul_float(args, lo, hi);
      });
    });
    return;
  }

  assert(cols % kQuantBlock == 0);
  const GgmlType type = ws[0].type;
  const int64_t blocks = cols / kQuantBlock;
  // K-quants and Q5_0 / Q5_1 run on the x8 kernels only (cpu_repack.h); int8 where the table
  // has an int8 kernel for the type, else int16.
  const bool packed_only = RunsPackedOnly(type);
  const bool int8 = RunsInt8(kernels, act) && X8KernelTakes(kernels, type, true);
  // The packed (x8) path serves the call if the table has a kernel for this width and every
  // matrix has its packed copy: the activations are then quantised in its natural order.
  const auto matmul_x8 = int8 ? kernels.matmul_quant8_x8 : kernels.matmul_quant_x8;
  bool packed = matmul_x8 != nullptr && X8KernelTakes(kernels, type, int8);
  for (const WeightView& w : ws) packed = packed && w.packed != nullptr;
  if (packed_only && !packed) {
    // The caller's bug (RunsStorageType says which types need converting first): NaN
    // outputs make it loud in release builds too.
    assert(false && "K-quant / Q5 matrix without its packed copy or kernel (RunsStorageType)");
    for (size_t i = 0; i < ws.size(); ++i) {
      std::fill(ys[i], ys[i] + n * ws[i].rows, std::numeric_limits<float>::quiet_NaN());
    }
    return;
  }
  const auto quantize16 = packed ? kernels.quantize_x8 : kernels.quantize;
  const auto quantize8 = packed ? kernels.quantize8_x8 : kernels.quantize8;
  const int64_t value_bytes = int8 ? 1 : 2;
  // Int8 activations against Q6_K: the half-block sums its kernels correct by.
  const bool halves = int8 && type == GgmlType::kQ6_K;
  // Scratch: [n, qs_stride] int16 (int8), then d and s as [n, ds_stride] f32 each, then
  // (halves) h16 as [n, 2 * ds_stride] int32, 64-byte aligned.
  const int64_t qs_stride = RoundUp(cols, 128);
  const int64_t ds_stride = RoundUp(blocks, 16);
  const size_t bytes = static_cast<size_t>(n * qs_stride * value_bytes + 2 * n * ds_stride * 4 +
                                           (halves ? 2 * n * ds_stride * 4 : 0) + 64);
  thread_local MatMulScratch fallback;
  if (scratch == nullptr) scratch = &fallback;
  if (scratch->buffer.size() < bytes) scratch->buffer.resize(bytes);
  uint8_t* base = scratch->buffer.data();
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  auto* qs = reinterpret_cast<int16_t*>(base);
  auto* qs8 = reinterpret_cast<int8_t*>(base);
  auto* d = reinterpret_cast<float*>(base + n * qs_stride * value_bytes);
  float* s = d + n * ds_stride;
  int32_t* h16 = halves ? reinterpret_cast<int32_t*>(s + n * ds_stride) : nullptr;

  auto quantize = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      float* dt = d + t * ds_stride;
      float* st = s + t * ds_stride;
      if (!AllFinite(x + t * cols, cols)) {
        // A NaN / Inf activation (a broken model) cannot be rounded to integers without
        // undefined behaviour; the row's scales become NaN instead, so its outputs are NaN
        // and the pass reports non-finite logits (llama_forward.h) rather than garbage.
        std::fill(dt, dt + ds_stride, std::numeric_limits<float>::quiet_NaN());
        std::fill(st, st + ds_stride, std::numeric_limits<float>::quiet_NaN());
        if (int8) {
          std::fill(qs8 + t * qs_stride, qs8 + (t + 1) * qs_stride, int8_t{0});
          if (halves) std::fill(h16 + t * 2 * ds_stride, h16 + (t + 1) * 2 * ds_stride, 0);
        } else {
          std::fill(qs + t * qs_stride, qs + (t + 1) * qs_stride, int16_t{0});
        }
        continue;
      }
      // Zero padding first (kernels read whole 4-block groups and 16-block chunks); a
      // quantiser may then write past `cols` within a group.
      std::fill(dt + blocks, dt + ds_stride, 0.0f);
      std::fill(st + blocks, st + ds_stride, 0.0f);
      if (int8) {
        int8_t* qt = qs8 + t * qs_stride;
        std::fill(qt + cols, qt + qs_stride, int8_t{0});
        quantize8(x + t * cols, blocks, type, qt, dt, st);
        if (halves) {
          // Natural order (the x8 quantisers'): half k is values 16k .. 16k + 15.
          int32_t* ht = h16 + t * 2 * ds_stride;
          for (int64_t k = 0; k < 2 * ds_stride; ++k) {
            int32_t sum = 0;
            if (k < 2 * blocks) {
              for (int j = 0; j < 16; ++j) sum += qt[16 * k + j];
            }
            ht[k] = sum;
          }
        }
      } else {
        int16_t* qt = qs + t * qs_stride;
        std::fill(qt + cols, qt + qs_stride, int16_t{0});
        quantize16(x + t * cols, blocks, type, qt, dt, st);
      }
    }
  };
  if (pool != nullptr && n > 1 && n * cols >= kMinParallelQuantize) {
    pool->ParallelFor(n, 1, quantize);
  } else {
    quantize(0, n, 0);
  }

  QuantActs acts;
  acts.qs = int8 ? nullptr : qs;
  acts.qs8 = int8 ? qs8 : nullptr;
  acts.d = d;
  acts.s = s;
  acts.h16 = h16;
  acts.qs_stride = qs_stride;
  acts.ds_stride = ds_stride;
  const auto matmul = int8 ? kernels.matmul_quant8 : kernels.matmul_quant;
  // Parts start on row grains (multiples of 16), so every part begins on a packed group of 8.
  static_assert(kRowGrain % kPackRows == 0);
  RunRows(pool, total, work, [&](int64_t b, int64_t e, int) {
    for_parts(b, e, [&](size_t i, int64_t lo, int64_t hi) {
      const WeightView& w = ws[i];
      if (packed) {
        const QuantMatMulArgs args{type,  w.packed, PackedGroupBytes(type, blocks), blocks, acts, n,
                                   ys[i], w.rows};
        matmul_x8(args, lo, hi);
        return;
      }
      const QuantMatMulArgs args{
          type, static_cast<const uint8_t*>(w.data), w.row_stride, blocks, acts, n, ys[i], w.rows};
      matmul(args, lo, hi);
    });
  });
}

}  // namespace cpu_kernels

const char* ActQuantName(ActQuant requested) {
  return cpu_kernels::RunsInt8(cpu_kernels::SelectedKernels(), requested) ? "int8" : "int16";
}

bool UsesPackedWeights(ActQuant act) {
  static const bool disabled = cpu_kernels::EnvIsZero("SPECNODE_REPACK");
  if (disabled) return false;
  const cpu_kernels::KernelTable& k = cpu_kernels::SelectedKernels();
  return (cpu_kernels::RunsInt8(k, act) ? k.matmul_quant8_x8 : k.matmul_quant_x8) != nullptr;
}

bool RunsStorageType(GgmlType type, ActQuant act) {
  static const bool convert_k = cpu_kernels::EnvIsZero("SPECNODE_KQUANT_NATIVE");
  static const bool convert_q5 = cpu_kernels::EnvIsZero("SPECNODE_Q5_NATIVE");
  if (IsComputeGgmlType(type)) return true;
  if (!cpu_kernels::RunsPackedOnly(type) || !UsesPackedWeights(act)) return false;
  if (IsKQuantType(type) ? convert_k : convert_q5) return false;
  const cpu_kernels::KernelTable& k = cpu_kernels::SelectedKernels();
  return cpu_kernels::X8KernelTakes(k, type, cpu_kernels::RunsInt8(k, act));
}

int64_t MatMulReadBytes(const WeightView& w, ActQuant act) {
  const GgmlType type = RunsStorageType(w.type, act) ? w.type : ComputeTypeOf(w.type);
  if (UsesPackedWeights(act) && cpu_kernels::IsPackable(type)) {
    const int64_t groups = (w.rows + cpu_kernels::kPackRows - 1) / cpu_kernels::kPackRows;
    return groups * static_cast<int64_t>(cpu_kernels::PackedGroupBytes(type, w.cols / kQuantBlock));
  }
  return w.rows * static_cast<int64_t>(GgmlRowBytes(type, w.cols));
}

std::vector<uint8_t> PackWeights(const WeightView& w) {
  if (!cpu_kernels::IsPackable(w.type)) return {};
  return cpu_kernels::PackRows(w);
}

void MatMul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool,
            MatMulScratch* scratch, ActQuant act) {
  cpu_kernels::MatMulWith(cpu_kernels::SelectedKernels(), w, x, n, y, pool, scratch, act);
}

void MatMulShared(std::span<const WeightView> ws, const float* x, int64_t n,
                  std::span<float* const> ys, ThreadPool* pool, MatMulScratch* scratch,
                  ActQuant act) {
  cpu_kernels::MatMulSharedWith(cpu_kernels::SelectedKernels(), ws, x, n, ys, pool, scratch,
                                act);
}

void MatMulReference(const WeightView& w, const float* x, int64_t n, float* y) {
  std::vector<float> row(w.cols);
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.type, wdata + r * w.row_stride, row.data(), w.cols);
    for (int64_t t = 0; t < n; ++t) {
      const float* xt = x + t * w.cols;
      double acc = 0.0;
      for (int64_t j = 0; j < w.cols; ++j) acc += static_cast<double>(row[j]) * xt[j];
      y[t * w.rows + r] = static_cast<float>(acc);
    }
  }
}

void EmbeddingRow(const WeightView& w, int64_t row, float* dst) {
  DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + row * w.row_stride, dst, w.cols);
}

}  // namespace specnode
