#include "model/llama/backend.h"

#include <cassert>
#include <span>

#include "model/llama/sampling.h"
#include "model/status_macros.h"

namespace specnode {

absl::Status Backend::SelectHead(const float*, int64_t, int64_t, int) { return absl::OkStatus(); }

absl::Status Backend::FinishArgMax(const float* logits, int64_t rows, int64_t vocab,
                                   std::vector<float>* host, std::vector<int32_t>* ids, bool) {
  SPECNODE_RETURN_IF_ERROR(FinishLogits(logits, rows * vocab, host));
  ids->resize(static_cast<size_t>(rows));
  ArgMaxRows(host->data(), rows, vocab, ids->data());
  return absl::OkStatus();
}

absl::Status Backend::FinishTopK(const float* logits, int64_t rows, int64_t vocab, int k,
                                 std::vector<float>* host, std::vector<int32_t>* ids,
                                 std::vector<float>* values, bool) {
  SPECNODE_RETURN_IF_ERROR(FinishLogits(logits, rows * vocab, host));
  ids->resize(static_cast<size_t>(rows * k));
  values->resize(static_cast<size_t>(rows * k));
  TopKRows(host->data(), rows, vocab, k, ids->data(), values->data());
  return absl::OkStatus();
}

absl::Status Backend::FinishDraws(const float* logits, int64_t rows, int64_t vocab,
                                  std::span<const sample::DrawParams> draws,
                                  std::vector<float>* host, std::vector<int32_t>* ids) {
  assert(static_cast<int64_t>(draws.size()) == rows);
  SPECNODE_RETURN_IF_ERROR(FinishLogits(logits, rows * vocab, host));
  ids->resize(static_cast<size_t>(rows));
  DrawRows(host->data(), rows, vocab, draws.data(), ids->data());
  return absl::OkStatus();
}

}  // namespace specnode
