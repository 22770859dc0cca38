#include "node/serve/openai_api.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <set>
#include <string_view>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/request_error.h"
#include "nlohmann/json.hpp"

namespace specnode {
namespace {

using Json = nlohmann::json;

absl::Status Bad(const std::string& message) {
  return RequestErrorStatus(RequestError::kBadRequest, message);
}

std::string Dump(const Json& j) { return j.dump(-1, ' ', false, Json::error_handler_t::replace); }

// A field OpenAI defines that would change the output and the node does not implement:
// refused when set to anything but an "off" value — null, false, 0, "", [], {}, or the
// value that means the default for that field (clients such as LiteLLM send those).
bool IsOff(std::string_view key, const Json& v) {
  if (v.is_null() || (v.is_boolean() && !v.get<bool>()) ||
      (v.is_number() && v.get<double>() == 0.0) ||
      (v.is_string() && v.get<std::string>().empty()) || (v.is_array() && v.empty()) ||
      (v.is_object() && v.empty())) {
    return true;
  }
  // "auto" with no tools or functions (those are refused themselves) chooses none.
  if (key == "tool_choice" || key == "function_call") return v == "none" || v == "auto";
  if (key == "response_format") return v == Json{{"type", "text"}};
  if (key == "best_of") return v == 1;  // n is 1
  if (key == "modalities") return v == Json::array({"text"});
  return false;
}

// An optional number (int or float); a wrong type is bad_request naming the field. Ranges
// are the request validator's (coordinator/request_validator.h), as for ZeroMQ submits.
absl::Status Number(const Json& j, const char* key, double* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  const Json& v = j[key];
  if (!v.is_number() || !std::isfinite(v.get<double>())) {
    return Bad(absl::StrCat("'", key, "' must be a number"));
  }
  *out = v.get<double>();
  return absl::OkStatus();
}

absl::Status Integer(const Json& j, const char* key, int64_t lo, int64_t hi, int64_t* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  const Json& v = j[key];
  if (!v.is_number_integer()) return Bad(absl::StrCat("'", key, "' must be an integer"));
  const int64_t x = v.is_number_unsigned() && v.get<uint64_t>() > static_cast<uint64_t>(INT64_MAX)
                        ? INT64_MAX
                        : v.get<int64_t>();
  if (x < lo || x > hi) {
    return Bad(absl::StrCat("'", key, "' must be in [", lo, ", ", hi, "], got ", x));
  }
  *out = x;
  return absl::OkStatus();
}

absl::Status OptionalString(const Json& j, const char* key, std::optional<std::string>* out) {
  if (!j.contains(key) || j[key].is_null()) return absl::OkStatus();
  if (!j[key].is_string()) return Bad(absl::StrCat("'", key, "' must be a string"));
  *out = j[key].get<std::string>();
  return absl::OkStatus();
}

// A chat message's content: a string, or an array of text parts joined by newlines (as vLLM
// joins them).
absl::StatusOr<std::string> MessageContent(const Json& c, size_t i) {
  if (c.is_string()) return c.get<std::string>();
  if (c.is_array()) {
    std::string text;
    for (const Json& part : c) {
      if (!part.is_object() || part.value("type", "") != "text" || !part.contains("text") ||
          !part["text"].is_string()) {
        return Bad(absl::StrCat("messages[", i,
                                "].content: only text parts ({\"type\": \"text\", \"text\": "
                                "...}) are supported"));
      }
      if (!text.empty()) text += '\n';
      text += part["text"].get<std::string>();
    }
    return text;
  }
  return Bad(absl::StrCat("messages[", i, "].content must be a string or an array of text parts"));
}

absl::StatusOr<std::vector<ChatMessage>> MessagesOf(const Json& m, size_t max_messages) {
  if (!m.is_array() || m.empty() || m.size() > max_messages) {
    return Bad(absl::StrCat("'messages' must be an array of 1..", max_messages, " messages"));
  }
  std::vector<ChatMessage> out;
  for (size_t i = 0; i < m.size(); ++i) {
    const Json& e = m[i];
    if (!e.is_object() || !e.contains("role") || !e["role"].is_string() || !e.contains("content")) {
      return Bad(absl::StrCat("messages[", i, "] must be {\"role\": ..., \"content\": ...}"));
    }
    std::string role = e["role"].get<std::string>();
    // OpenAI's newer name for the system role.
    if (role == "developer") role = "system";
    if (role != "system" && role != "user" && role != "assistant") {
      return Bad(absl::StrCat("messages[", i, "].role must be system, user or assistant"));
    }
    absl::StatusOr<std::string> content = MessageContent(e["content"], i);
    if (!content.ok()) return content.status();
    out.push_back({std::move(role), *std::move(content)});
  }
  return out;
}

absl::Status ParseMessages(const Json& j, const ProtocolLimits& limits, SubmitMessage* s) {
  if (!j.contains("messages")) return Bad("'messages' is required");
  absl::StatusOr<std::vector<ChatMessage>> messages =
      MessagesOf(j["messages"], limits.max_messages);
  if (!messages.ok()) return messages.status();
  s->messages = *std::move(messages);
  return absl::OkStatus();
}

absl::Status ParsePrompt(const Json& j, SubmitMessage* s) {
  if (!j.contains("prompt")) return Bad("'prompt' is required");
  const Json& p = j["prompt"];
  if (p.is_string()) {
    s->prompt = p.get<std::string>();
  } else if (p.is_array() && p.size() == 1 && p[0].is_string()) {
    s->prompt = p[0].get<std::string>();
  } else {
    return Bad("'prompt' must be a string (or an array of one string)");
  }
  if (s->prompt->empty()) return Bad("'prompt' is empty");
  return absl::OkStatus();
}

absl::Status ParseStop(const Json& j, const ProtocolLimits& limits, SubmitMessage* s) {
  if (!j.contains("stop") || j["stop"].is_null()) return absl::OkStatus();
  const Json& st = j["stop"];
  std::vector<std::string> stops;
  if (st.is_string()) {
    stops.push_back(st.get<std::string>());
  } else if (st.is_array() && st.size() <= limits.max_stop_strings) {
    for (const Json& e : st) {
      if (!e.is_string()) return Bad("'stop' entries must be strings");
      stops.push_back(e.get<std::string>());
    }
  } else {
    return Bad(absl::StrCat("'stop' must be a string or an array of at most ",
                            limits.max_stop_strings, " strings"));
  }
  for (const std::string& e : stops) {
    if (e.empty() || e.size() > limits.max_stop_bytes) {
      return Bad(absl::StrCat("'stop' entries must be 1..", limits.max_stop_bytes, " bytes"));
    }
  }
  s->stop = std::move(stops);
  return absl::OkStatus();
}

Json Usage(const RequestStats& st) {
  return {{"prompt_tokens", st.prompt_tokens},
          {"completion_tokens", st.completion_tokens},
          {"total_tokens", st.prompt_tokens + st.completion_tokens},
          {"prompt_tokens_details", {{"cached_tokens", st.cached_tokens}}}};
}

bool IsChat(const OpenAiRequest& r) { return r.endpoint == OpenAiEndpoint::kChatCompletions; }

Json Envelope(const OpenAiRequest& r, const std::string& id, int64_t created, bool chunk) {
  const char* object =
      IsChat(r) ? (chunk ? "chat.completion.chunk" : "chat.completion") : "text_completion";
  return {{"id", id}, {"object", object}, {"created", created}, {"model", r.model}};
}

}  // namespace

absl::StatusOr<std::vector<ChatMessage>> ParseChatMessages(std::string_view json,
                                                           size_t max_messages) {
  const Json j = Json::parse(json, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return Bad("'messages' is not valid JSON");
  return MessagesOf(j, max_messages);
}

absl::StatusOr<OpenAiRequest> ParseOpenAiRequest(OpenAiEndpoint endpoint, const std::string& body,
                                                 const ProtocolLimits& limits,
                                                 std::span<const std::string> served_models) {
  Json j = Json::parse(body, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded() || !j.is_object()) {
    return RequestErrorStatus(RequestError::kBadJson,
                              "the body is not a JSON object (malformed JSON)");
  }
  OpenAiRequest r;
  r.endpoint = endpoint;
  SubmitMessage& s = r.submit;
  static const char* const kUnsupported[] = {"logprobs",
                                             "top_logprobs",
                                             "tools",
                                             "tool_choice",
                                             "functions",
                                             "function_call",
                                             "response_format",
                                             "logit_bias",
                                             "suffix",
                                             "echo",
                                             "best_of",
                                             "presence_penalty",
                                             "frequency_penalty",
                                             "audio",
                                             "modalities",
                                             "prediction"};
  for (const char* key : kUnsupported) {
    if (j.contains(key) && !IsOff(key, j[key])) {
      return Bad(absl::StrCat("'", key, "' is not supported by specnode"));
    }
  }
  if (j.contains("model") && !j["model"].is_null()) {
    if (!j["model"].is_string()) return Bad("'model' must be a string");
    r.model = j["model"].get<std::string>();
    if (!r.model.empty() &&
        std::find(served_models.begin(), served_models.end(), r.model) == served_models.end()) {
      return RequestErrorStatus(
          RequestError::kUnknownModel,
          absl::StrCat("the model '", r.model, "' does not exist; this node serves '",
                       absl::StrJoin(served_models, "', '"), "'"));
    }
  }
  if (r.model.empty()) r.model = served_models.front();
  int64_t n = 1;
  if (absl::Status st = Integer(j, "n", INT64_MIN, INT64_MAX, &n); !st.ok()) return st;
  if (n != 1) return Bad("only n = 1 is supported");
  absl::Status st = IsChat(r) ? ParseMessages(j, limits, &s) : ParsePrompt(j, &s);
  if (!st.ok()) return st;
  // max_completion_tokens is the chat API's newer name; either is accepted, the newer wins.
  s.max_tokens = 16;  // OpenAI's completions default
  r.max_tokens_fill =
      IsChat(r) && !(j.contains("max_tokens") && !j["max_tokens"].is_null()) &&
      !(j.contains("max_completion_tokens") && !j["max_completion_tokens"].is_null());
  for (const char* key : {"max_tokens", "max_completion_tokens"}) {
    if (absl::Status e = Integer(j, key, INT64_MIN, INT64_MAX, &s.max_tokens); !e.ok()) return e;
  }
  double temperature = 1.0, top_p = 1.0;
  int64_t top_k = 0, seed = 0;
  if (absl::Status e = Number(j, "temperature", &temperature); !e.ok()) return e;
  if (absl::Status e = Number(j, "top_p", &top_p); !e.ok()) return e;
  // vLLM's extension; -1 means off there, as 0 does here.
  if (absl::Status e = Integer(j, "top_k", -1, INT32_MAX, &top_k); !e.ok()) return e;
  // Without a seed every request samples afresh (as OpenAI and vLLM do); the ZeroMQ
  // protocol's default seed 0 would give identical samples to identical requests.
  if (!j.contains("seed") || j["seed"].is_null()) {
    thread_local std::mt19937_64 rng{std::random_device{}()};
    seed = static_cast<int64_t>(rng() >> 1);
  }
  if (absl::Status e = Integer(j, "seed", INT64_MIN, INT64_MAX, &seed); !e.ok()) return e;
  s.sampling.temperature = static_cast<float>(temperature);
  s.sampling.top_p = static_cast<float>(top_p);
  s.sampling.top_k = top_k < 0 ? 0 : static_cast<int>(top_k);
  s.sampling.seed = static_cast<uint64_t>(seed);
  if (absl::Status e = ParseStop(j, limits, &s); !e.ok()) return e;
  if (absl::Status e = OptionalString(j, "domain", &s.domain); !e.ok()) return e;
  std::optional<std::string> sla;
  if (absl::Status e = OptionalString(j, "sla", &sla); !e.ok()) return e;
  s.sla = sla.value_or("");
  s.stream = false;
  if (j.contains("stream") && !j["stream"].is_null()) {
    if (!j["stream"].is_boolean()) return Bad("'stream' must be a boolean");
    s.stream = j["stream"].get<bool>();
  }
  if (j.contains("stream_options") && !j["stream_options"].is_null()) {
    const Json& so = j["stream_options"];
    if (!so.is_object()) return Bad("'stream_options' must be an object");
    if (!s.stream) return Bad("'stream_options' is only allowed with stream = true");
    if (so.contains("include_usage")) {
      if (!so["include_usage"].is_boolean()) {
        return Bad("'stream_options.include_usage' must be a boolean");
      }
      r.include_usage = so["include_usage"].get<bool>();
    }
  }
  return r;
}

const char* OpenAiFinishReason(FinishKind finish) {
  return finish == FinishKind::kLength ? "length" : "stop";
}

std::string OpenAiResponse(const OpenAiRequest& r, const std::string& id, int64_t created,
                           const std::string& text, FinishKind finish, const RequestStats& stats) {
  Json j = Envelope(r, id, created, false);
  Json choice = {
      {"index", 0}, {"finish_reason", OpenAiFinishReason(finish)}, {"logprobs", nullptr}};
  if (IsChat(r)) {
    choice["message"] = {{"role", "assistant"}, {"content", text}};
  } else {
    choice["text"] = text;
  }
  j["choices"] = Json::array({choice});
  j["usage"] = Usage(stats);
  j["specnode"] = RequestStatsJson(stats);
  return Dump(j);
}

std::string OpenAiChunk(const OpenAiRequest& r, const std::string& id, int64_t created,
                        const std::string& text, bool first, std::optional<FinishKind> finish) {
  Json j = Envelope(r, id, created, true);
  Json choice = {{"index", 0}, {"logprobs", nullptr}};
  choice["finish_reason"] = finish ? Json(OpenAiFinishReason(*finish)) : Json(nullptr);
  if (IsChat(r)) {
    Json delta = Json::object();
    if (first) delta["role"] = "assistant";
    if (!text.empty() || (first && !finish)) delta["content"] = text;
    choice["delta"] = delta;
  } else {
    choice["text"] = text;
  }
  j["choices"] = Json::array({choice});
  return Dump(j);
}

std::string OpenAiUsageChunk(const OpenAiRequest& r, const std::string& id, int64_t created,
                             const RequestStats& stats) {
  Json j = Envelope(r, id, created, true);
  j["choices"] = Json::array();
  j["usage"] = Usage(stats);
  j["specnode"] = RequestStatsJson(stats);
  return Dump(j);
}

std::string OpenAiModelList(std::span<const std::string> models, int64_t created,
                            int64_t max_model_len) {
  Json data = Json::array();
  for (const std::string& name : models) {
    data.push_back({{"id", name},
                    {"object", "model"},
                    {"created", created},
                    {"owned_by", "specnode"},
                    {"max_model_len", max_model_len}});
  }
  return Dump({{"object", "list"}, {"data", data}});
}

std::string OpenAiError(RequestError code, const std::string& message) {
  const RequestErrorInfo& info = RequestErrorInfoOf(code);
  const char* type = info.http >= 500   ? "server_error"
                     : info.http == 401 ? "authentication_error"
                     : info.http == 429 ? "rate_limit_error"
                                        : "invalid_request_error";
  return Dump({{"error",
                {{"message", std::string(message)},
                 {"type", type},
                 {"code", info.wire},
                 {"param", nullptr}}}});
}

}  // namespace specnode
