// From a client's submit (ZeroMQ frame or OpenAI HTTP body, both parsed into SubmitMessage)
// to the scheduler's GenerationRequest: tokenising the prompt, or rendering the chat
// template and tokenising that, and naming the domain (the message's, else the router's
// rules over the last user message). One path for every front end, so that a prompt gives
// the same tokens and domain whichever way it came in.
//
// Thread-safety: a pure function of its arguments; the tokenizer and router are immutable
// and may be shared by the front ends' threads.
#pragma once

#include "absl/status/statusor.h"
#include "coordinator/domain_router.h"
#include "coordinator/scheduler.h"
#include "model/tokenizer/tokenizer.h"
#include "node/serve/protocol.h"

namespace specnode {

// bad_request (request_error.h) when the text cannot be encoded or the chat template cannot
// render the messages (the message says why, e.g. a model without a template). Everything
// else about the request (lengths, sampling, SLA class) is the scheduler's validator's.
absl::StatusOr<GenerationRequest> BuildGenerationRequest(const SubmitMessage& m,
                                                         const Tokenizer& tokenizer,
                                                         const DomainRouter& router);

}  // namespace specnode
