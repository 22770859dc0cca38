#include "coordinator/request_validator.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/domain_router.h"
#include "coordinator/request_error.h"

namespace specnode {

absl::Status ValidateRequest(std::span<const int32_t> prompt, int64_t max_tokens,
                             const SamplingParams& sampling,
                             std::optional<std::string_view> domain,
                             const RequestLimits& limits) {
  auto bad = [](const std::string& what) {
    return RequestErrorStatus(RequestError::kBadRequest, what);
  };
  if (prompt.empty()) return bad("the prompt is empty (it encodes to no tokens)");
  for (int32_t id : prompt) {
    if (id < 0 || id >= limits.vocab_size) {
      return bad(absl::StrFormat("prompt token id %d outside the vocabulary [0, %d)", id,
                                 limits.vocab_size));
    }
  }
  if (max_tokens < 1 || max_tokens > limits.max_tokens) {
    return bad(
        absl::StrFormat("max_tokens must be in [1, %d], got %d", limits.max_tokens, max_tokens));
  }
  if (absl::Status s = ValidateSamplingParams(sampling); !s.ok())
    return bad(std::string(s.message()));
  if (domain.has_value()) {
    if (absl::Status s = DomainRouter::ValidateDomainName(*domain); !s.ok()) {
      return bad(absl::StrCat("domain: ", s.message()));
    }
  }
  if (static_cast<int64_t>(prompt.size()) + max_tokens > limits.context_length) {
    return RequestErrorStatus(
        RequestError::kPromptTooLong,
        absl::StrFormat("prompt of %d tokens plus max_tokens %d exceeds the context length %d",
                        prompt.size(), max_tokens, limits.context_length));
  }
  return absl::OkStatus();
}

}  // namespace specnode
