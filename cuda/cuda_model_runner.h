// CudaModelRunner: a ModelRunner (coordinator/model_runner.h) whose forward pass and KV cache
// live on one GPU (CudaLlamaForward). The speculative engine and the scheduler drive it like
// a CPU runner: batched passes, rollback by Truncate, KV-aware admission through Room.
// No host swap tier yet (SwapOut/SwapIn stay Unimplemented: preemption recomputes).
//
// Not thread-safe (one engine drives it). The weights need only outlive Create: they are
// copied to the device.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/model_runner.h"
#include "cuda/cuda_llama_forward.h"

namespace specnode {

class CudaModelRunner final : public ModelRunner {
 public:
  static absl::StatusOr<std::unique_ptr<CudaModelRunner>> Create(
      const LlamaConfig& config, const LlamaWeights& weights, const CudaForwardOptions& options);

  int32_t vocab_size() const override { return forward_->config().vocab_size; }
  int32_t max_positions() const override { return forward_->config().context_length; }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override {
    return forward_->Forward(batch, logits);
  }
  int32_t Length(SeqId seq) const override { return forward_->cache().Length(seq); }
  absl::Status Reserve(SeqId seq, int32_t count) override {
    return forward_->cache().Reserve(seq, count);
  }
  absl::Status Truncate(SeqId seq, int32_t n) override { return forward_->cache().Truncate(seq, n); }
  void Free(SeqId seq) override { forward_->cache().Free(seq); }
  // Whole pages: `tokens` more tokens need at most ceil(tokens / page) + 1 pages.
  std::optional<KvRoom> Room(int64_t tokens) const override;
  // Every page counts as f16 (the GPU cache keeps one precision).
  std::optional<KvMemory> Memory() const override;

  CudaLlamaForward& forward() { return *forward_; }

 private:
  explicit CudaModelRunner(std::unique_ptr<CudaLlamaForward> forward)
      : forward_(std::move(forward)) {}
  std::unique_ptr<CudaLlamaForward> forward_;
};

}  // namespace specnode
