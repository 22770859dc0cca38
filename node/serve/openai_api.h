// The OpenAI-compatible API's JSON (docs/openai-api.md): parsing the bodies of
// POST /v1/chat/completions and /v1/completions into the node's SubmitMessage, and building
// the responses, stream chunks, model list and errors. Pure functions over JSON text; the
// routes that use them are openai_routes.h.
//
// What a request may carry: model (must name the served model when given), messages
// (chat: role system|user|assistant, content a string or an array of {"type": "text"}
// parts) or prompt (completions: a string, or an array holding one string), max_tokens /
// max_completion_tokens, temperature (default 1, as OpenAI's), top_p, top_k, seed (absent:
// a fresh random one per request, so that sampling differs between identical requests),
// stop (string or array), stream, stream_options.include_usage, n (1 only), user (ignored),
// and specnode's own `domain` and `sla`. Fields that would change the output and that the
// node does not implement (logprobs, tools, response_format, logit_bias, penalties other
// than 0, best_of, echo, suffix) are refused by name when set to anything but their "off"
// value (null, false, 0, "", [], {}, tool_choice "none"/"auto", response_format
// {"type": "text"}, best_of 1, modalities ["text"]), never ignored.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/scheduler.h"
#include "node/serve/protocol.h"

namespace specnode {

enum class OpenAiEndpoint { kChatCompletions, kCompletions };

struct OpenAiRequest {
  OpenAiEndpoint endpoint = OpenAiEndpoint::kChatCompletions;
  SubmitMessage submit;        // prompt or messages, sampling, limits, domain, sla, stream
  std::string model;           // as the client named it ("" when absent); echoed in responses
  bool include_usage = false;  // stream_options.include_usage: a last chunk with usage
  // Chat without max_tokens / max_completion_tokens: the rest of the context, capped at
  // serve.max_tokens, once the prompt's length is known (as vLLM does).
  bool max_tokens_fill = false;
};

// Parses a request body. Errors carry their RequestError (request_error.h): bad_json for a
// body that is not a JSON object, bad_request naming the field otherwise, unknown_model when
// `model` is given and is neither one of `served_models` nor empty. An empty or absent
// `model` is answered as served_models[0] (never empty: the node's first served name).
absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, const std::string& body,
                                                 const ProtocolLimits& limits,
                                                 std::span<const std::string> served_models);

// A chat `messages` array given as JSON text, parsed as ParseOpenAiRequest parses the
// request's: roles system (or OpenAI's newer "developer"), user and assistant; content a
// string or an array of text parts, joined by newlines (as vLLM joins them); 1 ..
// max_messages of them. InvalidArgument naming the message otherwise. `specnode tokenize
// --messages` renders its conversation through this, so it renders what the API does.
absl::StatusOr<std::vector<ChatMessage>> ParseChatMessages(std::string_view json,
                                                           size_t max_messages);

// "stop" or "length": what OpenAI calls the finish. kStopString is "stop" (a stop string
// matched); kCancelled has no OpenAI name and is answered as an error by the routes.
const char* OpenAiFinishReason(FinishKind finish);

// The whole (non-streamed) response: chat.completion or text_completion, with `usage` and
// the node's per-request stats under "specnode". `id` is the response id ("chatcmpl-..." /
// "cmpl-..."), `created` Unix seconds.
std::string OpenAiResponse(const OpenAiRequest& r, const std::string& id, int64_t created,
                           const std::string& text, FinishKind finish, const RequestStats& stats);

// One SSE event's JSON (without "data: "): a chat.completion.chunk / text_completion chunk
// with `text` as the delta. `first` adds the assistant role (chat); `finish` the
// finish_reason (and an empty delta). With `usage`, the usage-only last chunk (empty
// choices) that stream_options.include_usage asks for.
std::string OpenAiChunk(const OpenAiRequest& r, const std::string& id, int64_t created,
                        const std::string& text, bool first, std::optional<FinishKind> finish);
std::string OpenAiUsageChunk(const OpenAiRequest& r, const std::string& id, int64_t created,
                             const RequestStats& stats);

// {"object": "list", "data": [{"id": name, "object": "model", "owned_by": "specnode",
// "max_model_len": ...}, ...]}: one entry per served name (all the same model), in order.
std::string OpenAiModelList(std::span<const std::string> models, int64_t created,
                            int64_t max_model_len);

// {"error": {"message", "type", "code", "param": null}}: type invalid_request_error below
// HTTP 500, server_error otherwise; code is the wire code of the one error table.
std::string OpenAiError(RequestError code, const std::string& message);

}  // namespace specnode
