#include "node/session/workload.h"

#include <chrono>
#include <fstream>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "coordinator/domain_router.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"

namespace specnode {

namespace {

// A prompt line's "messages": [{"role": "user" | "assistant" | "system", "content": text}...].
absl::StatusOr<std::vector<ChatMessage>> ParseMessages(const nlohmann::json& j,
                                                       const std::string& file, int line_no) {
  std::vector<ChatMessage> out;
  if (j.is_array()) {
    for (const nlohmann::json& m : j) {
      if (!m.is_object() || !m.contains("role") || !m.contains("content") ||
          !m["role"].is_string() || !m["content"].is_string()) {
        break;
      }
      const std::string role = m["role"].get<std::string>();
      if (role != "user" && role != "assistant" && role != "system") break;
      out.push_back({role, m["content"].get<std::string>()});
    }
    if (!out.empty() && out.size() == j.size() && out.back().role == "user") return out;
  }
  return absl::InvalidArgumentError(absl::StrFormat(
      "%s:%d: \"messages\" must be a list of {\"role\": user|assistant|system, \"content\": "
      "string} ending with a user turn",
      file, line_no));
}

}  // namespace

absl::StatusOr<std::vector<WorkloadPrompt>> LoadPromptSets(const ModelSession& session,
                                                           const std::string& files, bool chat,
                                                           int64_t per_domain) {
  std::vector<WorkloadPrompt> out;
  std::map<std::string, int64_t> count;
  for (absl::string_view file : absl::StrSplit(files, ',', absl::SkipEmpty())) {
    std::ifstream in{std::string(file)};
    if (!in) {
      return absl::NotFoundError(absl::StrCat("cannot open prompt file ", std::string(file)));
    }
    std::string line;
    for (int line_no = 1; std::getline(in, line); ++line_no) {
      if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
      const nlohmann::json j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      if (j.is_discarded() || !j.is_object() || !j.contains("domain") || !j.contains("prompt") ||
          !j["domain"].is_string() || !j["prompt"].is_string()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s:%d: expected {\"domain\": string, \"prompt\": string}",
                            std::string(file), line_no));
      }
      WorkloadPrompt p;
      p.domain = j["domain"].get<std::string>();
      SPECNODE_RETURN_IF_ERROR(DomainRouter::ValidateDomainName(p.domain));
      if (count[p.domain] >= per_domain) continue;
      p.text = j["prompt"].get<std::string>();
      p.routed_domain = p.domain;
      if (j.contains("messages")) {
        // A conversation: every turn in the chat template (the last user turn is `prompt`,
        // which the router reads).
        SPECNODE_ASSIGN_OR_RETURN(std::vector<ChatMessage> messages,
                                  ParseMessages(j["messages"], std::string(file), line_no));
        if (!chat) {
          return absl::InvalidArgumentError(
              absl::StrFormat("%s:%d: \"messages\" needs the chat template (not --raw)",
                              std::string(file), line_no));
        }
        SPECNODE_ASSIGN_OR_RETURN(p.ids, session.EncodeChat(messages));
      } else {
        SPECNODE_ASSIGN_OR_RETURN(p.ids, session.EncodePrompt(p.text, chat));
      }
      ++count[p.domain];
      out.push_back(std::move(p));
    }
  }
  if (out.empty()) return absl::InvalidArgumentError("no prompts in " + files);
  return out;
}

absl::StatusOr<Generation> GenerateOne(SpeculativeEngine& engine, const WorkloadPrompt& p, SeqId id,
                                       const SamplingParams& sampling, int32_t max_tokens,
                                       bool ignore_eos, const ModelRunner* runner) {
  SpecRequest r;
  r.id = id;
  r.prompt = p.ids;
  r.sampling = sampling;
  r.max_new_tokens = max_tokens;
  r.domain = p.routed_domain;
  r.ignore_stop = ignore_eos;
  SPECNODE_RETURN_IF_ERROR(engine.Start(r));
  const SeqId ids[] = {id};
  std::vector<SeqStepResult> results;
  Generation g;
  using Clock = std::chrono::steady_clock;
  Clock::time_point decode_start;
  while (true) {
    const bool prefilling = engine.Prefilling(id);
    absl::Status s = engine.Step(ids, &results);
    if (!s.ok()) {
      engine.Finish(id);
      return s;
    }
    if (prefilling) decode_start = Clock::now();
    g.tokens.insert(g.tokens.end(), results[0].tokens.begin(), results[0].tokens.end());
    if (results[0].finish != FinishReason::kNone) break;
  }
  g.decode_s = std::chrono::duration<double>(Clock::now() - decode_start).count();
  g.stats = engine.Stats(id);
  g.group = engine.Group(id);
  if (runner != nullptr) {
    if (const auto m = runner->Memory()) g.kv_bytes = m->used_bytes;
    g.kv_positions = runner->Length(id);
  }
  engine.Finish(id);
  return g;
}

}  // namespace specnode
