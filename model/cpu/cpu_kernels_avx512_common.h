// Shared by the AVX-512 kernel files only (cpu_kernels_avx512*.cc, compiled with the
// AVX-512 flags): include it from nowhere else, or an inline function here could be
// emitted with AVX-512 instructions into code that runs on any CPU.
#pragma once

// GCC 12's AVX-512 headers build their "undefined" vectors as self-initialised locals, which
// -Wuninitialized reports at every inlined use; the diagnostics are spurious.
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>
#pragma GCC diagnostic pop

namespace specnode::cpu_kernels::avx512 {

// A mask of the first k of 16 lanes (k >= 16: all).
inline __mmask16 FirstLanes(int k) {
  return static_cast<__mmask16>(k >= 16 ? 0xFFFFu : (1u << k) - 1u);
}

}  // namespace specnode::cpu_kernels::avx512
