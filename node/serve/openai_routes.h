// The OpenAI-compatible routes of the node's HTTP listener (http_server.h):
//   GET  /v1/models            the model this node serves
//   POST /v1/chat/completions  chat messages -> the chat template -> the scheduler
//   POST /v1/completions       a raw prompt -> the scheduler
// Both POST routes answer one JSON response, or with "stream": true Server-Sent Events
// (`data: {chunk}` per piece of text, a last chunk with the finish_reason, a usage chunk
// when stream_options.include_usage, then `data: [DONE]`). Requests go to the same
// scheduler as the ZeroMQ front end's (submit_builder.h turns them into the same tokens).
//
// A client that disconnects has its request cancelled and its KV freed: a stream's next
// write fails (a token, or the keep-alive comment sent after 2 s without text); a
// non-streaming handler, which has nothing to write yet, watches its connection for the
// peer's close every 250 ms (httplib gives handlers no socket: ClientConnection finds it by
// its addresses).
//
// Errors: before any response byte, an HTTP status and an OpenAI-style error body with the
// one table's code (request_error.h; also in the X-Specnode-Error-Code header); inside a
// stream (the target lost mid-request, the drain cut it), an SSE `data: {"error": ...}`
// event, then `data: [DONE]`.
//
// Thread-safety: the routes run on the HTTP server's threads; the scheduler, tokenizer and
// router are thread-safe for what is used here. All borrowed; they outlive the service.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "coordinator/domain_router.h"
#include "coordinator/scheduler.h"
#include "model/tokenizer/tokenizer.h"
#include "node/serve/error_counter.h"
#include "node/serve/protocol.h"

namespace specnode {

class HttpRouter;

struct OpenAiServiceOptions {
  // The ids /v1/models lists and a request's `model` may name; [0] answers a request naming
  // none. Never empty.
  std::vector<std::string> model_names;
  ProtocolLimits limits;  // stop strings, messages, max_tokens cap
  // The longest sequence a request may take (prompt + completion): serve.max_model_len, else
  // the target's context length.
  int64_t max_model_len = 0;
};

class OpenAiService {
 public:
  OpenAiService(OpenAiServiceOptions options, Scheduler* scheduler, const Tokenizer* tokenizer,
                const DomainRouter* router, ErrorCounter* errors);

  // Adds the routes to the listener (before it listens): the listener has read and checked
  // the bodies and the API key (http_server.h).
  void Register(HttpRouter& router);

 private:
  OpenAiServiceOptions options_;
  Scheduler* scheduler_;
  const Tokenizer* tokenizer_;
  const DomainRouter* router_;
  ErrorCounter* errors_;
  int64_t created_ = 0;  // Unix seconds at start: the model's `created`
};

}  // namespace specnode
