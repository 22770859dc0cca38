#include "coordinator/request_error.h"

#include <array>
#include <string>

#include "absl/strings/cord.h"

namespace specnode {
namespace {

constexpr char kPayloadUrl[] = "type.specnode/request_error";

using C = absl::StatusCode;
constexpr std::array<RequestErrorInfo, 14> kTable = {{
    {RequestError::kBadJson, "bad_json", C::kInvalidArgument, 400,
     "the frame is not a JSON object (binary garbage, malformed JSON)"},
    {RequestError::kBadRequest, "bad_request", C::kInvalidArgument, 400,
     "missing / wrong-typed / out-of-range field, unknown `type`, unknown field"},
    {RequestError::kFrameTooLarge, "frame_too_large", C::kInvalidArgument, 413,
     "frame above `max_frame_bytes` (HTTP: body above `serve.http_max_body_bytes`)"},
    {RequestError::kPromptTooLong, "prompt_too_long", C::kInvalidArgument, 400,
     "prompt + max_tokens beyond the context length"},
    {RequestError::kUnknownSla, "unknown_sla", C::kInvalidArgument, 400,
     "`sla` names no class in the config"},
    {RequestError::kDuplicateId, "duplicate_id", C::kAlreadyExists, 409,
     "the client already has an active request with this id (that one goes on)"},
    {RequestError::kUnknownId, "unknown_id", C::kNotFound, 404,
     "cancel of an id with no active request"},
    {RequestError::kOverloaded, "overloaded", C::kResourceExhausted, 429,
     "the queue is full, or the request's SLA class sheds load and it would miss its TTFT "
     "target (`sla.classes[].shed`); retry later or elsewhere"},
    {RequestError::kShuttingDown, "shutting_down", C::kUnavailable, 503,
     "the node is draining (SIGINT/SIGTERM)"},
    {RequestError::kUnavailable, "unavailable", C::kUnavailable, 503,
     "the target model is lost (an mpirun target rank died or stopped answering; the message "
     "names it); the node exits"},
    {RequestError::kInternal, "internal", C::kInternal, 500,
     "a bug or a model failure; the node stays up"},
    {RequestError::kUnauthorized, "unauthorized", C::kUnauthenticated, 401,
     "HTTP: missing or wrong `Authorization: Bearer` key (the node has an API key set)"},
    {RequestError::kUnknownModel, "unknown_model", C::kNotFound, 404,
     "HTTP: `model` names no model this node serves (see GET /v1/models)"},
    {RequestError::kNotFound, "not_found", C::kNotFound, 404,
     "HTTP: no such route (or method) on the node's HTTP port"},
}};

}  // namespace

std::span<const RequestErrorInfo> RequestErrorTable() { return kTable; }

const RequestErrorInfo& RequestErrorInfoOf(RequestError code) {
  return kTable[static_cast<size_t>(code)];
}

std::string_view WireCode(RequestError code) { return RequestErrorInfoOf(code).wire; }

bool ParseWireCode(std::string_view wire, RequestError* out) {
  for (const RequestErrorInfo& e : kTable) {
    if (wire == e.wire) {
      *out = e.code;
      return true;
    }
  }
  return false;
}

absl::Status RequestErrorStatus(RequestError code, std::string_view message) {
  const RequestErrorInfo& info = RequestErrorInfoOf(code);
  absl::Status s(info.status, absl::string_view(message.data(), message.size()));
  s.SetPayload(kPayloadUrl, absl::Cord(info.wire));
  return s;
}

RequestError RequestErrorOf(const absl::Status& status, RequestError otherwise) {
  if (auto p = status.GetPayload(kPayloadUrl); p.has_value()) {
    RequestError code;
    if (ParseWireCode(std::string(*p), &code)) return code;
  }
  switch (status.code()) {
    case C::kResourceExhausted:
      return RequestError::kOverloaded;
    case C::kUnavailable:
    case C::kDeadlineExceeded:
      return RequestError::kUnavailable;
    default:
      return otherwise;
  }
}

}  // namespace specnode
