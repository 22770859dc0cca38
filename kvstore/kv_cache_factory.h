// Builds the CPU KvCache a model runs with from the user's KV options (kv_options.h):
// the paged store (kv_store.h) over host pages, or the f32 reference cache for mode dense.
#pragma once

#include <memory>

#include "absl/status/statusor.h"
#include "kvstore/kv_options.h"
#include "kvstore/kv_store.h"
#include "model/llama/kv_cache.h"
#include "model/llama/llama_config.h"

namespace specnode {

// The store's config for `model` with `options`: geometry from the model, n_kv_heads the
// kv heads this process holds (a tensor-parallel shard's).
KvStoreConfig KvStoreConfigFor(const LlamaConfig& model, int n_kv_heads, const KvOptions& options);

// InvalidArgument naming the option on bad values.
absl::StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const LlamaConfig& config, int n_kv_heads,
                                                     const KvOptions& options);

}  // namespace specnode
