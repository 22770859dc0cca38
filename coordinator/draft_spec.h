// DraftSpec: the drafter a user names (--draft, `speculation.draft`), parsed once where it
// is read into a typed value:
//   none            no speculation
//   ngram | ngram:N prompt lookup with suffixes of up to N tokens (default 4)
//   suffix | suffix:N  frequency-ranked suffix drafting (coordinator/suffix_drafter.h) with
//                   suffixes of up to N tokens (default 8)
//   recycle | recycle:N  token recycling (coordinator/recycling_drafter.h): trees from the
//                   target's own top-N candidates after each token (default 8)
//   self:L          the target's first L layers + its head (self-speculation)
//   PATH            a Llama-family draft GGUF sharing the target's vocabulary
// drafter_factory.h builds the drafter from it.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace specnode {

struct DraftSpec {
  enum class Kind : uint8_t { kNone, kNgram, kSelf, kModel, kSuffix, kRecycle };
  Kind kind = Kind::kNgram;
  // ngram, suffix: longest suffix (0: the drafter's default); recycle: candidates kept per
  // token (0: the default); self: layers (>= 1)
  int count = 0;
  std::string path;  // kModel: the draft GGUF

  static DraftSpec None() { return {Kind::kNone, 0, {}}; }
  bool none() const { return kind == Kind::kNone; }
  // A draft model file (drafts on its own rank or a GPU); the others run inside the
  // coordinator, on the CPU.
  bool is_model() const { return kind == Kind::kModel; }
  // Drafts without a model (ngram, suffix, recycle): no weights, no KV, cheap to run
  // anywhere — inside the coordinator.
  bool is_lookup() const {
    return kind == Kind::kNgram || kind == Kind::kSuffix || kind == Kind::kRecycle;
  }
  // The spec's text, as ParseDraftSpec reads it back: "none", "ngram", "ngram:3",
  // "suffix", "suffix:12", "recycle", "recycle:4", "self:20", the path.
  std::string text() const;
  bool operator==(const DraftSpec&) const = default;
};

// InvalidArgument quoting the text for an empty spec or a bad count
// (`draft spec "self:x": expected a positive integer after ':'`).
absl::StatusOr<DraftSpec> ParseDraftSpec(std::string_view text);

}  // namespace specnode
