#include "coordinator/model_runner.h"

#include <cassert>

#include "kvstore/kv_store.h"

namespace specnode {

absl::Status ModelRunner::BeginForward(std::span<const BatchEntry> batch) {
  assert(!has_pending_);
  pending_ = batch;
  has_pending_ = true;
  return absl::OkStatus();
}

absl::Status ModelRunner::EndForward(std::vector<float>* logits) {
  assert(has_pending_);
  has_pending_ = false;
  return Forward(pending_, logits);
}

std::optional<ModelRunner::KvRoom> ModelRunner::Room(int64_t) const { return std::nullopt; }

std::optional<ModelRunner::KvMemory> ModelRunner::Memory() const { return std::nullopt; }

absl::Status ModelRunner::SwapOut(SeqId) {
  return absl::UnimplementedError("this runner cannot swap KV out");
}

absl::Status ModelRunner::SwapIn(SeqId) {
  return absl::UnimplementedError("this runner cannot swap KV in");
}

absl::Status ModelRunner::Ping() { return absl::OkStatus(); }

absl::Status ModelRunner::Reserve(SeqId, int32_t) {
  return absl::UnimplementedError("this runner does not reserve ahead of a pass");
}

LocalModelRunner::LocalModelRunner(const LlamaConfig& config, const LlamaWeights& weights,
                                   ThreadPool* pool, std::unique_ptr<KvCache> cache,
                                   PartialSumReducer* reducer)
    : forward_(config, weights, pool, reducer),
      cache_(std::move(cache)),
      store_(dynamic_cast<KvStore*>(cache_.get())) {}

absl::Status LocalModelRunner::Forward(std::span<const BatchEntry> batch,
                                       std::vector<float>* logits) {
  return forward_.Forward(batch, cache_.get(), logits);
}

std::optional<ModelRunner::KvRoom> LocalModelRunner::Room(int64_t tokens) const {
  if (store_ == nullptr) return std::nullopt;
  return KvRoom{store_->BytesForTokens(tokens), store_->AvailableBytes()};
}

std::optional<ModelRunner::KvMemory> LocalModelRunner::Memory() const {
  if (store_ == nullptr) return std::nullopt;
  const KvUsage u = store_->Usage();
  return KvMemory{u.capacity_bytes, u.used_bytes, u.bytes};
}

absl::Status LocalModelRunner::SwapOut(SeqId seq) {
  return store_ == nullptr ? ModelRunner::SwapOut(seq) : store_->SwapOut(seq);
}

absl::Status LocalModelRunner::SwapIn(SeqId seq) {
  return store_ == nullptr ? ModelRunner::SwapIn(seq) : store_->SwapIn(seq);
}

}  // namespace specnode
