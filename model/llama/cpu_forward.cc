#include "model/llama/cpu_forward.h"

#include <utility>

namespace specnode {

CpuLlamaForward::CpuLlamaForward(const LlamaConfig& config, const LlamaWeights& weights,
                                 ThreadPool* pool, PartialSumReducer* reducer)
    : cpu_forward_internal::OwnedCpuBackend{std::make_unique<CpuBackend>(pool, weights.activations)},
      LlamaForward(config,
                   CpuBackend::ForKernels(
                       std::shared_ptr<const LlamaWeights>(&weights, [](const LlamaWeights*) {}),
                       weights.activations),
                   owned_backend.get(), reducer) {}

CpuLlamaForward::~CpuLlamaForward() = default;

}  // namespace specnode
