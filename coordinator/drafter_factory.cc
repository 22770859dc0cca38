#include "coordinator/drafter_factory.h"

#include <algorithm>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "coordinator/model_drafter.h"
#include "coordinator/ngram_drafter.h"

namespace specnode {
namespace {

absl::StatusOr<int> ParseCount(const std::string& spec, const std::string& digits) {
  int value = 0;
  if (!absl::SimpleAtoi(digits, &value) || value < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("draft spec \"", spec, "\": expected a positive integer after ':'"));
  }
  return value;
}

}  // namespace

absl::StatusOr<std::unique_ptr<Drafter>> MakeDrafter(const std::string& spec,
                                                     const LlamaModel& target, ThreadPool* pool,
                                                     const KvOptions& kv) {
  if (spec == "ngram" || absl::StartsWith(spec, "ngram:")) {
    NgramDrafterOptions options;
    if (spec != "ngram") {
      auto n = ParseCount(spec, spec.substr(6));
      if (!n.ok()) return n.status();
      options.max_n = *n;
      options.min_n = std::min(options.min_n, options.max_n);
      options.history_min_n = std::clamp(options.history_min_n, options.min_n, options.max_n);
    }
    auto d = NgramDrafter::Create(options);
    if (!d.ok()) return d.status();
    return std::unique_ptr<Drafter>(std::move(d).value());
  }
  if (absl::StartsWith(spec, "self:")) {
    auto layers = ParseCount(spec, spec.substr(5));
    if (!layers.ok()) return layers.status();
    auto d = ModelDrafter::SelfDraft(target, *layers, pool, kv);
    if (!d.ok()) return d.status();
    return std::unique_ptr<Drafter>(std::move(d).value());
  }
  if (spec.empty()) return absl::InvalidArgumentError("empty draft spec");
  auto d = ModelDrafter::Load(spec, target, pool, kv);
  if (!d.ok()) return d.status();
  return std::unique_ptr<Drafter>(std::move(d).value());
}

}  // namespace specnode
