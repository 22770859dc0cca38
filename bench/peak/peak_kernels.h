// The instruction loops bench_peak times (one file per instruction set, each compiled for
// its own ISA; run only where GetCpuFeatures() says the CPU has it). Each runs `iters`
// iterations of independent dependency chains (enough to cover the instruction's latency
// times its throughput), so the loop is throughput-bound, and returns a value derived from
// the accumulators so the compiler cannot drop the work.
//
// Ops counted per instruction (multiply and add each count one, the convention of the
// issues' numbers: 1160 GOPS int8 for vpdpbusd on one Zen 4 core):
//   f32 FMA ymm: 8 lanes x 2 = 16       zmm: 32
//   int16 vpmaddwd ymm + vpaddd: 16 products, 16 adds = 32 per pair of instructions
//   int8 vpmaddubsw + vpmaddwd(1) + vpaddd ymm: 32 products, 32 adds = 64 per triple
//   vpdpwssd zmm: 32 products + adds = 64       vpdpbusd zmm: 64 products + adds = 128
#pragma once

#include <cstdint>

namespace specnode::bench_peak {

// ops per iteration of each loop (chains x ops per chain step)
struct PeakLoop {
  const char* name;
  double ops_per_iter;
  float (*run)(int64_t iters);
};

// AVX2 + FMA (peak_avx2.cc): f32 FMA, int16 vpmaddwd, int8 vpmaddubsw.
extern const PeakLoop kAvx2Loops[3];
// AVX-512 F/BW (+ VNNI) (peak_avx512.cc): f32 FMA zmm, vpmaddwd zmm, vpdpwssd, vpdpbusd.
extern const PeakLoop kAvx512Loops[2];
extern const PeakLoop kVnniLoops[2];

}  // namespace specnode::bench_peak
