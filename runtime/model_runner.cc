#include "runtime/model_runner.h"

#include <cassert>

#include "absl/strings/str_cat.h"
#include "model/llama/cpu_backend.h"
#include "model/llama/sampling.h"
#include "model/status_macros.h"

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

namespace {

// Each [vocab] row's ArgMax (the logits are finite: Forward checked them).
void HostArgMax(const std::vector<float>& logits, int32_t vocab, std::vector<int32_t>* ids) {
  const size_t rows = logits.size() / static_cast<size_t>(vocab);
  ids->resize(rows);
  ArgMaxRows(logits.data(), static_cast<int64_t>(rows), vocab, ids->data());
}

// Each [vocab] row's TopK (finite, as above).
absl::Status HostTopK(const std::vector<float>& logits, int32_t vocab, int k,
                      std::vector<int32_t>* ids, std::vector<float>* values) {
  SPECNODE_RETURN_IF_ERROR(ValidateHeadK(k, vocab));
  const size_t rows = logits.size() / static_cast<size_t>(vocab);
  ids->resize(rows * k);
  values->resize(rows * k);
  TopKRows(logits.data(), static_cast<int64_t>(rows), vocab, k, ids->data(), values->data());
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelRunner::ForwardTopK(std::span<const BatchEntry> batch, int k,
                                      std::vector<int32_t>* ids, std::vector<float>* values) {
  SPECNODE_RETURN_IF_ERROR(Forward(batch, &argmax_logits_));
  return HostTopK(argmax_logits_, vocab_size(), k, ids, values);
}

absl::Status ModelRunner::EndForwardTopK(int k, std::vector<int32_t>* ids,
                                         std::vector<float>* values) {
  if (has_pending_) {
    has_pending_ = false;
    return ForwardTopK(pending_, k, ids, values);
  }
  SPECNODE_RETURN_IF_ERROR(EndForward(&argmax_logits_));
  return HostTopK(argmax_logits_, vocab_size(), k, ids, values);
}

absl::Status ModelRunner::ForwardArgMax(std::span<const BatchEntry> batch,
                                        std::vector<int32_t>* ids) {
  SPECNODE_RETURN_IF_ERROR(Forward(batch, &argmax_logits_));
  HostArgMax(argmax_logits_, vocab_size(), ids);
  return absl::OkStatus();
}

absl::Status ModelRunner::EndForwardArgMax(std::vector<int32_t>* ids) {
  if (has_pending_) {
    has_pending_ = false;
    return ForwardArgMax(pending_, ids);
  }
  SPECNODE_RETURN_IF_ERROR(EndForward(&argmax_logits_));
  HostArgMax(argmax_logits_, vocab_size(), ids);
  return absl::OkStatus();
}

namespace {

// Each [vocab] row's draw (finite, as above).
absl::Status HostDraws(const std::vector<float>& logits, int32_t vocab,
                       std::span<const sample::DrawParams> draws, std::vector<int32_t>* ids) {
  const size_t rows = logits.size() / static_cast<size_t>(vocab);
  SPECNODE_RETURN_IF_ERROR(CheckDrawCount("ForwardDrawn", draws.size(), rows));
  ids->resize(rows);
  DrawRows(logits.data(), static_cast<int64_t>(rows), vocab, draws.data(), ids->data());
  for (size_t r = 0; r < rows; ++r) {
    if ((*ids)[r] < 0) {
      return absl::DataLossError(
          absl::StrCat("the model produced non-finite logits (NaN or Inf) in row ", r));
    }
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status ModelRunner::ForwardDrawn(std::span<const BatchEntry> batch,
                                       std::span<const sample::DrawParams> draws,
                                       std::vector<int32_t>* ids) {
  SPECNODE_RETURN_IF_ERROR(
      CheckDrawCount("ForwardDrawn", draws.size(), static_cast<int64_t>(LogitRows(batch).size())));
  SPECNODE_RETURN_IF_ERROR(Forward(batch, &argmax_logits_));
  return HostDraws(argmax_logits_, vocab_size(), draws, ids);
}

absl::Status ModelRunner::EndForwardDrawn(std::span<const sample::DrawParams> draws,
                                          std::vector<int32_t>* ids) {
  if (has_pending_) {
    has_pending_ = false;
    return ForwardDrawn(pending_, draws, ids);
  }
  SPECNODE_RETURN_IF_ERROR(EndForward(&argmax_logits_));
  return HostDraws(argmax_logits_, vocab_size(), draws, ids);
}

std::optional<ModelRunner::KvRoom> ModelRunner::Room(int64_t) const { return std::nullopt; }

std::optional<ModelRunner::KvMemory> ModelRunner::Memory() const { return std::nullopt; }

std::optional<std::array<int64_t, kKvClasses>> ModelRunner::SequenceTokens(SeqId) const {
  return std::nullopt;
}

absl::Status ModelRunner::SwapOut(SeqId) {
  return absl::UnimplementedError(absl::StrCat("the runner on ", device(), " cannot swap KV out"));
}

absl::Status ModelRunner::SwapIn(SeqId) {
  return absl::UnimplementedError(absl::StrCat("the runner on ", device(), " cannot swap KV in"));
}

absl::Status ModelRunner::Fork(SeqId, SeqId) {
  return absl::UnimplementedError(absl::StrCat("the runner on ", device(), " cannot fork"));
}

absl::Status ModelRunner::KeepRows(SeqId, int32_t, std::span<const int32_t>) {
  return absl::UnimplementedError(
      absl::StrCat("the target on ", device(), " does not verify draft trees"));
}

absl::Status ModelRunner::SetKvEventListener(KvCacheEventListener*) {
  return absl::UnimplementedError(absl::StrCat(
      "the target on ", device(), " keeps no prefix cache in this process to report KV events of"));
}

absl::Status ModelRunner::Ping() { return absl::OkStatus(); }

absl::Status ModelRunner::Reserve(SeqId, int32_t) {
  return absl::UnimplementedError("this runner does not reserve ahead of a pass");
}

LocalModelRunner::LocalModelRunner(const LlamaConfig& config, std::unique_ptr<Backend> backend,
                                   std::shared_ptr<const LlamaWeights> weights,
                                   std::unique_ptr<KvCache> cache, PartialSumReducer* reducer)
    : backend_(std::move(backend)),
      forward_(std::make_unique<LlamaForward>(config, std::move(weights), backend_.get(), reducer)),
      cache_(std::move(cache)) {}

LocalModelRunner::LocalModelRunner(const LlamaConfig& config, const LlamaWeights& weights,
                                   ThreadPool* pool, std::unique_ptr<KvCache> cache,
                                   PartialSumReducer* reducer)
    : LocalModelRunner(config, std::make_unique<CpuBackend>(pool, weights.activations),
                       CpuBackend::ForKernels(std::shared_ptr<const LlamaWeights>(
                                                  &weights, [](const LlamaWeights*) {}),
                                              weights.activations),
                       std::move(cache), reducer) {}

LocalModelRunner::~LocalModelRunner() = default;

absl::Status LocalModelRunner::Forward(std::span<const BatchEntry> batch,
                                       std::vector<float>* logits) {
  return forward_->Forward(batch, cache_.get(), logits);
}

absl::Status LocalModelRunner::ForwardArgMax(std::span<const BatchEntry> batch,
                                             std::vector<int32_t>* ids) {
  return forward_->ForwardArgMax(batch, cache_.get(), ids);
}

absl::Status LocalModelRunner::ForwardTopK(std::span<const BatchEntry> batch, int k,
                                           std::vector<int32_t>* ids, std::vector<float>* values) {
  return forward_->ForwardTopK(batch, cache_.get(), k, ids, values);
}

absl::Status LocalModelRunner::ForwardDrawn(std::span<const BatchEntry> batch,
                                            std::span<const sample::DrawParams> draws,
                                            std::vector<int32_t>* ids) {
  return forward_->ForwardDrawn(batch, cache_.get(), draws, ids);
}

std::optional<ModelRunner::KvRoom> LocalModelRunner::Room(int64_t tokens) const {
  if (!cache_->managed()) return std::nullopt;
  return KvRoom{cache_->BytesForTokens(tokens), cache_->AvailableBytes()};
}

std::optional<ModelRunner::KvMemory> LocalModelRunner::Memory() const {
  if (!cache_->managed()) return std::nullopt;
  const KvUsage u = cache_->Usage();
  return KvMemory{u.capacity_bytes, u.used_bytes, u.bytes,
                  u.tokens,         u.host_bytes, u.cache_only_bytes};
}

std::optional<std::array<int64_t, kKvClasses>> LocalModelRunner::SequenceTokens(SeqId seq) const {
  if (!cache_->managed()) return std::nullopt;
  return cache_->SequenceTokens(seq);
}

}  // namespace specnode
