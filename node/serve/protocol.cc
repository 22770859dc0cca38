#include "node/serve/protocol.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <set>

#include "absl/strings/str_cat.h"
#include "nlohmann/json.hpp"

namespace specnode {
namespace {

using Json = nlohmann::json;

ParseResult Bad(RequestError code, std::string message, std::optional<std::string> id = {}) {
  ParseResult r;
  r.error = {std::move(code), std::move(message), std::move(id)};
  return r;
}

bool ValidId(const std::string& id) {
  if (id.empty() || id.size() > 128) return false;
  for (unsigned char c : id) {
    if (c < 0x20 || c > 0x7e) return false;
  }
  return true;
}

// Reads an optional number field into *out; false (with *err set) on a wrong type or a
// value outside [lo, hi].
bool GetNumber(const Json& j, const char* key, double lo, double hi, double* out,
               std::string* err) {
  if (!j.contains(key)) return true;
  const Json& v = j[key];
  if (!v.is_number() || !std::isfinite(v.get<double>())) {
    *err = absl::StrCat("\"", key, "\" must be a number");
    return false;
  }
  const double x = v.get<double>();
  if (x < lo || x > hi) {
    *err = absl::StrCat("\"", key, "\" must be in [", lo, ", ", hi, "], got ", x);
    return false;
  }
  *out = x;
  return true;
}

bool GetInteger(const Json& j, const char* key, int64_t lo, int64_t hi, int64_t* out,
                std::string* err) {
  if (!j.contains(key)) return true;
  const Json& v = j[key];
  if (!v.is_number_integer()) {
    *err = absl::StrCat("\"", key, "\" must be an integer");
    return false;
  }
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (x < lo || x > hi) {
    *err = absl::StrCat("\"", key, "\" must be in [", lo, ", ", hi, "], got ", x);
    return false;
  }
  *out = x;
  return true;
}

ParseResult ParseSubmit(const Json& j, const ProtocolLimits& limits, ParseResult r) {
  static const std::set<std::string> kKeys = {
      "type",  "id",   "prompt", "messages", "max_tokens", "temperature", "top_p",
      "top_k", "seed", "stop",   "domain",   "sla",        "stream"};
  SubmitMessage& s = r.message.submit;
  s.id = r.message.id;
  const auto id = std::optional<std::string>(s.id);
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (!kKeys.count(it.key())) return Bad(RequestError::kBadRequest, "unknown field \"" + it.key() + "\"", id);
  }
  if (j.contains("prompt") == j.contains("messages")) {
    return Bad(RequestError::kBadRequest, "give exactly one of \"prompt\" and \"messages\"", id);
  }
  if (j.contains("prompt")) {
    if (!j["prompt"].is_string()) return Bad(RequestError::kBadRequest, "\"prompt\" must be a string", id);
    s.prompt = j["prompt"].get<std::string>();
    if (s.prompt->empty()) return Bad(RequestError::kBadRequest, "\"prompt\" is empty", id);
  } else {
    const Json& m = j["messages"];
    if (!m.is_array() || m.empty() || m.size() > limits.max_messages) {
      return Bad(RequestError::kBadRequest,
          absl::StrCat("\"messages\" must be an array of 1..", limits.max_messages, " messages"),
          id);
    }
    for (size_t i = 0; i < m.size(); ++i) {
      const Json& e = m[i];
      if (!e.is_object() || !e.contains("role") || !e.contains("content") ||
          !e["role"].is_string() || !e["content"].is_string()) {
        return Bad(RequestError::kBadRequest,
            absl::StrCat("messages[", i, "] must be {\"role\": string, \"content\": string}"), id);
      }
      const std::string role = e["role"].get<std::string>();
      if (role != "system" && role != "user" && role != "assistant") {
        return Bad(RequestError::kBadRequest,
                   absl::StrCat("messages[", i, "].role must be system, user or assistant"), id);
      }
      s.messages.push_back({role, e["content"].get<std::string>()});
    }
  }
  std::string err;
  double temperature = kDefaultSampling.temperature, top_p = kDefaultSampling.top_p;
  int64_t top_k = kDefaultSampling.top_k, seed = static_cast<int64_t>(kDefaultSampling.seed);
  // Types and representable values only: what the values may be is the request
  // validator's (coordinator/request_validator.h, in Scheduler::Submit), for every way in.
  constexpr double kAnyNumber = std::numeric_limits<double>::max();
  if (!GetInteger(j, "max_tokens", INT64_MIN, INT64_MAX, &s.max_tokens, &err) ||
      !GetNumber(j, "temperature", -kAnyNumber, kAnyNumber, &temperature, &err) ||
      !GetNumber(j, "top_p", -kAnyNumber, kAnyNumber, &top_p, &err) ||
      !GetInteger(j, "top_k", INT32_MIN, INT32_MAX, &top_k, &err) ||
      !GetInteger(j, "seed", 0, INT64_MAX, &seed, &err)) {
    return Bad(RequestError::kBadRequest, err, id);
  }
  s.sampling.temperature = static_cast<float>(temperature);
  s.sampling.top_p = static_cast<float>(top_p);
  s.sampling.top_k = static_cast<int>(top_k);
  s.sampling.seed = static_cast<uint64_t>(seed);
  if (j.contains("stop")) {
    const Json& st = j["stop"];
    if (!st.is_array() || st.size() > limits.max_stop_strings) {
      return Bad(RequestError::kBadRequest,
                 absl::StrCat("\"stop\" must be an array of at most ", limits.max_stop_strings,
                              " strings"),
                 id);
    }
    for (const Json& e : st) {
      if (!e.is_string() || e.get<std::string>().empty() ||
          e.get<std::string>().size() > limits.max_stop_bytes) {
        return Bad(RequestError::kBadRequest,
                   absl::StrCat("\"stop\" entries must be strings of 1..", limits.max_stop_bytes,
                                " bytes"),
                   id);
      }
      s.stop.push_back(e.get<std::string>());
    }
  }
  for (const char* key : {"domain", "sla"}) {
    if (!j.contains(key)) continue;
    if (!j[key].is_string())
      return Bad(RequestError::kBadRequest, absl::StrCat("\"", key, "\" must be a string"), id);
  }
  // Present means as given (the validator checks it: 1..64 characters); absent means the
  // router names it.
  if (j.contains("domain")) s.domain = j["domain"].get<std::string>();
  if (j.contains("sla")) s.sla = j["sla"].get<std::string>();
  if (j.contains("stream")) {
    if (!j["stream"].is_boolean())
      return Bad(RequestError::kBadRequest, "\"stream\" must be true or false", id);
    s.stream = j["stream"].get<bool>();
  }
  r.ok = true;
  return r;
}

}  // namespace

int64_t TransportFrameCap(const ProtocolLimits& limits) {
  constexpr int64_t kFloor = int64_t{64} << 20;
  const int64_t scaled = static_cast<int64_t>(limits.max_frame_bytes) * 16;
  return std::max(kFloor, scaled);
}

ParseResult ParseClientMessage(std::string_view frame, const ProtocolLimits& limits) {
  if (frame.size() > limits.max_frame_bytes) {
    return Bad(RequestError::kFrameTooLarge,
               absl::StrCat("frame of ", frame.size(), " bytes exceeds ", limits.max_frame_bytes));
  }
  const Json j = Json::parse(frame.begin(), frame.end(), nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return Bad(RequestError::kBadJson, "a frame must hold one JSON object");
  }
  // Every error about a message that carries a usable id names it, whatever else is wrong.
  std::optional<std::string> frame_id;
  if (j.contains("id") && j["id"].is_string() && ValidId(j["id"].get<std::string>())) {
    frame_id = j["id"].get<std::string>();
  }
  if (!j.contains("type") || !j["type"].is_string()) {
    return Bad(RequestError::kBadRequest, "missing string field \"type\"", frame_id);
  }
  const std::string type = j["type"].get<std::string>();
  ParseResult r;
  if (type == "stats" || type == "health") {
    r.message.type = type == "stats" ? ClientMessage::Type::kStats : ClientMessage::Type::kHealth;
    r.ok = true;
    return r;
  }
  if (type != "submit" && type != "cancel") {
    return Bad(RequestError::kBadRequest, "unknown message type \"" + type + "\"", frame_id);
  }
  if (!j.contains("id") || !j["id"].is_string() || !ValidId(j["id"].get<std::string>())) {
    return Bad(RequestError::kBadRequest, "\"id\" must be a string of 1..128 printable ASCII characters");
  }
  r.message.id = j["id"].get<std::string>();
  if (type == "cancel") {
    r.message.type = ClientMessage::Type::kCancel;
    r.ok = true;
    return r;
  }
  r.message.type = ClientMessage::Type::kSubmit;
  return ParseSubmit(j, limits, std::move(r));
}

namespace {
std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }
}  // namespace

std::string AcceptedReply(const std::string& id, int queue_position) {
  return Dump({{"type", "accepted"}, {"id", id}, {"queue_position", queue_position}});
}

std::string TokensReply(const std::string& id, const std::string& text,
                        const std::vector<int32_t>& token_ids, int32_t index) {
  return Dump(
      {{"type", "tokens"}, {"id", id}, {"text", text}, {"token_ids", token_ids}, {"index", index}});
}

Json RequestStatsJson(const RequestStats& s) {
  return {{"prompt_tokens", s.prompt_tokens},
          {"completion_tokens", s.completion_tokens},
          {"drafted", s.drafted},
          {"accepted", s.accepted},
          {"target_passes", s.target_passes},
          {"tree_steps", s.tree_steps},
          {"cached_tokens", s.cached_tokens},
          {"queue_ms", s.queue_ms},
          {"ttft_ms", s.ttft_ms},
          {"tpot_ms", s.tpot_ms},
          {"total_ms", s.total_ms},
          {"domain", s.domain},
          {"sla", s.sla}};
}

std::string DoneReply(const std::string& id, FinishKind finish, const std::string& text,
                      const RequestStats& s) {
  const Json stats = RequestStatsJson(s);
  return Dump({{"type", "done"},
               {"id", id},
               {"finish_reason", FinishKindName(finish)},
               {"text", text},
               {"stats", stats}});
}

std::string ErrorReply(const std::optional<std::string>& id, RequestError code,
                       const std::string& message) {
  Json j = {{"type", "error"}, {"code", std::string(WireCode(code))}, {"message", message}};
  j["id"] = id.has_value() ? Json(*id) : Json(nullptr);
  return Dump(j);
}

}  // namespace specnode
