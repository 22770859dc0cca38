// CudaDrawRows (cuda_sample.h): one block of sample::kSumLanes threads per row.
//   1. The row's largest logit and whether every logit is finite (warp shuffles, then the
//      warps' results in shared memory). Greedy rows stop here with the lowest id holding it.
//   2. Thread t sums the weights of ids t, t + kSumLanes, ... in id order into lane t; the
//      lanes fold pairwise in shared memory (stride 512 .. 1) — sample::FoldLanes' order.
//   3. Thread t races its ids with its own best; the block keeps the smallest (entry, id).
//      A thread's skips differ from the host's sequential race, but a skip never drops an
//      entry that could win (sample::RaceSkip), so the winner is the host's
//      (tests/model/sampling_test.cc TheDrawKernelsOrderFindsTheSequentialToken).
//   3'. Top-p rows instead: thread j weighs the row's j-th largest logit (the head the top-k
//      kernel sorted), thread 0 runs top-p's cut over the head's weights in order
//      (sample::NucleusCut, the host's loop), and the kept threads race one entry each; a
//      nucleus wider than the head gives -2, drawn on the host
//      (sampling_test.cc TheNucleusKernelsOrderFindsTheSequentialToken).
#include "cuda/cuda_sample.h"

#include <math_constants.h>

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"

namespace specnode {
namespace {

constexpr int kThreads = sample::kSumLanes;
constexpr int kWarps = kThreads / 32;
static_assert(kThreads % 32 == 0 && kThreads <= 1024, "a block of whole warps");
static_assert(sample::kNucleusHead <= kThreads, "one thread per entry of a top-p head");

struct Shared {
  double lanes[kThreads];
  float warp_max[kWarps];
  double warp_best[kWarps];
  int warp_id[kWarps];
  float max_logit;
  int first_id;
  int keep;         // top-p's kept entries of the head (0: wider than the head)
  double kept_sum;  // their weights' sum
};

// (entry, id) a is better than b: the smaller entry, then the lower id; id -1 is no entry.
__device__ __forceinline__ bool Better(double ea, int ia, double eb, int ib) {
  if (ia < 0) return false;
  if (ib < 0) return true;
  return ea < eb || (ea == eb && ia < ib);
}

// Step 1: the row's max into s.max_logit; false (for every thread) when a logit is not finite.
__device__ bool RowMax(const float* row, int cols, Shared& s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  float m = -CUDART_INF_F;
  bool finite = true;
  for (int i = tid; i < cols; i += kThreads) {
    const float v = row[i];
    finite = finite && isfinite(v);
    m = fmaxf(m, v);
  }
  for (int offset = 16; offset > 0; offset >>= 1) {
    m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, offset));
  }
  if (lane == 0) s.warp_max[warp] = m;
  if (!__syncthreads_and(finite)) return false;
  if (tid == 0) {
    float all = s.warp_max[0];
    for (int w = 1; w < kWarps; ++w) all = fmaxf(all, s.warp_max[w]);
    s.max_logit = all;
    s.first_id = cols;
  }
  __syncthreads();
  return true;
}

// The block's best (entry, id) from each thread's; the result in every thread's return.
__device__ int BlockBest(double e, int id, Shared& s) {
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  for (int offset = 16; offset > 0; offset >>= 1) {
    const double oe = __shfl_xor_sync(0xffffffffu, e, offset);
    const int oi = __shfl_xor_sync(0xffffffffu, id, offset);
    if (Better(oe, oi, e, id)) {
      e = oe;
      id = oi;
    }
  }
  if (lane == 0) {
    s.warp_best[warp] = e;
    s.warp_id[warp] = id;
  }
  __syncthreads();
  if (tid == 0) {
    for (int w = 1; w < kWarps; ++w) {
      if (Better(s.warp_best[w], s.warp_id[w], s.warp_best[0], s.warp_id[0])) {
        s.warp_best[0] = s.warp_best[w];
        s.warp_id[0] = s.warp_id[w];
      }
    }
  }
  __syncthreads();
  return s.warp_id[0];
}

// Step 3' for a top-p row: the winner among the head's kept entries (ids, values [k]: the
// row's k largest in TopK's order), -1 when none has a positive probability, or -2 when
// the cut is not within the head and the head is not the whole row (`whole`).
__device__ int NucleusDraw(const int32_t* head_ids, const float* head_values, int k, bool whole,
                           float max_logit, sample::DrawParams d, double sum, Shared& s) {
  const int tid = threadIdx.x;
  __syncthreads();  // every thread has read the sum out of s.lanes[0]
  double w = 0.0;
  if (tid < k) {
    w = sample::LogitWeight(head_values[tid], max_logit, d.inv_t);
    s.lanes[tid] = w;
  }
  __syncthreads();
  if (tid == 0) {
    double kept_sum = 0.0;
    int keep = sample::NucleusCut(s.lanes, k, d.top_p, sum, &kept_sum);
    if (keep == 0 && whole) keep = k;  // rounding kept the cut from closing: the whole row
    s.keep = keep;
    s.kept_sum = kept_sum;
  }
  __syncthreads();
  if (s.keep == 0) return -2;
  double e = CUDART_INF;
  int id = -1;
  if (tid < s.keep) {
    // The host's float probability, widened back (sampling.cc RaceKeptWith).
    const double p = static_cast<float>(sample::Div(w, s.kept_sum));
    if (p > 0.0) {
      id = head_ids[tid];
      e = sample::RaceEntry(sample::NoiseUniform(d.key, static_cast<uint64_t>(id)), p);
    }
  }
  return BlockBest(e, id, s);
}

__global__ void __launch_bounds__(kThreads)
    DrawRowsKernel(const float* x, int cols, const sample::DrawParams* draws,
                   const int32_t* head_ids, const float* head_values, int head_k, int32_t* ids) {
  __shared__ Shared s;
  const int tid = threadIdx.x;
  const float* row = x + static_cast<size_t>(blockIdx.x) * cols;
  const sample::DrawParams d = draws[blockIdx.x];
  if (!RowMax(row, cols, s)) {
    if (tid == 0) ids[blockIdx.x] = -1;
    return;
  }
  const float max_logit = s.max_logit;
  if (d.inv_t == 0.0f) {  // greedy: the lowest id holding the max
    for (int i = tid; i < cols; i += kThreads) {
      if (row[i] == max_logit) {
        atomicMin(&s.first_id, i);
        break;
      }
    }
    __syncthreads();
    if (tid == 0) ids[blockIdx.x] = s.first_id;
    return;
  }
  double lane_sum = 0.0;
  for (int i = tid; i < cols; i += kThreads) {
    lane_sum = sample::Add(lane_sum, sample::LogitWeight(row[i], max_logit, d.inv_t));
  }
  s.lanes[tid] = lane_sum;
  __syncthreads();
  for (int stride = kThreads / 2; stride > 0; stride >>= 1) {
    if (tid < stride) s.lanes[tid] = sample::Add(s.lanes[tid], s.lanes[tid + stride]);
    __syncthreads();
  }
  const double sum = s.lanes[0];
  if (d.top_p < 1.0f) {
    int won = -2;  // no head given: the host draws the row
    if (head_ids != nullptr) {
      const size_t at = static_cast<size_t>(blockIdx.x) * head_k;
      won = NucleusDraw(head_ids + at, head_values + at, head_k, head_k == cols, max_logit, d, sum,
                        s);
    }
    if (tid == 0) ids[blockIdx.x] = won == -1 ? 0 : won;
    return;
  }
  double best = CUDART_INF;
  int winner = -1;
  for (int i = tid; i < cols; i += kThreads) {
    // The host's float probability, widened back (sampling.cc DenseProbabilities, RaceDraw).
    const double p =
        static_cast<float>(sample::Div(sample::LogitWeight(row[i], max_logit, d.inv_t), sum));
    if (!(p > 0.0)) continue;
    const double u = sample::NoiseUniform(d.key, static_cast<uint64_t>(i));
    if (sample::RaceSkip(u, p, best)) continue;
    const double e = sample::RaceEntry(u, p);
    if (e < best) {
      best = e;
      winner = i;
    }
  }
  const int won = BlockBest(best, winner, s);
  if (tid == 0) ids[blockIdx.x] = won >= 0 ? won : 0;
}

}  // namespace

absl::Status CudaDrawRows(const float* x, int64_t n, int64_t cols, const sample::DrawParams* draws,
                          const CudaDrawHead& head, int32_t* ids, cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff || cols <= 0 || cols > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaDrawRows: bad shape n=", n, " cols=", cols));
  }
  if (head.ids != nullptr &&
      (head.values == nullptr || head.k != std::min<int64_t>(sample::kNucleusHead, cols))) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaDrawRows: a top-p head of ", head.k, " entries over rows of ", cols));
  }
  if (n == 0) return absl::OkStatus();
  if (x == nullptr || draws == nullptr || ids == nullptr) {
    return absl::InvalidArgumentError("CudaDrawRows: null pointer");
  }
  DrawRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(
      x, static_cast<int>(cols), draws, head.ids, head.values, head.k, ids);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("DrawRowsKernel");
  return absl::OkStatus();
}

}  // namespace specnode
