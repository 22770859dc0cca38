#include "model/llama/backend.h"

#include <span>

#include "model/cpu/cpu_matmul.h"
#include "model/llama/sampling.h"
#include "model/status_macros.h"

namespace specnode {

absl::Status Backend::FinishArgMax(const float* logits, int64_t rows, int64_t vocab,
                                   std::vector<float>* host, std::vector<int32_t>* ids) {
  SPECNODE_RETURN_IF_ERROR(FinishLogits(logits, rows * vocab, host));
  ids->resize(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = host->data() + r * vocab;
    (*ids)[r] = AllFinite(row, vocab)
                    ? ArgMax(std::span<const float>(row, static_cast<size_t>(vocab)))
                    : -1;
  }
  return absl::OkStatus();
}

absl::Status Backend::FinishTopK(const float* logits, int64_t rows, int64_t vocab, int k,
                                 std::vector<float>* host, std::vector<int32_t>* ids,
                                 std::vector<float>* values) {
  SPECNODE_RETURN_IF_ERROR(FinishLogits(logits, rows * vocab, host));
  ids->resize(static_cast<size_t>(rows * k));
  values->resize(static_cast<size_t>(rows * k));
  for (int64_t r = 0; r < rows; ++r) {
    const float* row = host->data() + r * vocab;
    if (!AllFinite(row, vocab)) {
      (*ids)[r * k] = -1;
      continue;
    }
    TopK(std::span<const float>(row, static_cast<size_t>(vocab)), k, ids->data() + r * k,
         values->data() + r * k);
  }
  return absl::OkStatus();
}

}  // namespace specnode
