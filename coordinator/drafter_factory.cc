#include "coordinator/drafter_factory.h"

#include <algorithm>

#include "absl/strings/str_cat.h"

#include "coordinator/model_drafter.h"
#include "coordinator/ngram_drafter.h"
#include "coordinator/recycling_drafter.h"
#include "coordinator/suffix_drafter.h"

namespace specnode {

namespace {

// A lookup drafter with the spec's count as its longest suffix (the shorter limits clamped
// below it) over its default options.
template <typename D, typename Options>
absl::StatusOr<std::unique_ptr<Drafter>> Lookup(const DraftSpec& spec, Options options) {
  if (spec.count > 0) {
    options.max_n = spec.count;
    options.min_n = std::min(options.min_n, options.max_n);
    options.history_min_n = std::clamp(options.history_min_n, options.min_n, options.max_n);
  }
  auto d = D::Create(options);
  if (!d.ok()) return d.status();
  return std::unique_ptr<Drafter>(std::move(d).value());
}

}  // namespace

absl::StatusOr<std::unique_ptr<Drafter>> MakeLookupDrafter(const DraftSpec& spec) {
  if (spec.kind == DraftSpec::Kind::kNgram)
    return Lookup<NgramDrafter>(spec, NgramDrafterOptions{});
  if (spec.kind == DraftSpec::Kind::kSuffix) {
    return Lookup<SuffixDrafter>(spec, SuffixDrafterOptions{});
  }
  if (spec.kind == DraftSpec::Kind::kRecycle) {
    RecyclingDrafterOptions options;
    if (spec.count > 0) {
      options.top_k = spec.count;
      options.branch = std::min(options.branch, options.top_k);
    }
    auto d = RecyclingDrafter::Create(options);
    if (!d.ok()) return d.status();
    return std::unique_ptr<Drafter>(std::move(d).value());
  }
  return absl::InvalidArgumentError(absl::StrCat(
      "draft spec ", spec.text(), " is not a model-free drafter (ngram, suffix, recycle)"));
}

absl::StatusOr<std::unique_ptr<Drafter>> MakeDrafter(const DraftSpec& spec,
                                                     const LlamaModel& target, ThreadPool* pool,
                                                     const KvOptions& kv) {
  switch (spec.kind) {
    case DraftSpec::Kind::kNone:
      return absl::InvalidArgumentError("draft spec none: no drafter to build");
    case DraftSpec::Kind::kNgram:
    case DraftSpec::Kind::kSuffix:
    case DraftSpec::Kind::kRecycle:
      return MakeLookupDrafter(spec);
    case DraftSpec::Kind::kSelf: {
      auto d = ModelDrafter::SelfDraft(target, spec.count, pool, kv);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Drafter>(std::move(d).value());
    }
    case DraftSpec::Kind::kModel: {
      auto d = ModelDrafter::Load(spec.path, target, pool, kv);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Drafter>(std::move(d).value());
    }
  }
  return absl::InternalError("unknown draft spec kind");
}

}  // namespace specnode
