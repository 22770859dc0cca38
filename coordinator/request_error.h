// Why a request was refused or failed, as a typed code — the one table of the error codes
// clients see (docs/protocol.md's "Error codes"; the Python client and the HTTP API
// read client/error_codes.json, which `specnode error-codes --json` writes from this table
// and a test keeps equal to it).
//
// A code travels inside an absl::Status as a payload (RequestErrorStatus), so whoever maps
// a status to the wire reads the code, never the message text.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/status.h"

namespace specnode {

enum class RequestError : uint8_t {
  kBadJson,
  kBadRequest,
  kFrameTooLarge,
  kPromptTooLong,
  kUnknownSla,
  kDuplicateId,
  kUnknownId,
  kOverloaded,
  kShuttingDown,
  kUnavailable,
  kInternal,
  kUnauthorized,
  kUnknownModel,
  kNotFound,
};

struct RequestErrorInfo {
  RequestError code;
  const char* wire;         // the `code` of an error reply: "bad_request", ...
  absl::StatusCode status;  // the canonical code a status with it carries
  int http;                 // the HTTP status the node's OpenAI-compatible API answers with
  const char* meaning;      // one line, as docs/protocol.md says it
};

// Every code, in the enum's order.
std::span<const RequestErrorInfo> RequestErrorTable();
const RequestErrorInfo& RequestErrorInfoOf(RequestError code);
std::string_view WireCode(RequestError code);
// The code whose wire name is `wire`; false when none.
bool ParseWireCode(std::string_view wire, RequestError* out);

// A status with the code's canonical absl code, `message`, and the code as its payload.
absl::Status RequestErrorStatus(RequestError code, std::string_view message);
// The code a status carries; a status without one (an error from below the request layer)
// maps by its canonical code: ResourceExhausted -> overloaded, Unavailable /
// DeadlineExceeded (a lost target) -> unavailable, anything else -> `otherwise`.
RequestError RequestErrorOf(const absl::Status& status,
                            RequestError otherwise = RequestError::kInternal);

}  // namespace specnode
