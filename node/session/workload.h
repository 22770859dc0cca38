// Benchmark workloads shared by `spec-bench` and `tune`: prompt sets (JSONL files of
// {"domain": D, "prompt": TEXT}) and one greedy-or-sampled generation through a
// SpeculativeEngine, timed the way both report it (decode time, the prefill excluded).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/spec_engine.h"
#include "node/session/model_session.h"

namespace specnode {

struct WorkloadPrompt {
  std::string domain;         // the set's label (results are grouped by it)
  std::string routed_domain;  // what the engine is told: the label, or a router's verdict
  std::string text;
  std::vector<int32_t> ids;  // encoded (chat template applied when asked)
};

// Reads comma-separated JSONL `files` ({"domain": D, "prompt": TEXT}, optionally with
// "messages": a conversation ending in a user turn, encoded whole in the chat template),
// keeping at most `per_domain` prompts per domain, in file order. InvalidArgument naming file:line
// for a malformed line or a bad domain name; NotFound for a missing file; InvalidArgument when no
// prompt is left.
absl::StatusOr<std::vector<WorkloadPrompt>> LoadPromptSets(const ModelSession& session,
                                                           const std::string& files, bool chat,
                                                           int64_t per_domain);

struct Generation {
  std::vector<int32_t> tokens;  // every generated token, the prefill's first one included
  double decode_s = 0;          // from the end of the prefill to the last token
  SpecSeqStats stats;
  int group = -1;  // the draft group the router chose (-1: none)
  // The target's KV bytes in use just before the sequence was freed (nullopt when the
  // runner cannot tell), and the positions cached then.
  std::optional<int64_t> kv_bytes;
  int32_t kv_positions = 0;
};

// Generates `p` as sequence `id` on `engine` (alone), then finishes the sequence.
// `runner`, when given, is asked for its KV memory before the sequence is freed.
absl::StatusOr<Generation> GenerateOne(SpeculativeEngine& engine, const WorkloadPrompt& p, SeqId id,
                                       const SamplingParams& sampling, int32_t max_tokens,
                                       bool ignore_eos, const ModelRunner* runner = nullptr);

}  // namespace specnode
