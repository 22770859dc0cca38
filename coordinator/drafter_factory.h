// Builds a Drafter from its parsed spec (draft_spec.h: CLI --draft, YAML
// `speculation.draft`): an n-gram prompt lookup, a suffix drafter, a self-draft of the
// target's first layers or a draft model file, on the CPU.
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/draft_spec.h"
#include "coordinator/drafter.h"
#include "kvstore/kv_options.h"
#include "model/llama/llama_model.h"
#include "model/cpu/thread_pool.h"

namespace specnode {

// InvalidArgument for spec none (no drafter) or bad values (naming them), load errors for a
// bad file. `target` and `pool` must outlive the drafter; kv configures a draft model's own
// cache.
// The drafters that need no model (DraftSpec::is_lookup: ngram, suffix) with the spec's
// count applied to their default options; InvalidArgument for any other kind or bad values.
// Serve's config check builds one to validate a spec before any weights load.
absl::StatusOr<std::unique_ptr<Drafter>> MakeLookupDrafter(const DraftSpec& spec);

absl::StatusOr<std::unique_ptr<Drafter>> MakeDrafter(const DraftSpec& spec,
                                                     const LlamaModel& target, ThreadPool* pool,
                                                     const KvOptions& kv);

}  // namespace specnode
