#include "coordinator/model_runner.h"

namespace specnode {

LocalModelRunner::LocalModelRunner(const LlamaConfig& config, const LlamaWeights& weights,
                                   ThreadPool* pool, std::unique_ptr<KvCache> cache)
    : forward_(config, weights, pool), cache_(std::move(cache)) {}

absl::Status LocalModelRunner::Forward(std::span<const BatchEntry> batch,
                                       std::vector<float>* logits) {
  return forward_.Forward(batch, cache_.get(), logits);
}

}  // namespace specnode
