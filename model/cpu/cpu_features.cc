#include "model/cpu/cpu_features.h"

#include <cstdint>
#include <cstdlib>
#include <string_view>

#if defined(__x86_64__) || defined(__i386__)
#include <cpuid.h>
#define SPECNODE_X86 1
#endif

namespace specnode {
namespace {

#if defined(SPECNODE_X86)
struct Regs {
  uint32_t eax = 0, ebx = 0, ecx = 0, edx = 0;
};

Regs Cpuid(uint32_t leaf, uint32_t subleaf) {
  Regs r;
  __cpuid_count(leaf, subleaf, r.eax, r.ebx, r.ecx, r.edx);
  return r;
}

// xgetbv by inline asm so this file needs no -mxsave. Only called when OSXSAVE is set.
uint64_t Xgetbv(uint32_t index) {
  uint32_t lo, hi;
  __asm__ volatile("xgetbv" : "=a"(lo), "=d"(hi) : "c"(index));
  return (static_cast<uint64_t>(hi) << 32) | lo;
}

bool Bit(uint32_t reg, int bit) { return (reg >> bit) & 1u; }

CpuFeatures Detect() {
  CpuFeatures f;
  const uint32_t max_leaf = Cpuid(0, 0).eax;
  if (max_leaf < 1) return f;
  const Regs l1 = Cpuid(1, 0);
  // The OS must save the wider register state on context switch, or using it corrupts
  // other threads: XCR0 bits 1|2 (XMM, YMM) for AVX, 5|6|7 (opmask, ZMM0-15 high, ZMM16-31)
  // for AVX-512.
  if (!Bit(l1.ecx, 27)) return f;  // OSXSAVE
  const uint64_t xcr0 = Xgetbv(0);
  const bool os_ymm = (xcr0 & 0x6) == 0x6;
  const bool os_zmm = os_ymm && (xcr0 & 0xE0) == 0xE0;
  const bool avx = Bit(l1.ecx, 28), fma = Bit(l1.ecx, 12), f16c = Bit(l1.ecx, 29);
  if (max_leaf < 7 || !os_ymm || !avx) return f;
  const Regs l7 = Cpuid(7, 0);
  const Regs l7s1 = l7.eax >= 1 ? Cpuid(7, 1) : Regs{};
  f.avx2 = Bit(l7.ebx, 5) && fma && f16c;
  f.avx_vnni = f.avx2 && Bit(l7s1.eax, 4);
  const bool avx512f = Bit(l7.ebx, 16), avx512dq = Bit(l7.ebx, 17);
  const bool avx512bw = Bit(l7.ebx, 30), avx512vl = Bit(l7.ebx, 31);
  f.avx512 = f.avx2 && os_zmm && avx512f && avx512dq && avx512bw && avx512vl;
  f.avx512_vnni = f.avx512 && Bit(l7.ecx, 11);
  f.avx512_bf16 = f.avx512 && Bit(l7s1.eax, 5);
  return f;
}
#else
CpuFeatures Detect() { return CpuFeatures{}; }
#endif

// SPECNODE_CPU caps the level (never raises it): "scalar" clears everything, "avx2" clears
// AVX-512, "avx512-novnni" keeps AVX-512 but hides VNNI (to test that path); "avx512",
// "avx512-vnni", unset or unknown keep what was detected.
CpuFeatures ApplyOverride(CpuFeatures f) {
  const char* env = std::getenv("SPECNODE_CPU");
  if (env == nullptr) return f;
  const std::string_view level(env);
  if (level == "scalar") return CpuFeatures{};
  if (level == "avx2") {
    f.avx512 = f.avx512_vnni = f.avx512_bf16 = false;
  } else if (level == "avx512-novnni") {
    f.avx512_vnni = false;  // the non-VNNI AVX-512 path
  }
  return f;
}

}  // namespace

const CpuFeatures& GetCpuFeatures() {
  static const CpuFeatures features = ApplyOverride(Detect());
  return features;
}

std::string CpuKernelName() {
  const CpuFeatures& f = GetCpuFeatures();
  if (f.avx512_vnni) return "avx512-vnni";
  if (f.avx512) return "avx512";
  if (f.avx2) return "avx2";
  return "scalar";
}

}  // namespace specnode
