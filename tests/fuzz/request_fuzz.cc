// libFuzzer target for the client protocol (docs/protocol.md): arbitrary bytes as one
// ZeroMQ frame through ParseClientMessage, then, for a submit that parses, the request
// validator every way in shares (coordinator/request_validator.h), then the replies the
// node would send. Input is the frame itself, so seeds are readable JSON.
//
// Beyond "no crash, no sanitizer report" it traps when a documented promise breaks:
//   - a rejected frame carries one of the parser's codes (bad_json, bad_request,
//     frame_too_large) and, when it names an id, a valid one (1..128 printable ASCII);
//   - a parsed submit is within the limits it was parsed under (exactly one of prompt /
//     messages, known roles, stop strings counted and sized);
//   - a request the validator passes has max_tokens in [1, max], finite sampling values in
//     their ranges and fits the context; one it refuses carries a typed code;
//   - every reply (error, accepted, tokens, done) is one JSON object naming the same id,
//     whatever bytes (invalid UTF-8 included) its text holds.

#include <cmath>
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/request_error.h"
#include "coordinator/request_validator.h"
#include "nlohmann/json.hpp"
#include "node/serve/protocol.h"

namespace {

using specnode::ClientMessage;
using specnode::RequestError;
using Json = nlohmann::json;

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (unsigned char c : id) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// Small limits, so the fuzzer reaches every limit check with short inputs.
specnode::ProtocolLimits Limits() {
  specnode::ProtocolLimits l;
  l.max_frame_bytes = 8192;
  l.max_tokens = 64;
  l.max_stop_strings = 3;
  l.max_stop_bytes = 16;
  l.max_messages = 4;
  return l;
}

// A reply must be one JSON object of `type` whose "id" is `id` (null when absent).
void CheckReply(const std::string& reply, const char* type, const std::optional<std::string>& id) {
  const Json j = Json::parse(reply, nullptr, /*allow_exceptions=*/false);
  Check(!j.is_discarded() && j.is_object());
  Check(j.contains("type") && j["type"] == type);
  Check(j.contains("id"));
  if (id.has_value()) {
    Check(j["id"].is_string() && j["id"].get<std::string>() == *id);
  } else {
    Check(j["id"].is_null());
  }
}

void CheckSubmit(const specnode::SubmitMessage& s, const specnode::ProtocolLimits& limits) {
  Check(ValidId(s.id));
  Check(s.prompt.has_value() != !s.messages.empty());
  if (s.prompt.has_value()) Check(!s.prompt->empty());
  Check(s.messages.size() <= limits.max_messages);
  for (const auto& m : s.messages) {
    Check(m.role == "system" || m.role == "user" || m.role == "assistant");
  }
  Check(s.stop.size() <= limits.max_stop_strings);
  for (const std::string& stop : s.stop) {
    Check(!stop.empty() && stop.size() <= limits.max_stop_bytes);
  }

  // The node tokenises the prompt; here each byte of the text stands for a token id in a
  // 200-token vocabulary, so ids >= 200 exercise the vocabulary check.
  std::vector<int32_t> ids;
  const std::string text = s.prompt.has_value() ? *s.prompt : s.messages.front().content;
  for (unsigned char c : text) ids.push_back(c);
  specnode::RequestLimits rl;
  rl.vocab_size = 200;
  rl.context_length = 96;
  rl.max_tokens = limits.max_tokens;
  const absl::Status st = specnode::ValidateRequest(ids, s.max_tokens, s.sampling, s.domain, rl);
  if (st.ok()) {
    Check(!ids.empty());
    Check(s.max_tokens >= 1 && s.max_tokens <= rl.max_tokens);
    Check(static_cast<int64_t>(ids.size()) + s.max_tokens <= rl.context_length);
    Check(std::isfinite(s.sampling.temperature) && s.sampling.temperature >= 0.0f);
    Check(std::isfinite(s.sampling.top_p) && s.sampling.top_p > 0.0f && s.sampling.top_p <= 1.0f);
    Check(s.sampling.top_k >= 0);
    if (s.domain.has_value()) Check(!s.domain->empty() && s.domain->size() <= 64);
  } else {
    const RequestError code = specnode::RequestErrorOf(st, RequestError::kInternal);
    Check(code == RequestError::kBadRequest || code == RequestError::kPromptTooLong);
    CheckReply(specnode::ErrorReply(s.id, code, std::string(st.message())), "error", s.id);
  }

  // What the node streams back echoes request bytes (stop strings, the prompt) in text
  // fields: any bytes must still serialise to JSON.
  CheckReply(specnode::AcceptedReply(s.id, 3), "accepted", s.id);
  CheckReply(specnode::TokensReply(s.id, text, ids, 0), "tokens", s.id);
  specnode::RequestStats stats;
  stats.domain = s.domain.value_or("default");
  stats.sla = s.sla;
  CheckReply(specnode::DoneReply(s.id, specnode::FinishKind::kStopString, text, stats), "done",
             s.id);
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view frame(reinterpret_cast<const char*>(data), size);
  const specnode::ProtocolLimits limits = Limits();
  const specnode::ParseResult r = specnode::ParseClientMessage(frame, limits);
  if (!r.ok) {
    Check(r.error.code == RequestError::kBadJson || r.error.code == RequestError::kBadRequest ||
          r.error.code == RequestError::kFrameTooLarge);
    Check(!r.error.message.empty());
    if (r.error.id.has_value()) Check(ValidId(*r.error.id));
    CheckReply(specnode::ErrorReply(r.error.id, r.error.code, r.error.message), "error",
               r.error.id);
    return 0;
  }
  switch (r.message.type) {
    case ClientMessage::Type::kSubmit:
      Check(r.message.id == r.message.submit.id);
      CheckSubmit(r.message.submit, limits);
      break;
    case ClientMessage::Type::kCancel:
      Check(ValidId(r.message.id));
      break;
    case ClientMessage::Type::kStats:
    case ClientMessage::Type::kHealth:
      break;
  }
  return 0;
}
