// Builds a Drafter from its user-facing spec (CLI --draft, YAML `draft:`):
//   ngram | ngram:N        prompt lookup with suffixes of up to N tokens (default 4)
//   self:L                 the target's first L layers + its head (self-speculation)
//   PATH.gguf              a Llama-family draft model sharing the target's vocabulary
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/drafter.h"
#include "kvstore/kv_options.h"
#include "model/llama_model.h"
#include "model/thread_pool.h"

namespace specnode {

// InvalidArgument for a malformed spec (naming it), load errors for a bad file. `target`
// and `pool` must outlive the drafter; kv configures a draft model's own cache.
absl::StatusOr<std::unique_ptr<Drafter>> MakeDrafter(const std::string& spec,
                                                     const LlamaModel& target, ThreadPool* pool,
                                                     const KvOptions& kv);

}  // namespace specnode
