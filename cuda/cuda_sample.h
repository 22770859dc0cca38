// The draw head on the device: each row's token drawn exactly as the host's Sampler::Sample
// draws it for a sampler without top-k (greedy, or temperature with or without top-p: the
// OpenAI API's sampling), so such a step moves one id per row instead of the row
// (CudaBackend::FinishDraws). The arithmetic is model/llama/sample_math.h's, shared with the
// host. Thread-safety: stream-ordered like every kernel launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/llama/sample_math.h"

namespace specnode {

// A top-p draw's head (device memory): every row's k = min(sample::kNucleusHead, cols)
// largest logits in TopK's order, ids and values [n, k] (CudaTopKRows' output). All null
// when no row has top-p.
struct CudaDrawHead {
  const int32_t* ids = nullptr;
  const float* values = nullptr;
  int k = 0;
};

// x: [n, cols] device logits; draws: [n] device DrawParams; ids: [n] device. ids[r] is
// DrawRows' (model/llama/sampling.h) token for row r: the arg max (lowest id on ties) when
// draws[r].inv_t == 0, else the exponential race with draws[r].key's noise over the row's
// softmax at 1 / inv_t, cut to top_p's nucleus when draws[r].top_p < 1; -1 when the row
// holds a NaN or an infinity; -2 for a top-p row whose nucleus is wider than the head (or
// with no head given): the caller draws it on the host. One block of sample::kSumLanes
// threads per row: three sweeps (max, the lanes' weight sums folded in shared memory, the
// race with a per-thread best) and a block arg min of (entry, id); a top-p row races its
// head's kept entries, one a thread, after one thread's cut. InvalidArgument for a bad
// shape, a null pointer or a head of the wrong k.
absl::Status CudaDrawRows(const float* x, int64_t n, int64_t cols, const sample::DrawParams* draws,
                          const CudaDrawHead& head, int32_t* ids, cudaStream_t stream = nullptr);

}  // namespace specnode
