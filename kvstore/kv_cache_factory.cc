#include "kvstore/kv_cache_factory.h"

#include <algorithm>

#include "model/llama/dense_kv_cache.h"
#include "model/status_macros.h"

namespace specnode {

KvStoreConfig KvStoreConfigFor(const LlamaConfig& model, int n_kv_heads, const KvOptions& options) {
  KvStoreConfig c;
  static_cast<KvOptions&>(c) = options;
  c.n_layers = model.n_layers;
  c.n_kv_heads = n_kv_heads;
  c.head_dim = model.head_dim;
  c.gqa_group = model.gqa_group();
  c.max_seq_len = model.context_length;
  return c;
}

absl::StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const LlamaConfig& config, int n_kv_heads,
                                                     const KvOptions& o,
                                                     const KvPoolMaker& make_pool) {
  SPECNODE_RETURN_IF_ERROR(o.Validate());
  if (make_pool != nullptr) {
    if (o.mode == KvMode::kDense) {
      return absl::InvalidArgumentError("kv mode dense is the host's f32 reference cache");
    }
    const KvStoreConfig kc = KvStoreConfigFor(config, n_kv_heads, o);
    const KvPoolGeometry g{kc.n_layers, kc.n_kv_heads, kc.head_dim, kc.gqa_group, kc.page_tokens};
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<KvPagePool> pool,
                              make_pool(g, kc.capacity_bytes, kc.rotate));
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> store, KvStore::Create(kc, std::move(pool)));
    return std::unique_ptr<KvCache>(std::move(store));
  }
  if (o.mode == KvMode::kDense) {
    const int64_t bytes_per_token = int64_t{2} * config.n_layers * n_kv_heads * config.head_dim *
                                    static_cast<int64_t>(sizeof(float));
    return std::make_unique<DenseKvCache>(config.n_layers, n_kv_heads, config.head_dim,
                                          config.gqa_group(), config.context_length,
                                          std::max<int64_t>(1, o.capacity_bytes / bytes_per_token));
  }
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<KvStore> store,
                            KvStore::Create(KvStoreConfigFor(config, n_kv_heads, o)));
  return std::unique_ptr<KvCache>(std::move(store));
}

}  // namespace specnode
