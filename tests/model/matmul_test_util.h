// Helpers of the MatMul tests (cpu_matmul_test.cc, cpu_matmul_kquant_test.cc,
// cpu_matmul_q5_test.cc): weights and activations made from fixed seeds, the kernel runs a
// type and activation width has, and the bounds the tests hold results to (see
// cpu_matmul_test.cc's header).
#pragma once

#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gtest/gtest.h"

#include "model/cpu/cpu_kernels.h"
#include "model/cpu/cpu_matmul.h"
#include "model/cpu/cpu_repack.h"
#include "model/cpu/thread_pool.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"

namespace specnode::matmul_test {

using cpu_kernels::KernelTable;

inline bool IsQuantised(GgmlType t) {
  return t == GgmlType::kQ4_0 || t == GgmlType::kQ4_1 || t == GgmlType::kQ8_0 ||
         cpu_kernels::RunsPackedOnly(t);
}

// A weight matrix in storage form; `view` may be a column slice of the stored rows.
struct TestWeights {
  std::vector<uint8_t> bytes;
  WeightView view;
};

// rows x full_cols values, quantised row by row; the view starts `col_offset` values into
// each row (a block boundary) and spans `cols`.
inline TestWeights MakeWeights(GgmlType type, int64_t rows, int64_t cols, int64_t full_cols,
                               int64_t col_offset, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> row(full_cols);
  TestWeights w;
  const size_t row_bytes = GgmlRowBytes(type, full_cols);
  w.bytes.resize(rows * row_bytes);  // no slack: ASan catches reads past the matrix
  for (int64_t r = 0; r < rows; ++r) {
    const float scale = 0.02f * (1.0f + static_cast<float>(r % 5));  // rows differ in range
    for (float& v : row) v = normal(rng) * scale;
    QuantizeRow(type, row.data(), w.bytes.data() + r * row_bytes, full_cols);
  }
  w.view.type = type;
  w.view.data = w.bytes.data() + GgmlRowBytes(type, col_offset);
  w.view.rows = rows;
  w.view.cols = cols;
  w.view.row_stride = row_bytes;
  return w;
}

inline std::vector<float> MakeActs(int64_t n, int64_t cols, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n * cols);
  for (size_t i = 0; i < x.size(); ++i) {
    x[i] = normal(rng);
    if (i % 97 == 0) x[i] *= 20.0f;  // outliers, as real activations have
  }
  return x;
}

// Largest quantised activation magnitude of a mode.
inline float ActMax(ActQuant act) { return act == ActQuant::kInt8 ? 127.0f : 32767.0f; }

// The tables that run `act` with their own kernel (int8: those with matmul_quant8).
inline std::vector<const KernelTable*> TablesFor(ActQuant act) {
  std::vector<const KernelTable*> out;
  for (const KernelTable* k : cpu_kernels::SupportedKernels()) {
    if (act == ActQuant::kInt16 || k->matmul_quant8 != nullptr) out.push_back(k);
  }
  return out;
}

// The scalar table with the scalar x8 kernels (PackedMatMulReference, ...Reference8): the
// bit-exact reference for every table's matmul_quant_x8 / matmul_quant8_x8 (the tables'
// x8 quantisers agree bit for bit with the scalar ones, natural order).
inline const KernelTable kPackedReference = [] {
  KernelTable k = cpu_kernels::kScalarKernels;
  k.name = "scalar-x8-reference";
  k.matmul_quant_x8 = &cpu_kernels::PackedMatMulReference;
  k.matmul_quant8_x8 = &cpu_kernels::PackedMatMulReference8;
  k.kquant_x8 = true;  // PackedMatMulReference(8) runs PackedKQuantReference(8) for them
  k.kquant8_x8 = true;
  k.q5_x8 = true;
  k.q5_8_x8 = true;
  return k;
}();

// The table's x8 kernel for `act`, or null.
inline auto X8KernelFor(const KernelTable& k, ActQuant act) {
  return act == ActQuant::kInt8 ? k.matmul_quant8_x8 : k.matmul_quant_x8;
}

// A kernel table run on a view, packed (WeightView::packed set) or not.
struct KernelRun {
  const KernelTable* table;
  bool packed;
  std::string name() const { return std::string(table->name) + (packed ? " packed" : ""); }
};

// The scalar x8 reference, then every table with an x8 kernel for `act`, on the packed copy
// (quantised types only; K-quants and Q5: the tables with a kernel for the type and `act`).
inline std::vector<KernelRun> PackedRunsFor(GgmlType type, ActQuant act) {
  std::vector<KernelRun> runs;
  if (!IsQuantised(type)) return runs;
  runs.push_back({&kPackedReference, true});
  for (const KernelTable* k : TablesFor(act)) {
    if (X8KernelFor(*k, act) != nullptr &&
        cpu_kernels::X8KernelTakes(*k, type, act == ActQuant::kInt8)) {
      runs.push_back({k, true});
    }
  }
  return runs;
}

// TablesFor(act) on the natural layout (not for K-quants and Q5, which run packed only),
// then PackedRunsFor.
inline std::vector<KernelRun> RunsFor(GgmlType type, ActQuant act) {
  std::vector<KernelRun> runs;
  if (!cpu_kernels::RunsPackedOnly(type)) {
    for (const KernelTable* k : TablesFor(act)) runs.push_back({k, false});
  }
  for (const KernelRun& run : PackedRunsFor(type, act)) runs.push_back(run);
  return runs;
}

// `w` with its packed copy (kept in *storage) when `packed`.
inline WeightView ViewFor(const WeightView& w, bool packed, std::vector<uint8_t>* storage) {
  WeightView v = w;
  if (packed) {
    *storage = PackWeights(w);
    v.packed = storage->data();
  }
  return v;
}

inline const char* ActName(ActQuant act) { return act == ActQuant::kInt8 ? "int8" : "int16"; }

// The documented activation rounding (cpu_kernels.h), dequantised back to floats.
inline std::vector<float> RoundTripActs(const std::vector<float>& x, int64_t n, int64_t cols,
                                        ActQuant act, std::vector<float>* half_step) {
  std::vector<float> out(x.size());
  half_step->assign(x.size(), 0.0f);
  for (int64_t i0 = 0; i0 < n * cols; i0 += kQuantBlock) {
    float amax = 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) amax = std::max(amax, std::fabs(x[i0 + j]));
    const float d = amax / ActMax(act);
    const float id = d != 0.0f ? 1.0f / d : 0.0f;
    for (int j = 0; j < kQuantBlock; ++j) {
      out[i0 + j] = std::nearbyint(x[i0 + j] * id) * d;
      (*half_step)[i0 + j] = d / 2;
    }
  }
  return out;
}

// Σ_j |w_j| a_j per (token, row), from the dequantised weights.
inline std::vector<double> AbsDot(const WeightView& w, const std::vector<float>& a, int64_t n) {
  std::vector<double> out(n * w.rows);
  std::vector<float> row(w.cols);
  for (int64_t r = 0; r < w.rows; ++r) {
    DequantizeRow(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_stride, row.data(),
                  w.cols);
    for (int64_t t = 0; t < n; ++t) {
      double s = 0.0;
      for (int64_t j = 0; j < w.cols; ++j) s += std::fabs(row[j]) * std::fabs(a[t * w.cols + j]);
      out[t * w.rows + r] = s;
    }
  }
  return out;
}

// One packed-only matrix (K-quant, Q5) multiplied natively (its packed copy through the
// scalar x8 reference) and as the load-time conversion would leave it (ComputeTypeOf, natural
// layout, the scalar table), each against `exact` = the stored weights times the rounded
// activations xq; the squared errors summed.
struct NativeVsConverted {
  std::vector<float> exact, native, converted;
  double native_sq = 0.0, converted_sq = 0.0;
};
inline NativeVsConverted CompareWithConversion(const WeightView& w, const std::vector<float>& x,
                                               const std::vector<float>& xq, int64_t n) {
  NativeVsConverted out;
  const int64_t rows = w.rows, cols = w.cols;
  out.exact.resize(n * rows);
  MatMulReference(w, xq.data(), n, out.exact.data());
  std::vector<uint8_t> storage;
  const WeightView native = ViewFor(w, true, &storage);
  const GgmlType ct = ComputeTypeOf(w.type);
  const size_t crow = GgmlRowBytes(ct, cols);
  std::vector<uint8_t> converted_bytes(rows * crow);
  for (int64_t r = 0; r < rows; ++r) {
    ConvertRowToComputeType(w.type, static_cast<const uint8_t*>(w.data) + r * w.row_stride,
                            converted_bytes.data() + r * crow, cols);
  }
  const WeightView converted{ct, converted_bytes.data(), rows, cols, crow};
  out.native.resize(n * rows);
  out.converted.resize(n * rows);
  cpu_kernels::MatMulWith(kPackedReference, native, x.data(), n, out.native.data(), nullptr,
                          nullptr);
  cpu_kernels::MatMulWith(cpu_kernels::kScalarKernels, converted, x.data(), n, out.converted.data(),
                          nullptr, nullptr);
  for (int64_t i = 0; i < n * rows; ++i) {
    out.native_sq += std::pow(out.native[i] - out.exact[i], 2);
    out.converted_sq += std::pow(out.converted[i] - out.exact[i], 2);
  }
  return out;
}

// Matrices of one packed-only type (K-quant, Q5) with `rows` rows each and `cols` columns
// share one activation quantisation and one dispatch (MatMulSharedWith); each result must
// equal one MatMul of that matrix, on every packed run of both widths, for each n in `ns`.
inline void ExpectSharedEqualsSeparate(GgmlType type, int64_t cols,
                                       const std::vector<int64_t>& rows,
                                       const std::vector<int64_t>& ns) {
  std::vector<TestWeights> ws;
  std::vector<std::vector<uint8_t>> packed(rows.size());
  std::vector<WeightView> views;
  for (size_t i = 0; i < rows.size(); ++i) {
    ws.push_back(MakeWeights(type, rows[i], cols, cols, 0, 30 + static_cast<uint32_t>(i)));
  }
  for (size_t i = 0; i < ws.size(); ++i) views.push_back(ViewFor(ws[i].view, true, &packed[i]));
  for (const ActQuant act : {ActQuant::kInt16, ActQuant::kInt8}) {
    for (const KernelRun& run : PackedRunsFor(type, act)) {
      for (const int64_t n : ns) {
        SCOPED_TRACE(run.name() + " " + std::string(GgmlTypeName(static_cast<uint32_t>(type))) +
                     " " + ActName(act) + " n=" + std::to_string(n));
        const std::vector<float> x = MakeActs(n, cols, 3);
        ThreadPool pool(2);
        std::vector<std::vector<float>> shared(views.size()), alone(views.size());
        std::vector<float*> ys;
        for (size_t i = 0; i < views.size(); ++i) {
          shared[i].assign(n * rows[i], NAN);
          alone[i].assign(n * rows[i], NAN);
          ys.push_back(shared[i].data());
        }
        cpu_kernels::MatMulSharedWith(*run.table, views, x.data(), n, ys, &pool, nullptr, act);
        for (size_t i = 0; i < views.size(); ++i) {
          cpu_kernels::MatMulWith(*run.table, views[i], x.data(), n, alone[i].data(), nullptr,
                                  nullptr, act);
          EXPECT_EQ(0, std::memcmp(shared[i].data(), alone[i].data(), alone[i].size() * 4));
        }
      }
    }
  }
}

}  // namespace specnode::matmul_test
