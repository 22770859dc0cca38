#include "kvstore/kv_cache_factory.h"

#include "absl/strings/str_cat.h"
#include "model/dense_kv_cache.h"
#include "model/status_macros.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const LlamaConfig& config, int n_kv_heads,
                                                     const KvCacheOptions& o) {
  if (o.capacity_bytes <= 0) return absl::InvalidArgumentError("KV capacity must be positive");
  if (o.mode == "dense") {
    const int64_t bytes_per_token =
        int64_t{2} * config.n_layers * n_kv_heads * config.head_dim * static_cast<int64_t>(sizeof(float));
    return std::make_unique<DenseKvCache>(config.n_layers, n_kv_heads, config.head_dim,
                                          config.gqa_group(), config.context_length,
                                          std::max<int64_t>(1, o.capacity_bytes / bytes_per_token));
  }
  SPECNODE_ASSIGN_OR_RETURN(KvMode mode, ParseKvMode(o.mode));
  KvStoreConfig c;
  c.n_layers = config.n_layers;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = config.head_dim;
  c.gqa_group = config.gqa_group();
  c.max_seq_len = config.context_length;
  c.page_tokens = o.page_tokens;
  c.capacity_bytes = o.capacity_bytes;
  c.host_capacity_bytes = o.host_capacity_bytes;
  c.mode = mode;
  c.sink_tokens = o.sink_tokens;
  c.window_tokens = o.window_tokens;
  c.critical_threshold = o.critical_threshold;
  c.mass_sample_every = o.mass_sample_every;
  c.evict = o.evict;
  c.evict_window = o.evict_window;
  c.rotate = o.rotate;
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> store, KvStore::Create(c));
  return std::unique_ptr<KvCache>(std::move(store));
}

}  // namespace specnode
