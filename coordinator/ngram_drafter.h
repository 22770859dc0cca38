// Prompt-lookup drafting (n-gram): finds the most recent earlier occurrence of the
// context's last n tokens (n from max_n down to min_n) and proposes the tokens that
// followed it. Free to run (no model), strong where the output copies its input
// (summaries, code edits, quoting), useless elsewhere. Deterministic: q is one-hot on each
// drafted token, so proposals carry no q rows.
#pragma once

#include <string>

#include "absl/status/statusor.h"
#include "coordinator/drafter.h"

namespace specnode {

struct NgramDrafterOptions {
  int max_n = 4;  // longest suffix tried
  int min_n = 2;  // shortest suffix accepted (1 drafts after any repeated token)
  // Only the last max_lookback tokens are searched (bounds the cost on long contexts).
  int max_lookback = 4096;
};

class NgramDrafter final : public Drafter {
 public:
  // InvalidArgument unless 1 <= min_n <= max_n <= 64 and max_lookback >= 1.
  static absl::StatusOr<std::unique_ptr<NgramDrafter>> Create(const NgramDrafterOptions& options);

  std::string name() const override;
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;
  void Free(SeqId seq) override {}

  // The proposal for one context (exposed for tests): up to k tokens.
  std::vector<int32_t> Lookup(std::span<const int32_t> context, int k) const;

 private:
  explicit NgramDrafter(const NgramDrafterOptions& options) : options_(options) {}
  NgramDrafterOptions options_;
};

}  // namespace specnode
