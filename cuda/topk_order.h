// The order of a top-k head (model/llama/sampling.h TopK: descending logit, ties to the lower
// id, +0 == -0) as unsigned integers a GPU can radix-select and sort: compiles for the host
// and the device, checked against TopK's comparison on the host (tests/topk_order_test.cc,
// no GPU needed). Pure functions, thread-safe. Kept free of absl and C++20 (nvcc compiles
// the kernels as C++17).
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SPECNODE_TOPK_HD __host__ __device__ __forceinline__
#else
#define SPECNODE_TOPK_HD inline
#endif

namespace specnode {
namespace topk {

// A finite float's key: a < b as floats iff Key(a) < Key(b) as unsigned; -0 and +0 share
// +0's key. (NaN and infinities are never keyed: the head flags such rows.)
SPECNODE_TOPK_HD uint32_t Key(float v) {
  if (v == 0.0f) v = 0.0f;  // -0 -> +0
  uint32_t bits;
  memcpy(&bits, &v, sizeof(bits));
  return (bits & 0x80000000u) != 0 ? ~bits : (bits | 0x80000000u);
}

// (key, id) as one 64-bit value whose descending order is TopK's order: the larger key
// first, then the lower id. 0 is below every real entry (padding of a sort).
SPECNODE_TOPK_HD uint64_t Comp(uint32_t key, uint32_t id) {
  return (static_cast<uint64_t>(key) << 32) | (0xffffffffu - id);
}
SPECNODE_TOPK_HD uint32_t CompId(uint64_t comp) {
  return 0xffffffffu - static_cast<uint32_t>(comp & 0xffffffffu);
}

// The radix select's digits: 4 passes of 8 bits, most significant first.
constexpr int kDigitBits = 8;
constexpr int kBins = 1 << kDigitBits;
constexpr int kPasses = 32 / kDigitBits;

// One pass's choice from its histogram (bins [kBins] of the keys that match the digits
// chosen so far): the digit holding the `want`-th largest of them (1-based), and `want`
// within that digit's bin. The device runs the same scan over a warp.
SPECNODE_TOPK_HD void ChooseDigit(const int* bins, int want, int* digit, int* want_in_bin) {
  int above = 0;
  for (int d = kBins - 1; d >= 0; --d) {
    if (above + bins[d] >= want) {
      *digit = d;
      *want_in_bin = want - above;
      return;
    }
    above += bins[d];
  }
  *digit = 0;
  *want_in_bin = want - above;
}

// The whole select on the host, as the kernel runs it (cuda/cuda_topk.cu): the k-th largest
// key `threshold` of keys [n] (0 < k <= n) and how many entries equal to it the top k take
// (`take_equal`; they are the lowest ids among the equal ones). The host test checks it
// against a sort.
inline void SelectThreshold(const uint32_t* keys, int n, int k, uint32_t* threshold,
                            int* take_equal) {
  uint32_t prefix = 0, mask = 0;
  int want = k;
  for (int pass = 0; pass < kPasses; ++pass) {
    const int shift = 32 - kDigitBits * (pass + 1);
    int bins[kBins] = {};
    for (int i = 0; i < n; ++i) {
      if ((keys[i] & mask) == prefix) ++bins[(keys[i] >> shift) & (kBins - 1)];
    }
    int digit = 0;
    ChooseDigit(bins, want, &digit, &want);
    prefix |= static_cast<uint32_t>(digit) << shift;
    mask |= static_cast<uint32_t>(kBins - 1) << shift;
  }
  *threshold = prefix;
  *take_equal = want;
}

}  // namespace topk
}  // namespace specnode
