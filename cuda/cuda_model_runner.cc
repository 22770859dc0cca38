#include "cuda/cuda_model_runner.h"

#include "model/status_macros.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<CudaModelRunner>> CudaModelRunner::Create(
    const LlamaConfig& config, const LlamaWeights& weights, const CudaForwardOptions& options) {
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<CudaLlamaForward> forward,
                            CudaLlamaForward::Create(config, weights, options));
  return std::unique_ptr<CudaModelRunner>(new CudaModelRunner(std::move(forward)));
}

std::optional<ModelRunner::KvRoom> CudaModelRunner::Room(int64_t tokens) const {
  const CudaKvCache& c = forward_->cache();
  const int64_t page_tokens = c.options().page_tokens;
  const int64_t pages = (tokens + page_tokens - 1) / page_tokens + 1;
  return KvRoom{pages * c.page_bytes(), static_cast<int64_t>(c.free_pages()) * c.page_bytes()};
}

std::optional<ModelRunner::KvMemory> CudaModelRunner::Memory() const {
  const CudaKvCache& c = forward_->cache();
  KvMemory m;
  m.capacity_bytes = static_cast<int64_t>(c.total_pages()) * c.page_bytes();
  m.used_bytes = static_cast<int64_t>(c.total_pages() - c.free_pages()) * c.page_bytes();
  m.class_bytes[static_cast<int>(KvPrecision::kFull)] = m.used_bytes;
  return m;
}

}  // namespace specnode
