// Helpers shared by the kvstore tests: feed random K/V through the KvCache pass protocol
// (Reserve, BeginPass, Write per layer, Commit) and query attention without adding tokens
// (a pass over the last committed position that only attends).
#pragma once

#include <random>
#include <vector>

#include "kvstore/kv_store.h"

namespace specnode::kvtest {

inline KvStoreConfig SmallConfig(KvMode mode) {
  KvStoreConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.head_dim = 16;
  c.gqa_group = 2;
  c.max_seq_len = 4096;
  c.page_tokens = 8;
  c.capacity_bytes = 64 << 20;
  c.host_capacity_bytes = 64 << 20;
  c.mode = mode;
  c.sink_tokens = 2;
  c.window_tokens = 8;
  c.critical_threshold = 1.5f;
  c.mass_sample_every = 1;
  // Demotion at every length (the window moves per token), as the tests that count
  // classes expect; the determinism tests use a coarser boundary.
  c.demote_every = 1;
  return c;
}

// Reserve + Write (every layer) + Commit of n tokens with seeded random K/V. Returns the
// Reserve status (nothing written on failure). kv_out receives the values when non-null:
// [n][layer][2][n_kv_heads * head_dim].
inline absl::Status Feed(KvCache& cache, const KvStoreConfig& c, SeqId seq, int n,
                         std::mt19937& gen, std::vector<float>* kv_out = nullptr) {
  const int32_t pos0 = cache.Length(seq);
  absl::Status s = cache.Reserve(seq, n);
  if (!s.ok()) return s;
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const size_t row = static_cast<size_t>(c.n_kv_heads) * c.head_dim;
  std::vector<float> k(n * row), v(n * row);
  const KvPassEntry entry{seq, pos0, n};
  s = cache.BeginPass({&entry, 1}, nullptr);
  if (!s.ok()) return s;
  for (int l = 0; l < c.n_layers; ++l) {
    for (float& x : k) x = dist(gen);
    for (float& x : v) x = dist(gen);
    s = cache.Write(l, k.data(), v.data());
    if (!s.ok()) return s;
    if (kv_out != nullptr) {
      kv_out->insert(kv_out->end(), k.begin(), k.end());
      kv_out->insert(kv_out->end(), v.begin(), v.end());
    }
  }
  cache.Commit(seq, pos0 + n);
  return absl::OkStatus();
}

// Demotion and eviction run when the store settles a sequence (at its next Reserve,
// Truncate, SwapOut or Fork); a truncation to the committed length settles and changes
// nothing else.
inline void SettleNow(KvCache& cache, SeqId seq) { (void)cache.Truncate(seq, cache.Length(seq)); }

// Output of one query (deterministic from q_seed) at the last committed position, for
// every layer and kv head: [layer][kv_head][group * head_dim]. window: KvCache::Attend's.
inline std::vector<float> Query(KvCache& cache, const KvStoreConfig& c, SeqId seq, uint32_t q_seed,
                                int32_t window = 0) {
  std::mt19937 gen(q_seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  const int n_heads = c.n_kv_heads * c.gqa_group;
  std::vector<float> q(static_cast<size_t>(n_heads) * c.head_dim), out(q.size()), all;
  for (float& x : q) x = dist(gen);
  const int32_t last = cache.Length(seq) - 1;
  // A pass over the committed last position: attention only, nothing written.
  const KvPassEntry entry{seq, last, 1};
  if (!cache.BeginPass({&entry, 1}, nullptr).ok()) return {};
  for (int l = 0; l < c.n_layers; ++l) {
    if (!cache.Attend(l, q.data(), 0.25f, window, out.data()).ok()) return {};
    for (int h = 0; h < c.n_kv_heads; ++h) {
      all.insert(all.end(), out.begin() + h * c.gqa_group * c.head_dim,
                 out.begin() + (h + 1) * c.gqa_group * c.head_dim);
    }
  }
  return all;
}

}  // namespace specnode::kvtest
