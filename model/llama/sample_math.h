// The arithmetic of a sampled draw (model/llama/sampling.h) that a device must repeat bit for
// bit: the counter-based noise, exp and log in double, and the summation order of a row's
// weights. The host's Sampler and the device's draw kernel (cuda/cuda_sample.cu) both call
// these, so a token drawn on the GPU is the token the CPU draws from the same logits.
//
// Why not std::exp / std::log: the device's exp and log are not glibc's (CUDA documents up to
// 1 ulp of error, glibc's are nearly always correctly rounded), so their last bits differ now
// and then. These are fdlibm's algorithms (Cody-Waite reduction, the published Remez
// coefficients; error below 1 ulp, checked against glibc in tests/model/sample_math_test.cc,
// where about 1 result in 10 differs from glibc's in the last bit: 2^-52 relative, far below
// the 2^-24 of the float probabilities the race compares) spelled with explicitly rounded
// operations: nvcc would otherwise contract a * b + c into an
// fma, which the host (ISO C++20, -ffp-contract=off, no fma) does not.
//
// Summation: a row's weights are summed in kSumLanes interleaved lanes (lane j takes ids j,
// j + kSumLanes, ... in order), then the lanes pairwise in a fixed tree — the order a block
// of kSumLanes threads sums in, and a vectorisable loop on the host.
//
// Pure functions, thread-safe. Free of absl and C++20: nvcc compiles the kernels as C++17.
#pragma once

#include <stdint.h>
#include <string.h>

#if defined(__CUDACC__)
#define SPECNODE_SAMPLE_HD __host__ __device__ __forceinline__
#else
#define SPECNODE_SAMPLE_HD inline
#endif

namespace specnode {
namespace sample {

// Correctly rounded +, -, *, / with no contraction into an fma on either side.
SPECNODE_SAMPLE_HD double Add(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dadd_rn(a, b);
#else
  return a + b;
#endif
}
SPECNODE_SAMPLE_HD double Sub(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dsub_rn(a, b);
#else
  return a - b;
#endif
}
SPECNODE_SAMPLE_HD double Mul(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __dmul_rn(a, b);
#else
  return a * b;
#endif
}
SPECNODE_SAMPLE_HD double Div(double a, double b) {
#if defined(__CUDA_ARCH__)
  return __ddiv_rn(a, b);
#else
  return a / b;
#endif
}

SPECNODE_SAMPLE_HD uint64_t Bits(double d) {
  uint64_t u;
  memcpy(&u, &d, sizeof(u));
  return u;
}
SPECNODE_SAMPLE_HD double FromBits(uint64_t u) {
  double d;
  memcpy(&d, &u, sizeof(d));
  return d;
}

// 2^k for -1022 <= k <= 1023, exactly.
SPECNODE_SAMPLE_HD double Pow2(int k) { return FromBits(static_cast<uint64_t>(k + 1023) << 52); }

// Round to the nearest integer, ties to even, for |x| < 2^51 (the 1.5 * 2^52 shifter).
SPECNODE_SAMPLE_HD double RoundNearest(double x) {
  const double shifter = 6755399441055744.0;  // 1.5 * 2^52
  return Sub(Add(x, shifter), shifter);
}

// ln 2 split so that k * kLn2Hi is exact for |k| < 2^11.
constexpr double kLn2Hi = 6.93147180369123816490e-01;
constexpr double kLn2Lo = 1.90821492927058770002e-10;
constexpr double kInvLn2 = 1.44269504088896338700e+00;

// e^x, error below 1 ulp; 0 below ln(2^-1075), +inf above ln(DBL_MAX); NaN stays NaN.
SPECNODE_SAMPLE_HD double Exp(double x) {
  if (x != x) return x;
  if (x > 709.782712893383973096) return FromBits(0x7ff0000000000000ull);
  if (x < -745.13321910194110842) return 0.0;
  // x = k ln2 + r, |r| <= ln2 / 2.
  const double kd = RoundNearest(Mul(x, kInvLn2));
  const int k = static_cast<int>(kd);
  const double hi = Sub(x, Mul(kd, kLn2Hi));
  const double lo = Mul(kd, kLn2Lo);
  const double r = Sub(hi, lo);
  // e^r = 1 + r + r c / (2 - c), c = r - r^2 (P1 + r^2 (P2 + ...)) (a Remez fit of
  // r (e^r + 1) / (e^r - 1) on [-ln2/2, ln2/2]).
  const double t = Mul(r, r);
  double poly = 4.13813679705723846039e-08;
  poly = Add(-1.65339022054652515390e-06, Mul(t, poly));
  poly = Add(6.61375632143793436117e-05, Mul(t, poly));
  poly = Add(-2.77777777770155933842e-03, Mul(t, poly));
  poly = Add(1.66666666666666019037e-01, Mul(t, poly));
  const double c = Sub(r, Mul(t, poly));
  const double y = Sub(1.0, Sub(Sub(lo, Div(Mul(r, c), Sub(2.0, c))), hi));
  // y * 2^k; below 2^-1022 in two steps (the second rounds into the subnormals).
  if (k >= -1021) return k <= 1023 ? Mul(y, Pow2(k)) : Mul(Mul(y, 2.0), Pow2(k - 1));
  return Mul(Mul(y, Pow2(k + 1000)), Pow2(-1000));
}

// ln(x) for a positive normal x, error below 1 ulp (fdlibm's e_log: x = 2^k (1 + f) with
// sqrt(2)/2 <= 1 + f < sqrt(2), ln(1 + f) = 2s + s R(s^2) with s = f / (2 + f)). The draws
// call it on uniforms in (0, 1); x <= 0, subnormal, infinite or NaN is a caller's bug.
SPECNODE_SAMPLE_HD double Log(double x) {
  const uint64_t bits = Bits(x);
  int k = static_cast<int>(bits >> 52) - 1023;
  uint64_t mant = bits & 0x000fffffffffffffull;
  // Move the mantissa into [sqrt(2)/2, sqrt(2)): above sqrt(2) (0x6a09e... of the
  // mantissa) halve it and count one more power of two.
  if (mant >= 0x6a09e667f3bcdull) {
    mant |= 0x3fe0000000000000ull;  // [0.5, 1)
    k += 1;
  } else {
    mant |= 0x3ff0000000000000ull;  // [1, 2)
  }
  const double f = Sub(FromBits(mant), 1.0);
  const double dk = static_cast<double>(k);
  const double s = Div(f, Add(2.0, f));
  const double z = Mul(s, s);
  const double w = Mul(z, z);
  double t1 = 1.531383769920937332e-01;
  t1 = Add(2.222219843214978396e-01, Mul(w, t1));
  t1 = Add(3.999999999940941908e-01, Mul(w, t1));
  t1 = Mul(w, t1);
  double t2 = 1.479819860511658591e-01;
  t2 = Add(1.818357216161805012e-01, Mul(w, t2));
  t2 = Add(2.857142874366239149e-01, Mul(w, t2));
  t2 = Add(6.666666666666735130e-01, Mul(w, t2));
  t2 = Mul(z, t2);
  const double r = Add(t2, t1);
  const double hfsq = Mul(Mul(0.5, f), f);
  return Sub(Mul(dk, kLn2Hi), Sub(Sub(hfsq, Add(Mul(s, Add(hfsq, r)), Mul(dk, kLn2Lo))), f));
}

// splitmix64's output function: a bijective 64-bit mix with full avalanche.
constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ull;
SPECNODE_SAMPLE_HD uint64_t Mix(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The uniform of token `index` under a position's noise key (PositionNoise): the centre of
// one of 2^53 equal cells, never 0 or 1, so ln(u) is finite and 1 - u > 0.
SPECNODE_SAMPLE_HD double NoiseUniform(uint64_t key, uint64_t index) {
  return (static_cast<double>(Mix(key + (index + 1) * kGolden) >> 11) + 0.5) * 0x1.0p-53;
}

// A logit's unnormalised weight exp((logit - max) / T), inv_t = 1 / T as a float.
SPECNODE_SAMPLE_HD double LogitWeight(float logit, float max_logit, float inv_t) {
  return Exp(Mul(static_cast<double>(logit - max_logit), static_cast<double>(inv_t)));
}

// The race's entry for probability p > 0 and uniform u: E = -ln(u) / p, the smaller the
// better. Skip(...) is true when the entry cannot beat `best` (-ln(u) >= 1 - u, with a
// 1e-9 margin for Log's rounding): most of a vocabulary is skipped without a logarithm.
SPECNODE_SAMPLE_HD bool RaceSkip(double u, double p, double best) {
  return Sub(1.0, u) >= Mul(Mul(best, p), 1.0 + 1e-9);
}
SPECNODE_SAMPLE_HD double RaceEntry(double u, double p) { return Div(-Log(u), p); }

// What a device needs to draw one row exactly as Sampler::Sample draws it when top-k prunes
// nothing: the noise key of the row's position (PositionNoise::key), 1 / temperature as a
// float (inv_t == 0 draws greedily: the row's arg max) and top-p (1 = off).
struct DrawParams {
  uint64_t key = 0;
  float inv_t = 0.0f;
  float top_p = 1.0f;
};

// Top-p's cut over weights [n] (unnormalised, in descending logit order, ties lower id
// first) whose whole row sums to `sum`: the shortest prefix whose weights, added one by one
// in order, reach top_p * sum. Returns its length in [1, n] with *kept_sum = that prefix's
// sum (the same sequential additions), or 0 when the n weights do not reach it, with
// *kept_sum = all n's sum — the caller either has the whole row (and keeps it all) or
// continues past n. One thread's loop, the same on host and device.
SPECNODE_SAMPLE_HD int NucleusCut(const double* weights, int n, float top_p, double sum,
                                  double* kept_sum) {
  const double threshold = Mul(static_cast<double>(top_p), sum);
  double cumulative = 0.0;
  for (int i = 0; i < n; ++i) {
    cumulative = Add(cumulative, weights[i]);
    if (cumulative >= threshold) {
      *kept_sum = cumulative;
      return i + 1;
    }
  }
  *kept_sum = cumulative;
  return 0;
}

// How many of a row's largest logits a device sorts to find top-p's cut (the top-k head's
// limit, cuda/cuda_topk.h kCudaTopKMax); a nucleus wider than this is drawn on the host.
constexpr int kNucleusHead = 1024;

// The lanes of a row's weight sum (see the file comment).
constexpr int kSumLanes = 1024;

// Folds lanes [kSumLanes] pairwise in place (stride 512, 256, ..., 1); returns the sum. A
// block of kSumLanes threads does the same steps in shared memory.
inline double FoldLanes(double* lanes) {
  for (int stride = kSumLanes / 2; stride > 0; stride /= 2) {
    for (int j = 0; j < stride; ++j) lanes[j] = Add(lanes[j], lanes[j + stride]);
  }
  return lanes[0];
}

}  // namespace sample
}  // namespace specnode
