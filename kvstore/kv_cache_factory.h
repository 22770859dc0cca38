// Builds the KvCache a model runs with, from user-facing options (CLI flags, YAML later).
#pragma once

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "kvstore/kv_store.h"
#include "model/kv_cache.h"
#include "model/llama_config.h"

namespace specnode {

struct KvCacheOptions {
  // "dense": the f32 reference cache (model/dense_kv_cache.h); "full", "int8", "int4",
  // "mixed": a KvStore in that mode (kv_store.h).
  std::string mode = "mixed";
  int64_t capacity_bytes = int64_t{1} << 30;
  int64_t host_capacity_bytes = int64_t{4} << 30;
  // Mixed-mode defaults tuned with `specnode kv-eval` on tests/data/kv-eval (SmolLM2-135M,
  // see docs/kvstore.md): 8-token pages waste fewer bytes in partly used pages than 16,
  // and threshold 4 keeps ~5% of tokens INT8, the most that stays >= 3x below f16.
  int page_tokens = 8;
  int sink_tokens = 4;
  int window_tokens = 64;
  float critical_threshold = 4.0f;
  int mass_sample_every = 4;
  bool evict = false;
  int evict_window = 1024;
  bool rotate = true;
};

// n_kv_heads: the kv heads this process holds (a tensor-parallel shard's). InvalidArgument
// naming the option on bad values.
absl::StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const LlamaConfig& config, int n_kv_heads,
                                                     const KvCacheOptions& options);

}  // namespace specnode
