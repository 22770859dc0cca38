// Builds the KvCache a model runs with from the user's KV options (kv_options.h), for every
// device: the paged store (kv_store.h) over the device's page pool (host pages by default,
// a device's pool through `make_pool`: runtime/runner_factory.cc passes the GPU's), or the
// f32 reference cache for mode dense (host only).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>

#include "absl/status/statusor.h"
#include "kvstore/kv_options.h"
#include "kvstore/kv_store.h"
#include "model/llama/kv_cache.h"
#include "model/llama/llama_config.h"
#include "model/llama/llama_weights.h"

namespace specnode {

// The store's config for `model` with `options`: geometry from the model, `heads` the kv
// heads this process holds and their query heads (a tensor-parallel shard's:
// LlamaWeights::kv_heads_held).
KvStoreConfig KvStoreConfigFor(const LlamaConfig& model, KvHeadsHeld heads,
                               const KvOptions& options);

// Makes the page pool of a store: its geometry, capacity in bytes and rotation request.
using KvPoolMaker = std::function<absl::StatusOr<std::unique_ptr<KvPagePool>>(
    const KvPoolGeometry& geometry, int64_t capacity_bytes, std::optional<bool> rotate)>;

// A store over host pages (CpuPagePool): KvStore::Create's errors (CheckGeometry first).
absl::StatusOr<std::unique_ptr<KvStore>> MakeHostKvStore(
    const KvStoreConfig& config, KvStore::OptionsChecked checked = KvStore::OptionsChecked::kNo);

// InvalidArgument naming the option on bad values. `make_pool` null: host pages
// (CpuPagePool); else the store's pages live in the pool it makes (mode dense refused).
// `checked` kYes: the caller validated `options` against the device already (the runner
// factory's CheckRunnerOptions), so they are not checked again.
absl::StatusOr<std::unique_ptr<KvCache>> MakeKvCache(
    const LlamaConfig& config, KvHeadsHeld heads, const KvOptions& options,
    const KvPoolMaker& make_pool = nullptr,
    KvStore::OptionsChecked checked = KvStore::OptionsChecked::kNo);

}  // namespace specnode
