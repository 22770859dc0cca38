// MatMul throughput over SmolLM2-135M's matrix shapes, per weight type, token count n and
// thread count, reporting weight bytes read per second ("GB/s") and tokens per second.
//
// A decode step streams ~98 MB of weights, more than any L2 and comparable to an L3, so
// each benchmark cycles through copies of its matrix totalling at least
// SPECNODE_BENCH_WORKING_SET_MB (default 128) to read from the same level of the memory
// hierarchy a real decode does. Run e.g.
//   bench_matmul --benchmark_filter='Q4_1/1536x576/n:1/threads:2'
#include <benchmark/benchmark.h>

#include <algorithm>
#include <cstdlib>
#include <memory>
#include <random>
#include <span>
#include <string>
#include <vector>

#include "model/cpu/cpu_features.h"
#include "model/cpu/cpu_matmul.h"
#include "model/gguf/ggml_types.h"
#include "model/cpu/thread_pool.h"

namespace specnode {
namespace {

struct MatShape {
  const char* name;
  int64_t rows, cols;
};

// out x in: q/o projections, k/v, gate/up, down, tied output head.
constexpr MatShape kShapes[] = {
    {"576x576", 576, 576},   {"192x576", 192, 576},     {"1536x576", 1536, 576},
    {"576x1536", 576, 1536}, {"49152x576", 49152, 576},
};

constexpr GgmlType kTypes[] = {GgmlType::kQ4_1, GgmlType::kQ4_0, GgmlType::kQ8_0,
                               GgmlType::kF16,  GgmlType::kBF16, GgmlType::kF32};

size_t WorkingSetBytes() {
  const char* env = std::getenv("SPECNODE_BENCH_WORKING_SET_MB");
  const long mb = env != nullptr ? std::atol(env) : 128;
  return static_cast<size_t>(std::max(1L, mb)) << 20;
}

// One matrix quantised once, then replicated `copies` times back to back.
struct Weights {
  std::vector<uint8_t> bytes;
  size_t matrix_bytes = 0;
  int copies = 1;
};

Weights MakeWeights(GgmlType type, int64_t rows, int64_t cols) {
  Weights w;
  const size_t row_bytes = GgmlRowBytes(type, cols);
  w.matrix_bytes = row_bytes * rows;
  w.copies = static_cast<int>(std::max<size_t>(1, WorkingSetBytes() / w.matrix_bytes + 1));
  w.bytes.resize(w.matrix_bytes * w.copies);
  std::mt19937 rng(1);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  std::vector<float> row(cols);
  for (int64_t r = 0; r < rows; ++r) {
    for (float& v : row) v = normal(rng);
    QuantizeRow(type, row.data(), w.bytes.data() + r * row_bytes, cols);
  }
  for (int c = 1; c < w.copies; ++c) {
    std::copy_n(w.bytes.data(), w.matrix_bytes, w.bytes.data() + c * w.matrix_bytes);
  }
  return w;
}

void BM_MatMul(benchmark::State& state, GgmlType type, MatShape shape) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const ActQuant act = state.range(2) == 8 ? ActQuant::kInt8 : ActQuant::kInt16;
  // packed:1 times the row-interleaved copy (cpu_repack.h), as the CPU backend uploads it.
  const bool packed = state.range(3) == 1;
  const bool float_type =
      type == GgmlType::kF32 || type == GgmlType::kF16 || type == GgmlType::kBF16;
  if (packed && (!UsesPackedWeights(act) || float_type)) {
    state.SkipWithError("no packed kernel for these weights and activations here");
    return;
  }
  const Weights w = MakeWeights(type, shape.rows, shape.cols);
  WeightView view{type, nullptr, shape.rows, shape.cols, GgmlRowBytes(type, shape.cols)};
  // The packed copies, back to back like w's.
  std::vector<uint8_t> packed_bytes;
  size_t packed_matrix_bytes = 0;
  if (packed) {
    view.data = w.bytes.data();
    const std::vector<uint8_t> one = PackWeights(view);
    packed_matrix_bytes = one.size();
    for (int c = 0; c < w.copies; ++c)
      packed_bytes.insert(packed_bytes.end(), one.begin(), one.end());
  }
  std::vector<float> x(n * shape.cols), y(n * shape.rows);
  std::mt19937 rng(2);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (float& v : x) v = normal(rng);
  auto pool = std::make_unique<ThreadPool>(threads);
  MatMulScratch scratch;
  int copy = 0;
  for (auto _ : state) {
    view.data = w.bytes.data() + copy * w.matrix_bytes;
    if (packed) view.packed = packed_bytes.data() + copy * packed_matrix_bytes;
    copy = copy + 1 == w.copies ? 0 : copy + 1;
    MatMul(view, x.data(), n, y.data(), pool.get(), &scratch, act);
    benchmark::DoNotOptimize(y.data());
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(w.matrix_bytes) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  // Multiply-adds count 2 ops, as bench_peak counts them: compare with its loops.
  state.counters["GOPS"] =
      benchmark::Counter(2e-9 * static_cast<double>(shape.rows * shape.cols * n),
                         benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(CpuKernelName() + " " + ActQuantName(act));
}

// Every matmul of one SmolLM2-135M decode step, in forward order, on distinct buffers:
// 30 layers x (q, k, v, o, gate, up, down) in Q4_1, then the Q8_0 output head (~96 MB),
// grouped as LlamaForward runs them (q/k/v and gate/up as one MatMulShared each).
// Activations are not chained (each matmul reads a fixed x): this times the weight stream
// and the per-call overhead (quantising x, the thread hand-off), nothing else. n = 2..9 is
// a speculative verification pass (K + 1 tokens), which should cost little more than n = 1.
// Run e.g. bench_matmul --benchmark_filter='DecodeStep.*act:16' for natural vs packed.
void BM_DecodeStep(benchmark::State& state) {
  const int64_t n = state.range(0);
  const int threads = static_cast<int>(state.range(1));
  const ActQuant act = state.range(2) == 8 ? ActQuant::kInt8 : ActQuant::kInt16;
  // packed:1 gives every matrix its row-interleaved copy, as the CPU backend does where
  // the kernels use it (UsesPackedWeights); packed:0 times the natural layout.
  const bool packed = state.range(3) == 1;
  if (packed && !UsesPackedWeights(act)) {
    state.SkipWithError("these kernels have no packed variant for these activations");
    return;
  }
  struct Mat {
    WeightView view;
    std::vector<uint8_t> bytes;
    std::vector<uint8_t> packed;
  };
  std::vector<Mat> mats;
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 0.05f);
  auto add = [&](GgmlType type, int64_t rows, int64_t cols) {
    Mat m;
    const size_t row_bytes = GgmlRowBytes(type, cols);
    m.bytes.resize(row_bytes * rows);
    std::vector<float> row(cols);
    for (int64_t r = 0; r < rows; ++r) {
      for (float& v : row) v = normal(rng);
      QuantizeRow(type, row.data(), m.bytes.data() + r * row_bytes, cols);
    }
    m.view = WeightView{type, nullptr, rows, cols, row_bytes};
    mats.push_back(std::move(m));
  };
  for (int layer = 0; layer < 30; ++layer) {
    add(GgmlType::kQ4_1, 576, 576);   // q
    add(GgmlType::kQ4_1, 192, 576);   // k
    add(GgmlType::kQ4_1, 192, 576);   // v
    add(GgmlType::kQ4_1, 576, 576);   // o
    add(GgmlType::kQ4_1, 1536, 576);  // gate
    add(GgmlType::kQ4_1, 1536, 576);  // up
    add(GgmlType::kQ4_1, 576, 1536);  // down
  }
  add(GgmlType::kQ8_0, 49152, 576);  // output head (tied embedding)
  size_t total = 0;
  for (Mat& m : mats) {
    m.view.data = m.bytes.data();
    if (packed) {
      m.packed = PackWeights(m.view);
      m.view.packed = m.packed.data();
    }
    total += m.bytes.size();
  }
  std::vector<float> x(n * 1536), y(n * 49152);
  for (float& v : x) v = normal(rng) * 20.0f;
  auto pool = std::make_unique<ThreadPool>(threads);
  MatMulScratch scratch;
  // Consecutive matrices read by one MatMulShared: per layer {q, k, v}, {o}, {gate, up},
  // {down}; then the head.
  std::vector<std::vector<WeightView>> calls;
  for (size_t i = 0; i + 1 < mats.size(); i += 7) {
    calls.push_back({mats[i].view, mats[i + 1].view, mats[i + 2].view});
    calls.push_back({mats[i + 3].view});
    calls.push_back({mats[i + 4].view, mats[i + 5].view});
    calls.push_back({mats[i + 6].view});
  }
  calls.push_back({mats.back().view});
  std::vector<float> y2(n * 1536), y3(n * 1536);
  const std::vector<float*> ys = {y.data(), y2.data(), y3.data()};
  for (auto _ : state) {
    for (const std::vector<WeightView>& c : calls) {
      MatMulShared(c, x.data(), n, std::span<float* const>(ys.data(), c.size()), pool.get(),
                   &scratch, act);
    }
    benchmark::ClobberMemory();
  }
  state.counters["GB/s"] = benchmark::Counter(static_cast<double>(total) * 1e-9,
                                              benchmark::Counter::kIsIterationInvariantRate);
  state.counters["tok/s"] =
      benchmark::Counter(static_cast<double>(n), benchmark::Counter::kIsIterationInvariantRate);
  state.counters["MB"] = static_cast<double>(total) / 1e6;
  state.SetLabel(CpuKernelName() + " " + ActQuantName(act));
}

// Only the shapes that matter for each type, to keep a full run short: every shape for
// Q4_1 (the SmolLM2 file's matrices) and the head for Q8_0 (its output/embedding matrix).
bool Wanted(GgmlType type, const MatShape& shape) {
  if (type == GgmlType::kQ4_1) return true;
  if (type == GgmlType::kQ8_0) return shape.rows == 49152 || shape.rows == 1536;
  return shape.rows == 1536;
}

void RegisterAll() {
  benchmark::RegisterBenchmark("DecodeStep/SmolLM2", BM_DecodeStep)
      ->ArgNames({"n", "threads", "act", "packed"})
      ->ArgsProduct({{1, 2, 4, 5, 8, 9, 16}, {1, 2}, {16, 8}, {0, 1}})
      ->UseRealTime()
      ->Unit(benchmark::kMillisecond);
  for (GgmlType type : kTypes) {
    for (const MatShape& shape : kShapes) {
      if (!Wanted(type, shape)) continue;
      const std::string name = std::string("MatMul/") +
                               std::string(GgmlTypeName(static_cast<uint32_t>(type))) + "/" +
                               shape.name;
      benchmark::RegisterBenchmark(name.c_str(), BM_MatMul, type, shape)
          ->ArgNames({"n", "threads", "act", "packed"})
          ->ArgsProduct({{1, 5, 16}, {1, 2}, {16, 8}, {0, 1}})
          ->UseRealTime()
          ->Unit(benchmark::kMicrosecond);
    }
  }
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) {
  benchmark::Initialize(&argc, argv);
  if (benchmark::ReportUnrecognizedArguments(argc, argv)) return 1;
  specnode::RegisterAll();
  benchmark::RunSpecifiedBenchmarks();
  benchmark::Shutdown();
  return 0;
}
