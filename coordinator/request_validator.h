// The one set of checks a generation request passes, whichever way it came in: the ZeroMQ
// front end (through Scheduler::Submit), the speculative engine (SpeculativeEngine::Start,
// for callers that bypass the scheduler) and the CLI (ModelSession). The wire format and its
// resource limits (frame size, message and stop-string counts) are the protocol parser's;
// everything about the request itself is here, once.
//
// Every failure is a RequestErrorStatus (request_error.h): prompt_too_long when prompt +
// max_tokens exceeds the context, bad_request naming the field otherwise.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

#include "absl/status/status.h"
#include "model/llama/sampling.h"

namespace specnode {

struct RequestLimits {
  int32_t vocab_size = 0;                 // prompt ids must be below it
  int32_t context_length = 0;             // prompt + max_tokens must fit in it
  int64_t max_tokens = int64_t{1} << 30;  // the largest max_tokens a request may ask for
};

// prompt: token ids (non-empty); max_tokens >= 1 and <= limits.max_tokens; sampling within
// ValidateSamplingParams' ranges; domain, when given (nullopt: the router names it), a valid
// domain name (DomainRouter::ValidateDomainName: 1..64 of [A-Za-z0-9_.:-], so "" is refused).
absl::Status ValidateRequest(std::span<const int32_t> prompt, int64_t max_tokens,
                             const SamplingParams& sampling,
                             std::optional<std::string_view> domain,
                             const RequestLimits& limits);

}  // namespace specnode
