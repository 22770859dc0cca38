#include "kvstore/kv_cache_factory.h"

#include <algorithm>

#include "kvstore/cpu_page_pool.h"
#include "model/llama/dense_kv_cache.h"
#include "model/status_macros.h"

namespace specnode {

KvStoreConfig KvStoreConfigFor(const LlamaConfig& model, KvHeadsHeld heads,
                               const KvOptions& options) {
  KvStoreConfig c;
  static_cast<KvOptions&>(c) = options;
  c.n_layers = model.n_layers;
  c.n_kv_heads = heads.n_kv_heads;
  c.head_dim = model.head_dim;
  c.gqa_group = heads.gqa_group;
  c.max_seq_len = model.context_length;
  return c;
}

absl::StatusOr<std::unique_ptr<KvCache>> MakeKvCache(const LlamaConfig& config, KvHeadsHeld heads,
                                                     const KvOptions& o,
                                                     const KvPoolMaker& make_pool,
                                                     KvStore::OptionsChecked checked) {
  if (checked == KvStore::OptionsChecked::kNo) SPECNODE_RETURN_IF_ERROR(o.Validate());
  if (o.mode == KvMode::kDense) {
    if (make_pool != nullptr) {
      return absl::InvalidArgumentError("kv mode dense is the host's f32 reference cache");
    }
    const int64_t bytes_per_token = int64_t{2} * config.n_layers * heads.n_kv_heads *
                                    config.head_dim * static_cast<int64_t>(sizeof(float));
    return std::make_unique<DenseKvCache>(config.n_layers, heads.n_kv_heads, config.head_dim,
                                          heads.gqa_group, config.context_length,
                                          std::max<int64_t>(1, o.capacity_bytes / bytes_per_token));
  }
  const KvStoreConfig kc = KvStoreConfigFor(config, heads, o);
  std::unique_ptr<KvStore> store;
  if (make_pool == nullptr) {
    SPECNODE_ASSIGN_OR_RETURN(store, MakeHostKvStore(kc, checked));
  } else {
    SPECNODE_RETURN_IF_ERROR(KvStore::CheckGeometry(kc));  // before the device allocates
    const KvPoolGeometry g{kc.n_layers, kc.n_kv_heads, kc.head_dim, kc.gqa_group, kc.page_tokens};
    std::unique_ptr<KvPagePool> pool;
    SPECNODE_ASSIGN_OR_RETURN(pool, make_pool(g, kc.capacity_bytes, kc.rotate));
    SPECNODE_ASSIGN_OR_RETURN(store, KvStore::Create(kc, std::move(pool), checked));
  }
  return std::unique_ptr<KvCache>(std::move(store));
}

absl::StatusOr<std::unique_ptr<KvStore>> MakeHostKvStore(const KvStoreConfig& c,
                                                         KvStore::OptionsChecked checked) {
  SPECNODE_RETURN_IF_ERROR(KvStore::CheckGeometry(c));  // CpuPagePool asserts a sound geometry
  const KvPoolGeometry g{c.n_layers, c.n_kv_heads, c.head_dim, c.gqa_group, c.page_tokens};
  return KvStore::Create(c, std::make_unique<CpuPagePool>(g, c.rotate.value_or(true)), checked);
}

}  // namespace specnode
