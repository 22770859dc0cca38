// The draw head on the device: each row's token drawn exactly as the host's Sampler::Sample
// draws it for a sampler that prunes nothing (greedy, or temperature with no top-k and top-p
// 1: the OpenAI API's default), so such a step moves one id per row instead of the row
// (CudaBackend::FinishDraws). The arithmetic is model/llama/sample_math.h's, shared with the
// host. Thread-safety: stream-ordered like every kernel launch.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "absl/status/status.h"
#include "model/llama/sample_math.h"

namespace specnode {

// x: [n, cols] device logits; draws: [n] device DrawParams; ids: [n] device. ids[r] is
// DrawRows' (model/llama/sampling.h) token for row r: the arg max (lowest id on ties) when
// draws[r].inv_t == 0, else the exponential race with draws[r].key's noise over the row's
// softmax at 1 / inv_t; -1 when the row holds a NaN or an infinity. One block of
// sample::kSumLanes threads per row: three sweeps (max, the lanes' weight sums folded in
// shared memory, the race with a per-thread best) and a block arg min of (entry, id).
// InvalidArgument for a bad shape or a null pointer.
absl::Status CudaDrawRows(const float* x, int64_t n, int64_t cols, const sample::DrawParams* draws,
                          int32_t* ids, cudaStream_t stream = nullptr);

}  // namespace specnode
