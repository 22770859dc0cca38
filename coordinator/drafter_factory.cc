#include "coordinator/drafter_factory.h"

#include <algorithm>

#include "coordinator/model_drafter.h"
#include "coordinator/ngram_drafter.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<Drafter>> MakeDrafter(const DraftSpec& spec,
                                                     const LlamaModel& target, ThreadPool* pool,
                                                     const KvOptions& kv) {
  switch (spec.kind) {
    case DraftSpec::Kind::kNone:
      return absl::InvalidArgumentError("draft spec none: no drafter to build");
    case DraftSpec::Kind::kNgram: {
      NgramDrafterOptions options;
      if (spec.count > 0) {
        options.max_n = spec.count;
        options.min_n = std::min(options.min_n, options.max_n);
        options.history_min_n = std::clamp(options.history_min_n, options.min_n, options.max_n);
      }
      auto d = NgramDrafter::Create(options);
      if (!d.ok()) return d.status();
      return std::unique_ptr<Drafter>(std::move(d).value());
    }
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
