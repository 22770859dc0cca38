#include "model/cpu_matmul.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "model/cpu_features.h"
#include "model/cpu_kernels.h"

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

int64_t RoundUp(int64_t v, int64_t m) { return (v + m - 1) / m * m; }

bool IsQuantised(GgmlType t) {
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0;
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
                float* y, ThreadPool* pool, MatMulScratch* scratch) {
  if (n <= 0 || w.rows <= 0) return;
  const auto* wdata = static_cast<const uint8_t*>(w.data);
  if (w.cols == 0) {
    std::fill(y, y + n * w.rows, 0.0f);
    return;
  }
  const int64_t work = w.rows * w.cols * n;
  if (!IsQuantised(w.type)) {
    const FloatMatMulArgs args{w.type, wdata, w.row_stride, w.cols, x, w.cols, n, y, w.rows};
    RunRows(pool, w.rows, work,
            [&](int64_t b, int64_t e, int) { kernels.matmul_float(args, b, e); });
    return;
  }

  assert(w.cols % kQuantBlock == 0);
  const int64_t blocks = w.cols / kQuantBlock;
  // Scratch: [n, qs_stride] int16, then d and s as [n, ds_stride] f32 each, 64-byte aligned.
  const int64_t qs_stride = RoundUp(w.cols, 128);
  const int64_t ds_stride = RoundUp(blocks, 16);
  const size_t bytes = static_cast<size_t>(n * qs_stride * 2 + 2 * n * ds_stride * 4 + 64);
  thread_local MatMulScratch fallback;
  if (scratch == nullptr) scratch = &fallback;
  if (scratch->buffer.size() < bytes) scratch->buffer.resize(bytes);
  uint8_t* base = scratch->buffer.data();
  base += (64 - reinterpret_cast<uintptr_t>(base) % 64) % 64;
  auto* qs = reinterpret_cast<int16_t*>(base);
  auto* d = reinterpret_cast<float*>(base + n * qs_stride * 2);
  float* s = d + n * ds_stride;

  auto quantize = [&](int64_t t0, int64_t t1, int) {
    for (int64_t t = t0; t < t1; ++t) {
      int16_t* qt = qs + t * qs_stride;
      float* dt = d + t * ds_stride;
      float* st = s + t * ds_stride;
      // Zero padding first (kernels read whole 4-block groups and 16-block chunks); a
      // quantiser may then write past `cols` within a group.
      std::fill(qt + w.cols, qt + qs_stride, int16_t{0});
      std::fill(dt + blocks, dt + ds_stride, 0.0f);
      std::fill(st + blocks, st + ds_stride, 0.0f);
      kernels.quantize(x + t * w.cols, blocks, w.type, qt, dt, st);
    }
  };
  if (pool != nullptr && n > 1 && n * w.cols >= kMinParallelQuantize) {
    pool->ParallelFor(n, 1, quantize);
  } else {
    quantize(0, n, 0);
  }

  const QuantMatMulArgs args{
      w.type, wdata, w.row_stride, blocks, QuantActs{qs, d, s, qs_stride, ds_stride}, n, y, w.rows};
  RunRows(pool, w.rows, work, [&](int64_t b, int64_t e, int) { kernels.matmul_quant(args, b, e); });
}

}  // namespace cpu_kernels

void MatMul(const WeightView& w, const float* x, int64_t n, float* y, ThreadPool* pool,
            MatMulScratch* scratch) {
  cpu_kernels::MatMulWith(cpu_kernels::SelectedKernels(), w, x, n, y, pool, scratch);
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
