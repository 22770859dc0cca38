// bench_peak: this machine's limits, so that every speed report can state its fraction of
// them (issue 18): per core and over all threads, the throughput of the instructions the
// matmul kernels are built from (f32 FMA; int16 vpmaddwd; int8 vpmaddubsw on AVX2, vpdpbusd
// and vpdpwssd with AVX-512 VNNI) and the read bandwidth from DRAM.
//
//   build/bench/bench_peak [--threads N] [--seconds S] [--mb M] [--json]
//
// Each instruction loop runs independent dependency chains (bench/peak/peak_kernels.h) for
// about S seconds (default 0.3), best of 3, on 1 thread and then on N threads at once (each
// its own loop; the sum). Bandwidth: N threads each summing their part of an M MiB buffer
// (default 1024, far beyond the caches), best of 3. Ops count a multiply and an add as two.
// Timings are wall-clock on a shared VM: noisy; the ratios in the issues come from runs of
// this beside the measured pass, on the same machine, minutes apart.
#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "bench/peak/peak_kernels.h"
#include "model/cpu/cpu_features.h"

namespace {

using Clock = std::chrono::steady_clock;
using specnode::bench_peak::PeakLoop;

double Seconds(Clock::time_point a, Clock::time_point b) {
  return std::chrono::duration<double>(b - a).count();
}

volatile float g_sink = 0.0f;  // keeps every loop's result alive

// Ops per second of `loop` on `threads` threads at once, best of 3 runs of ~`seconds`.
double LoopRate(const PeakLoop& loop, int threads, double seconds) {
  // Calibrate on one thread: iterations for ~seconds.
  int64_t iters = 1 << 16;
  for (;;) {
    const auto t0 = Clock::now();
    g_sink = g_sink + loop.run(iters);
    const double dt = Seconds(t0, Clock::now());
    if (dt > seconds / 4 || iters > (int64_t{1} << 40)) {
      iters = static_cast<int64_t>(iters * seconds / std::max(dt, 1e-6));
      break;
    }
    iters *= 4;
  }
  double best = 0.0;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> pool;
    std::vector<float> out(threads);
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) pool.emplace_back([&, t] { out[t] = loop.run(iters); });
    for (auto& th : pool) th.join();
    const double dt = Seconds(t0, Clock::now());
    for (float v : out) g_sink = g_sink + v;
    best = std::max(best, loop.ops_per_iter * static_cast<double>(iters) * threads / dt);
  }
  return best;
}

// Bytes per second read by `threads` threads summing disjoint parts of `buf`.
double ReadRate(const std::vector<uint64_t>& buf, int threads) {
  double best = 0.0;
  const size_t part = buf.size() / threads;
  for (int rep = 0; rep < 3; ++rep) {
    std::vector<std::thread> pool;
    std::vector<uint64_t> sums(threads);
    const auto t0 = Clock::now();
    for (int t = 0; t < threads; ++t) {
      pool.emplace_back([&, t] {
        const uint64_t* p = buf.data() + t * part;
        uint64_t a = 0, b = 0, c = 0, d = 0;
        for (size_t i = 0; i + 4 <= part; i += 4) {
          a += p[i];
          b += p[i + 1];
          c += p[i + 2];
          d += p[i + 3];
        }
        sums[t] = a + b + c + d;
      });
    }
    for (auto& th : pool) th.join();
    const double dt = Seconds(t0, Clock::now());
    for (uint64_t s : sums) g_sink = g_sink + static_cast<float>(s & 1);
    best = std::max(best, static_cast<double>(part * threads * sizeof(uint64_t)) / dt);
  }
  return best;
}

int Usage() {
  std::fprintf(stderr, "usage: bench_peak [--threads N] [--seconds S] [--mb M] [--json]\n");
  return 2;
}

}  // namespace

int main(int argc, char** argv) {
  int threads = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
  double seconds = 0.3;
  int64_t mb = 1024;
  bool json = false;
  for (int i = 1; i < argc; ++i) {
    const std::string a = argv[i];
    if (a == "--json") {
      json = true;
    } else if ((a == "--threads" || a == "--seconds" || a == "--mb") && i + 1 < argc) {
      char* end = nullptr;
      const double v = std::strtod(argv[++i], &end);
      if (end == argv[i] || *end != '\0' || v <= 0) return Usage();
      if (a == "--threads") threads = static_cast<int>(v);
      if (a == "--seconds") seconds = v;
      if (a == "--mb") mb = static_cast<int64_t>(v);
    } else {
      return Usage();
    }
  }
  const specnode::CpuFeatures& f = specnode::GetCpuFeatures();
  std::vector<const PeakLoop*> loops;
  if (f.avx2) {
    for (const PeakLoop& l : specnode::bench_peak::kAvx2Loops) loops.push_back(&l);
  }
  if (f.avx512) {
    for (const PeakLoop& l : specnode::bench_peak::kAvx512Loops) loops.push_back(&l);
  }
  if (f.avx512 && f.avx512_vnni) {
    for (const PeakLoop& l : specnode::bench_peak::kVnniLoops) loops.push_back(&l);
  }
  if (loops.empty()) {
    std::fprintf(stderr, "bench_peak: this CPU has no AVX2; nothing to measure\n");
    return 1;
  }
  std::string out = "{\"threads\": " + std::to_string(threads) + ", \"loops\": [";
  if (!json)
    std::printf("%-40s %14s %14s\n", "loop", "1 thread",
                std::to_string(threads).append(" threads").c_str());
  for (size_t i = 0; i < loops.size(); ++i) {
    const double one = LoopRate(*loops[i], 1, seconds);
    const double all = LoopRate(*loops[i], threads, seconds);
    if (!json) std::printf("%-40s %9.1f GOPS %9.1f GOPS\n", loops[i]->name, one / 1e9, all / 1e9);
    char buf[256];
    std::snprintf(buf, sizeof(buf), "%s{\"name\": \"%s\", \"gops_1\": %.2f, \"gops_all\": %.2f}",
                  i ? ", " : "", loops[i]->name, one / 1e9, all / 1e9);
    out += buf;
  }
  std::vector<uint64_t> buf(static_cast<size_t>(mb) << 17);  // mb MiB of uint64
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = i;        // touch every page
  const double read1 = ReadRate(buf, 1), read_all = ReadRate(buf, threads);
  if (!json) {
    std::printf("%-40s %9.2f GB/s %9.2f GB/s\n", "read bandwidth", read1 / 1e9, read_all / 1e9);
  }
  char tail[160];
  std::snprintf(tail, sizeof(tail), "], \"read_gbs_1\": %.2f, \"read_gbs_all\": %.2f}", read1 / 1e9,
                read_all / 1e9);
  out += tail;
  if (json) std::printf("%s\n", out.c_str());
  return g_sink == 12345.678f ? 3 : 0;
}
