// Prompt-lookup drafting (n-gram), from two sources:
//   1. the sequence's own context: the most recent earlier occurrence of its last n tokens
//      (n from max_n down to min_n) and the tokens that followed it. Strong where the
//      output copies its input (code edits, quoting, summaries), free to run.
//   2. when the context has no match, the domain's history: the contexts (prompt + output)
//      of this drafter's finished sequences of the same domain, newest first, searched for
//      the last n tokens with n from max_n down to history_min_n through a hash index.
//      Requests of one domain repeat openings, boilerplate and phrasing across requests
//      (SuffixDecoding's observation); on SmolLM2 this raised the share of steps with a
//      proposal 2-3x, at lower acceptance, so history proposals are capped at
//      history_max_draft tokens.
// Deterministic: q is one-hot on each drafted token, so proposals carry no q rows.
//
// Memory: at most history_tokens tokens per domain (the oldest half is dropped when full)
// and history_domains domains (further domains share one overflow history).
// Not thread-safe (the engine calls drafters from its step loop only).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_map>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/drafter.h"

namespace specnode {

struct NgramDrafterOptions {
  int max_n = 4;  // longest suffix tried
  int min_n = 2;  // shortest suffix accepted in the own context (1 = any repeated token)
  // Only the last max_lookback tokens of the own context are searched.
  int max_lookback = 4096;
  // Domain history (0 tokens = off). history_min_n in [min_n, max_n].
  int history_tokens = 1 << 16;
  int history_min_n = 3;
  int history_max_draft = 2;
  int history_domains = 64;
};

class NgramDrafter final : public Drafter {
 public:
  // InvalidArgument unless 1 <= min_n <= max_n <= 64, max_lookback >= 1, history_tokens >=
  // 0, min_n <= history_min_n <= max_n, history_max_draft >= 1, history_domains >= 1.
  static absl::StatusOr<std::unique_ptr<NgramDrafter>> Create(const NgramDrafterOptions& options);

  std::string name() const override;
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;
  bool CheapToShadow() const override { return true; }
  // Moves the sequence's last seen context into its domain's history.
  void Free(SeqId seq) override;

  // The own-context proposal for one context (exposed for tests): up to k tokens.
  std::vector<int32_t> Lookup(std::span<const int32_t> context, int k) const;
  // The history proposal (exposed for tests): up to min(k, history_max_draft) tokens.
  std::vector<int32_t> LookupHistory(std::string_view domain, std::span<const int32_t> context,
                                     int k) const;
  // Tokens held for `domain` (tests, metrics).
  int64_t HistoryTokens(std::string_view domain) const;

 private:
  // One domain's finished contexts, concatenated with kSeparator between them, and for
  // each n in [history_min_n, max_n] a hash of n tokens -> the newest start position.
  struct History {
    std::vector<int32_t> tokens;
    std::vector<std::unordered_map<uint64_t, int64_t>> index;  // [n - history_min_n]
  };
  static constexpr int32_t kSeparator = -1;

  explicit NgramDrafter(const NgramDrafterOptions& options) : options_(options) {}
  History& HistoryFor(std::string_view domain);
  const History* FindHistory(std::string_view domain) const;
  void Append(History& h, std::span<const int32_t> context);
  void IndexFrom(History& h, int64_t begin);

  NgramDrafterOptions options_;
  std::map<std::string, History, std::less<>> histories_;
  struct Pending {
    std::string domain;
    std::vector<int32_t> context;
  };
  std::unordered_map<SeqId, Pending> pending_;  // last context seen per live sequence
};

}  // namespace specnode
