// Decode attention throughput of the KV store (kvstore/kv_store.h) per precision mode, on
// SmolLM2-135M's attention shapes: 30 layers, 3 kv heads of head_dim 64, 9 query heads
// (GQA group 3), one query token attending to a context of 512, 2048 or 4096 positions.
//
// One iteration is one decode step's KV work for the whole model, single-threaded:
// Reserve(1), Write of the new token's K/V in every layer, Attend for every layer and kv
// head, Commit, then Truncate back to the context length so every iteration sees the same
// context. Write (encoding 180 rows), Reserve and Commit take ~0.1 ms; Attend is the rest.
// Times are CPU times of the one thread (robust to other load on a shared machine).
// Counters:
//   ctx_tok/s  context positions scanned per second (one position = its K and V rows in
//              all 30 layers and 3 kv heads)
//   GB/s       bytes of K/V rows read per second (rows of the classes actually held)
//   f16, int8, int4  tokens of the sequence held in each class (mixed: sinks + window
//              f16, the rest INT8 if critical else INT4)
// Modes full, int8, int4 and mixed (sample_every 4, the default; ~9% INT8, see
// kMixedCriticalThreshold) compare the classes;
// mixed with sample_every 1 and the A/B mass_overhead measure the cost of observing
// attention mass for the critical-token policy (the store samples query positions). "dense" is the
// f32 reference cache (model/dense_kv_cache.h). KvAttention/verify/<mode>/ctx:C/rows:R times one
// pass of R query rows (a speculative verification of R - 1 drafts, or a prefill chunk) over a
// context of C: Reserve(R), Write and Attend of all R rows in every layer, Truncate back;
// rows/s against the rows:1 case says what an extra row costs. The kernel family (scalar, avx2,
// avx512) is the one GetCpuFeatures() selects; SPECNODE_CPU=scalar|avx2 caps it. Run e.g.
//   bench_kv_attention --benchmark_filter='KvAttention/(full|int4)/ctx:4096'
#include <benchmark/benchmark.h>

#include <time.h>

#include <cmath>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "kvstore/kv_cache_factory.h"
#include "kvstore/kv_store.h"
#include "model/cpu/cpu_features.h"
#include "model/llama/dense_kv_cache.h"

namespace specnode {
namespace {

constexpr int kLayers = 30, kKvHeads = 3, kHeadDim = 64, kGroup = 3;
constexpr int kHeads = kKvHeads * kGroup;
constexpr int kFillChunk = 256;
constexpr SeqId kSeq = 1;
// The fill's queries sit at multiples of this, so every tested sample rate observes them
// and the class mix after the fill is the same.
constexpr int kFillQueryAlign = 4;
// Random keys spread attention evenly, so the policy's default threshold would keep no
// token INT8; this one keeps ~9% of the context INT8 (real text: see docs/kvstore.md).
constexpr float kMixedCriticalThreshold = 1.1f;

// Random post-RoPE-like K/V for n tokens of one layer: [n, kKvHeads, kHeadDim].
void RandomRows(std::mt19937& gen, int n, std::vector<float>* k, std::vector<float>* v) {
  std::normal_distribution<float> dist(0.0f, 1.0f);
  k->resize(static_cast<size_t>(n) * kKvHeads * kHeadDim);
  v->resize(k->size());
  for (float& x : *k) x = dist(gen);
  for (float& x : *v) x = dist(gen);
}

// Fills `cache` with ctx tokens in chunks; after each chunk one of its last tokens (at a
// multiple of kFillQueryAlign) attends in every layer and head, so a mixed store observes
// attention mass as on a prefill.
// A pass over positions [pos0, pos0 + n) of kSeq (KvCache's pass protocol, kv_cache.h).
void Pass(KvCache& cache, int pos0, int n) {
  const KvPassEntry e{kSeq, pos0, n};
  if (!cache.BeginPass({&e, 1}, nullptr).ok()) std::abort();
}

void Fill(KvCache& cache, int ctx, std::mt19937& gen) {
  std::vector<float> k, v, q(static_cast<size_t>(kHeads) * kHeadDim), out(q.size());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  for (int pos0 = 0; pos0 < ctx; pos0 += kFillChunk) {
    const int n = std::min(kFillChunk, ctx - pos0);
    if (!cache.Reserve(kSeq, n).ok()) std::abort();
    for (int l = 0; l < kLayers; ++l) {
      RandomRows(gen, n, &k, &v);
      Pass(cache, pos0, n);
      if (!cache.Write(l, k.data(), v.data()).ok()) std::abort();
      for (float& x : q) x = dist(gen);
      const int query = (pos0 + n - 1) / kFillQueryAlign * kFillQueryAlign;
      Pass(cache, query, 1);  // one query row, attention only
      if (!cache.Attend(l, q.data(), scale, 0, out.data()).ok()) std::abort();
    }
    cache.Commit(kSeq, pos0 + n);
  }
}

void RunDecode(benchmark::State& state, KvCache& cache, int ctx, double bytes_per_step) {
  std::mt19937 gen(7);
  std::vector<float> k, v, q(static_cast<size_t>(kHeads) * kHeadDim), out(q.size());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : q) x = dist(gen);
  RandomRows(gen, 1, &k, &v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  // Decodes positions ctx .. ctx + 3 in turn (a mixed store samples query positions, so
  // a fixed position would be always or never observed), then rolls back to ctx.
  constexpr int kCycle = 4;
  int step = 0;
  for (auto _ : state) {
    const int pos = ctx + step;
    if (!cache.Reserve(kSeq, 1).ok()) std::abort();
    Pass(cache, pos, 1);
    for (int l = 0; l < kLayers; ++l) (void)cache.Write(l, k.data(), v.data());
    for (int l = 0; l < kLayers; ++l) (void)cache.Attend(l, q.data(), scale, 0, out.data());
    benchmark::DoNotOptimize(out.data());
    cache.Commit(kSeq, pos + 1);
    if (++step == kCycle) {
      if (!cache.Truncate(kSeq, ctx).ok()) std::abort();
      step = 0;
    }
  }
  state.counters["ctx_tok/s"] =
      benchmark::Counter(ctx + 1.0, benchmark::Counter::kIsIterationInvariantRate);
  state.counters["GB/s"] =
      benchmark::Counter(bytes_per_step * 1e-9, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(CpuKernelName());
}

// One pass of `rows` query rows at positions ctx .. ctx + rows - 1 per iteration, rolled
// back after it (the store samples query positions: every pass observes the same ones).
void RunPass(benchmark::State& state, KvCache& cache, int ctx, int rows) {
  std::mt19937 gen(7);
  std::vector<float> k, v, q(static_cast<size_t>(rows) * kHeads * kHeadDim), out(q.size());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : q) x = dist(gen);
  RandomRows(gen, rows, &k, &v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  for (auto _ : state) {
    if (!cache.Reserve(kSeq, rows).ok()) std::abort();
    Pass(cache, ctx, rows);
    for (int l = 0; l < kLayers; ++l) (void)cache.Write(l, k.data(), v.data());
    for (int l = 0; l < kLayers; ++l) (void)cache.Attend(l, q.data(), scale, 0, out.data());
    benchmark::DoNotOptimize(out.data());
    cache.Commit(kSeq, ctx + rows);
    if (!cache.Truncate(kSeq, ctx).ok()) std::abort();
  }
  state.counters["rows/s"] =
      benchmark::Counter(rows, benchmark::Counter::kIsIterationInvariantRate);
  state.SetLabel(CpuKernelName());
}

absl::StatusOr<std::unique_ptr<KvStore>> FilledStore(KvMode mode, int sample_every, int ctx) {
  KvStoreConfig c;
  c.n_layers = kLayers;
  c.n_kv_heads = kKvHeads;
  c.head_dim = kHeadDim;
  c.gqa_group = kGroup;
  c.max_seq_len = 16384;
  c.capacity_bytes = int64_t{1} << 30;
  c.mode = mode;
  c.mass_sample_every = sample_every;
  c.critical_threshold = kMixedCriticalThreshold;
  auto store = MakeHostKvStore(c);
  if (!store.ok()) return store.status();
  std::mt19937 gen(1);
  Fill(**store, ctx, gen);
  return store;
}

void BM_Verify(benchmark::State& state, KvMode mode) {
  const int ctx = static_cast<int>(state.range(0));
  auto store = FilledStore(mode, 4, ctx);
  if (!store.ok()) {
    state.SkipWithError(std::string(store.status().message()).c_str());
    return;
  }
  RunPass(state, **store, ctx, static_cast<int>(state.range(1)));
}

void BM_KvStore(benchmark::State& state, KvMode mode, int sample_every) {
  const int ctx = static_cast<int>(state.range(0));
  auto store = FilledStore(mode, sample_every, ctx);
  if (!store.ok()) {
    state.SkipWithError(std::string(store.status().message()).c_str());
    return;
  }
  const auto tokens = (*store)->SequenceTokens(kSeq);
  double bytes = 0;  // K and V rows of every layer and kv head, +1 for the new token
  for (int p = 0; p < kNumKvPrecisions; ++p) {
    const double pair = static_cast<double>(KvPairBytes(static_cast<KvPrecision>(p), kHeadDim));
    bytes += (tokens[p] + (p == 0 ? 1 : 0)) * pair * kKvHeads * kLayers;
  }
  RunDecode(state, **store, ctx, bytes);
  state.counters["f16"] = static_cast<double>(tokens[0]);
  state.counters["int8"] = static_cast<double>(tokens[1]);
  state.counters["int4"] = static_cast<double>(tokens[2]);
  state.counters["int2"] = static_cast<double>(tokens[3]);
}

double ThreadSeconds() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) + 1e-9 * static_cast<double>(t.tv_nsec);
}

// The cost of observing attention mass, measured A/B on one store: with sample_every 2,
// decode steps alternate between a query at an even position (observed) and one at the
// next, odd position (not), so both kinds read the same memory in the same state and
// share whatever else the machine is doing. Reports the CPU time of
// each kind and mass_overhead_% = observed / plain - 1 (sample_every N costs 1/N of it).
void BM_MassOverhead(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0));
  auto store = FilledStore(KvMode::kMixed, 2, ctx);
  if (!store.ok()) {
    state.SkipWithError(std::string(store.status().message()).c_str());
    return;
  }
  KvStore& kv = **store;
  std::mt19937 gen(1);
  std::vector<float> k, v, q(static_cast<size_t>(kHeads) * kHeadDim), out(q.size());
  std::normal_distribution<float> dist(0.0f, 1.0f);
  for (float& x : q) x = dist(gen);
  RandomRows(gen, 2, &k, &v);
  const float scale = 1.0f / std::sqrt(static_cast<float>(kHeadDim));
  const int even = ctx / 2 * 2;
  if (!kv.Truncate(kSeq, even).ok()) std::abort();
  int64_t step = 0;
  double seconds[2] = {0, 0};  // [plain, observed]
  int64_t steps[2] = {0, 0};
  for (auto _ : state) {
    const double t0 = ThreadSeconds();
    // Both kinds write the same two tokens; the query is the first (even) or the second.
    const int observed = step++ % 2 == 0 ? 1 : 0;
    const int pos = even + (observed ? 0 : 1);
    if (!kv.Reserve(kSeq, 2).ok()) std::abort();
    Pass(kv, even, 2);
    for (int l = 0; l < kLayers; ++l) (void)kv.Write(l, k.data(), v.data());
    Pass(kv, pos, 1);
    for (int l = 0; l < kLayers; ++l) (void)kv.Attend(l, q.data(), scale, 0, out.data());
    benchmark::DoNotOptimize(out.data());
    kv.Commit(kSeq, even + 2);
    if (!kv.Truncate(kSeq, even).ok()) std::abort();
    seconds[observed] += ThreadSeconds() - t0;
    ++steps[observed];
  }
  if (steps[0] == 0 || steps[1] == 0) return;
  const double plain = seconds[0] / steps[0] * 1e3, observed = seconds[1] / steps[1] * 1e3;
  state.counters["plain_ms"] = plain;
  state.counters["observed_ms"] = observed;
  state.counters["mass_overhead_%"] = 100.0 * (observed / plain - 1.0);
  state.SetLabel(CpuKernelName());
}

void BM_Dense(benchmark::State& state) {
  const int ctx = static_cast<int>(state.range(0));
  DenseKvCache dense(kLayers, kKvHeads, kHeadDim, kGroup, 8192, 8192);
  std::mt19937 gen(1);
  Fill(dense, ctx, gen);
  RunDecode(state, dense, ctx, (ctx + 1.0) * kHeadDim * 4 * 2 * kKvHeads * kLayers);
}

void RegisterAll() {
  auto common = [](benchmark::internal::Benchmark* b) {
    b->ArgNames({"ctx"})->Args({512})->Args({2048})->Args({4096})->Args({8192})->Unit(
        benchmark::kMillisecond);
  };
  common(benchmark::RegisterBenchmark("KvAttention/dense", BM_Dense));
  for (KvMode mode : {KvMode::kFull, KvMode::kInt8, KvMode::kInt4, KvMode::kInt2}) {
    const std::string name = "KvAttention/" + std::string(KvModeName(mode));
    common(benchmark::RegisterBenchmark(name.c_str(), BM_KvStore, mode, 4));
  }
  common(benchmark::RegisterBenchmark("KvAttention/mixed/mass_overhead", BM_MassOverhead));
  for (KvMode mode : {KvMode::kFull, KvMode::kInt4, KvMode::kMixed}) {
    const std::string name = "KvAttention/verify/" + std::string(KvModeName(mode));
    benchmark::RegisterBenchmark(name.c_str(), BM_Verify, mode)
        ->ArgNames({"ctx", "rows"})
        ->ArgsProduct({{512, 2048, 6144}, {1, 5, 9}})
        ->Unit(benchmark::kMillisecond);
  }
  for (int every : {4, 1}) {
    const std::string name = "KvAttention/mixed/sample_every:" + std::to_string(every);
    common(benchmark::RegisterBenchmark(name.c_str(), BM_KvStore, KvMode::kMixed, every));
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
