// The CPU reference forward pass: the one graph (llama_forward.h) over a CpuBackend of its
// own. Lives beside CpuBackend (library specnode::llama_cpu) so the graph's library does not
// link the CPU kernels: cuda/ and every other device use LlamaForward over their own backend.
//
// Not thread-safe, as LlamaForward. The host weights (borrowed), a given pool and reducer
// must outlive it.
#pragma once

#include <memory>

#include "model/cpu/thread_pool.h"
#include "model/llama/cpu_backend.h"
#include "model/llama/llama_config.h"
#include "model/llama/llama_forward.h"
#include "model/llama/llama_weights.h"

namespace specnode {

namespace cpu_forward_internal {
// Constructed before the LlamaForward base, which is handed a pointer to it.
struct OwnedCpuBackend {
  std::unique_ptr<CpuBackend> owned_backend;
};
}  // namespace cpu_forward_internal

class CpuLlamaForward : private cpu_forward_internal::OwnedCpuBackend, public LlamaForward {
 public:
  // Over host `weights` (borrowed; converted or packed for the kernels where they need it,
  // CpuBackend::ForKernels), rounding activations as weights.activations says, on `pool`
  // (may be null: the calling thread only). `reducer`: a tensor-parallel shard's all-reduce.
  CpuLlamaForward(const LlamaConfig& config, const LlamaWeights& weights, ThreadPool* pool,
                  PartialSumReducer* reducer = nullptr);
  ~CpuLlamaForward() override;
};

}  // namespace specnode
