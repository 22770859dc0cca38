// What the CPU we run on can execute, read once with cpuid/xgetbv (OS support for the
// AVX/AVX-512 register state is checked, not just the feature bits). Kernels are picked
// from this at run time; a build never assumes an ISA beyond x86-64 baseline.
#pragma once

#include <string>

namespace specnode {

struct CpuFeatures {
  bool avx2 = false;      // AVX2 + FMA + F16C
  bool avx512 = false;    // AVX-512 F/BW/VL/DQ
  bool avx512_vnni = false;
  bool avx_vnni = false;  // VEX-encoded VNNI (256-bit)
  bool avx512_bf16 = false;
};

// Detected once, cached. SPECNODE_CPU=scalar|avx2|avx512 in the environment caps the level
// used (for testing every path on one machine).
const CpuFeatures& GetCpuFeatures();
// "avx512-vnni", "avx2", "scalar": the kernel family selected.
std::string CpuKernelName();

}  // namespace specnode
