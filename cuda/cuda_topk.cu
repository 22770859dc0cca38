// CudaTopKRows (cuda_topk.h): one block per row.
//   1. Radix select (topk_order.h SelectThreshold, in parallel): 4 passes over the row, each
//      a shared-memory histogram of the next 8 bits of the keys that match the digits chosen
//      so far, and a warp's scan choosing the digit that holds the k-th largest. The first
//      pass also flags a NaN or an infinity.
//   2. One sweep in id order, 1024 entries a chunk: entries above the threshold take slots
//      by an atomic counter; entries equal to it take the next slots in id order (a ballot
//      and the warps' counts rank them in the chunk), until the top k are complete.
//   3. A bitonic sort of the k (padded to a power of two) by topk::Comp, descending.
#include "cuda/cuda_topk.h"

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"
#include "cuda/topk_order.h"

namespace specnode {
namespace {

constexpr int kThreads = 1024;
constexpr int kWarps = kThreads / 32;
static_assert(kCudaTopKMax <= kThreads, "the sort gives each thread at most one entry");

struct Shared {
  int bins[topk::kBins];
  int warp_count[kWarps];
  uint64_t comp[kCudaTopKMax];
  int chosen_digit, chosen_want;
  int above;  // slots taken by entries above the threshold
};

// Warp 0 chooses the digit (topk::ChooseDigit over 8 bins per lane, highest bins in lane 0).
__device__ void ChooseDigitInWarp(Shared& s, int want) {
  const int lane = threadIdx.x;
  constexpr int kPerLane = topk::kBins / 32;
  const int top = topk::kBins - 1 - lane * kPerLane;  // this lane's bins: top, top-1, ...
  int sum = 0;
  for (int j = 0; j < kPerLane; ++j) sum += s.bins[top - j];
  int inclusive = sum;
  for (int offset = 1; offset < 32; offset <<= 1) {
    const int other = __shfl_up_sync(0xffffffffu, inclusive, offset);
    if (lane >= offset) inclusive += other;
  }
  const unsigned reached = __ballot_sync(0xffffffffu, inclusive >= want);
  // `want` <= the number of matching keys, so some lane reaches it.
  const int first = __ffs(reached) - 1;
  if (lane == first) {
    int above = inclusive - sum;
    for (int j = 0; j < kPerLane; ++j) {
      const int d = top - j;
      if (above + s.bins[d] >= want) {
        s.chosen_digit = d;
        s.chosen_want = want - above;
        break;
      }
      above += s.bins[d];
    }
  }
}

// Step 1: the k-th largest key and how many equal ones the top k take; false for a row
// with a NaN or an infinity.
__device__ bool SelectThreshold(const float* row, int cols, int k, Shared& s, uint32_t* threshold,
                                int* take_equal) {
  uint32_t prefix = 0, mask = 0;
  int want = k, bad = 0;
  for (int pass = 0; pass < topk::kPasses; ++pass) {
    const int shift = 32 - topk::kDigitBits * (pass + 1);
    for (int b = threadIdx.x; b < topk::kBins; b += kThreads) s.bins[b] = 0;
    __syncthreads();
    for (int c = threadIdx.x; c < cols; c += kThreads) {
      const float v = row[c];
      if (pass == 0 && !isfinite(v)) bad = 1;
      const uint32_t key = topk::Key(v);
      if ((key & mask) == prefix) atomicAdd(&s.bins[(key >> shift) & (topk::kBins - 1)], 1);
    }
    if (pass == 0 && __syncthreads_or(bad)) return false;
    __syncthreads();
    if (threadIdx.x < 32) ChooseDigitInWarp(s, want);
    __syncthreads();
    want = s.chosen_want;
    prefix |= static_cast<uint32_t>(s.chosen_digit) << shift;
    mask |= static_cast<uint32_t>(topk::kBins - 1) << shift;
  }
  *threshold = prefix;
  *take_equal = want;
  return true;
}

// Step 2: the top k's comps into s.comp[0, k) (in no particular order).
__device__ void Collect(const float* row, int cols, int k, uint32_t threshold, int take_equal,
                        Shared& s) {
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  const int n_above = k - take_equal;
  if (threadIdx.x == 0) s.above = 0;
  __syncthreads();
  int equal_before = 0;  // equal entries in earlier chunks (the same in every thread)
  for (int base = 0; base < cols; base += kThreads) {
    const int c = base + threadIdx.x;
    const uint32_t key = c < cols ? topk::Key(row[c]) : 0u;
    const bool above = c < cols && key > threshold;
    const bool equal = c < cols && key == threshold;
    if (above) s.comp[atomicAdd(&s.above, 1)] = topk::Comp(key, static_cast<uint32_t>(c));
    const unsigned ballot = __ballot_sync(0xffffffffu, equal);
    if (lane == 0) s.warp_count[warp] = __popc(ballot);
    __syncthreads();
    const int above_so_far = s.above;  // no atomic touches it until the next chunk
    int offset = 0, total = 0;
    for (int w = 0; w < kWarps; ++w) {
      offset += w < warp ? s.warp_count[w] : 0;
      total += s.warp_count[w];
    }
    const int rank = equal_before + offset + __popc(ballot & ((1u << lane) - 1u));
    if (equal && rank < take_equal) {
      s.comp[n_above + rank] = topk::Comp(key, static_cast<uint32_t>(c));
    }
    equal_before += total;
    __syncthreads();  // warp_count is rewritten next chunk
    if (equal_before >= take_equal && above_so_far == n_above) break;  // block-uniform
  }
}

// Step 3: s.comp[0, k) sorted descending (padding of 0 sorts last).
__device__ void SortDescending(int k, Shared& s) {
  int size = 1;
  while (size < k) size <<= 1;
  for (int i = k + threadIdx.x; i < size; i += kThreads) s.comp[i] = 0;
  for (int span = 2; span <= size; span <<= 1) {
    for (int stride = span / 2; stride > 0; stride >>= 1) {
      __syncthreads();
      const int i = threadIdx.x;
      const int j = i ^ stride;
      if (i < size && j > i) {
        const uint64_t a = s.comp[i], b = s.comp[j];
        const bool descending_block = (i & span) == 0;
        if ((a < b) == descending_block) {
          s.comp[i] = b;
          s.comp[j] = a;
        }
      }
    }
  }
  __syncthreads();
}

__global__ void __launch_bounds__(kThreads)
    TopKRowsKernel(const float* __restrict__ x, int cols, int k, int32_t* __restrict__ ids,
                   float* __restrict__ values) {
  __shared__ Shared s;
  const float* row = x + static_cast<int64_t>(blockIdx.x) * cols;
  int32_t* row_ids = ids + static_cast<int64_t>(blockIdx.x) * k;
  uint32_t threshold = 0;
  int take_equal = 0;
  if (!SelectThreshold(row, cols, k, s, &threshold, &take_equal)) {
    if (threadIdx.x == 0) row_ids[0] = -1;
    return;
  }
  Collect(row, cols, k, threshold, take_equal, s);
  SortDescending(k, s);
  if (threadIdx.x < k) {
    const uint32_t id = topk::CompId(s.comp[threadIdx.x]);
    row_ids[threadIdx.x] = static_cast<int32_t>(id);
    values[static_cast<int64_t>(blockIdx.x) * k + threadIdx.x] = row[id];
  }
}

}  // namespace

absl::Status CudaTopKRows(const float* x, int64_t n, int64_t cols, int k, int32_t* ids,
                          float* values, cudaStream_t stream) {
  if (n < 0 || n > 0x7fffffff || cols <= 0 || cols > 0x7fffffff) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaTopKRows: bad shape n=", n, " cols=", cols));
  }
  if (k < 1 || k > cols || k > kCudaTopKMax) {
    return absl::InvalidArgumentError(absl::StrCat("CudaTopKRows: k=", k, " outside [1, ",
                                                   cols < kCudaTopKMax ? cols : kCudaTopKMax, "]"));
  }
  if (n == 0) return absl::OkStatus();
  if (x == nullptr || ids == nullptr || values == nullptr) {
    return absl::InvalidArgumentError("CudaTopKRows: null pointer");
  }
  TopKRowsKernel<<<static_cast<unsigned>(n), kThreads, 0, stream>>>(x, static_cast<int>(cols), k,
                                                                    ids, values);
  SPECNODE_CUDA_RETURN_IF_LAUNCH_ERROR("TopKRowsKernel");
  return absl::OkStatus();
}

}  // namespace specnode
