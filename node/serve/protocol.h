// The client protocol of docs/protocol.md: parsing and validating client frames, and
// building the node's replies. Pure functions over JSON text; no sockets here.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "coordinator/request_error.h"
#include "coordinator/scheduler.h"
#include "model/llama/sampling.h"
#include "model/tokenizer/chat_template.h"
#include "nlohmann/json_fwd.hpp"

namespace specnode {

inline constexpr int kProtocolVersion = 1;

struct ProtocolLimits {
  size_t max_frame_bytes = 1 << 20;
  // Largest max_tokens a client may ask for (serve.max_tokens): enforced with every other
  // request check by the scheduler's validator (SchedulerOptions::max_tokens).
  int64_t max_tokens = 4096;
  size_t max_stop_strings = 8;
  size_t max_stop_bytes = 256;
  size_t max_messages = 256;
};

struct SubmitMessage {
  std::string id;
  std::optional<std::string> prompt;  // raw text, or
  std::vector<ChatMessage> messages;  // chat messages (template applied by the node)
  int64_t max_tokens = 128;
  SamplingParams sampling;
  std::vector<std::string> stop;
  std::optional<std::string> domain;  // absent: the router's rules name it
  std::string sla;     // "" = default class
  bool stream = true;
};

struct ClientMessage {
  enum class Type { kSubmit, kCancel, kStats, kHealth };
  Type type = Type::kHealth;
  std::string id;  // submit / cancel
  SubmitMessage submit;
};

// The largest frame the socket reads at all: max(64 MiB, 16 x max_frame_bytes). Frames
// between max_frame_bytes and it are answered with frame_too_large; larger ones make
// libzmq close the connection unread.
int64_t TransportFrameCap(const ProtocolLimits& limits);

// A rejected frame: its typed error code (coordinator/request_error.h), a message, and the
// request id when the frame carried a usable one.
struct ProtocolError {
  RequestError code = RequestError::kBadRequest;
  std::string message;
  std::optional<std::string> id;
};

// Parses one frame. Never throws; every problem is a ProtocolError (bad_json,
// bad_request, frame_too_large) naming the field.
struct ParseResult {
  bool ok = false;
  ClientMessage message;
  ProtocolError error;
};
ParseResult ParseClientMessage(std::string_view frame, const ProtocolLimits& limits);

// A finished request's stats as the `done` reply's "stats" object (the OpenAI API's
// "specnode" object too).
nlohmann::json RequestStatsJson(const RequestStats& s);

// Replies (one JSON object each, serialised).
std::string AcceptedReply(const std::string& id, int queue_position);
std::string TokensReply(const std::string& id, const std::string& text,
                        const std::vector<int32_t>& token_ids, int32_t index);
std::string DoneReply(const std::string& id, FinishKind finish, const std::string& text,
                      const RequestStats& stats);
std::string ErrorReply(const std::optional<std::string>& id, RequestError code,
                       const std::string& message);

}  // namespace specnode
