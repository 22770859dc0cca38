// Private to kvstore/: the KV manager's page and sequence records and helpers shared by its
// implementation files (kv_store.cc, kv_store_sharing.cc).
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <vector>

#include "kvstore/kv_store.h"

namespace specnode {

// The manager's record of a page (its storage is the pool's, under the same id).
struct KvStore::Page {
  KvPrecision prec = KvPrecision::kFull;
  int32_t ref = 0;   // sequences using any slot + 1 if the prefix cache holds it
  int32_t used = 0;  // slots handed out (a prefix of [0, page_tokens))
  bool cached = false;
};

struct KvStore::Sequence {
  int32_t length = 0;           // committed positions
  std::vector<Loc> loc;         // block table: per position with storage (>= length after Reserve)
  std::array<int32_t, kNumKvPrecisions> open{-1, -1, -1, -1};  // page being filled, per class
  std::unordered_map<int32_t, int32_t> live;  // page -> slots of this sequence in it
  // Attention mass, per kv head and position: Σ (weight * n_ctx) and observation count,
  // of the settled observations (queries at committed positions).
  std::vector<std::vector<float>> mass_sum, mass_cnt;
  // Observations of queries since the last Settle, in position order: one row per query
  // (KvMassRow's layout: [n_kv_heads, width] for keys [lo, lo + width)). Truncate drops the
  // rows of rolled-back queries; Settle adds the rest to mass_sum / mass_cnt.
  // row >= 0: a draft-tree row's, unresolved until KeepRows keeps (row = -1) or drops it;
  // Settle skips such rows and Truncate drops them.
  struct StagedMass {
    int32_t pos = 0, lo = 0, width = 0;
    int32_t row = -1;
    std::vector<float> sum, cnt;
  };
  std::vector<StagedMass> staged;
  int32_t demoted_upto = 0;  // positions below have been considered for demotion
  int32_t evicted_upto = 0;
  int64_t pending_bytes = 0;  // reserved for the demotions of the next Settle
  // Swap tier: per position the class (or 255 = evicted) and the slot's bytes (the pool's
  // ReadSlot layout).
  bool swapped = false;
  std::vector<uint8_t> host_class;
  std::vector<uint8_t> host_rows;
};

namespace kvstore_internal {

// Marks an evicted position in a swapped-out sequence's class list.
inline constexpr uint8_t kEvictedClass = 255;

// 64-bit hash mixing step (prefix-cache keys).
inline uint64_t Mix(uint64_t h, uint64_t v) {
  h ^= v + 0x9e3779b97f4a7c15ULL + (h << 6) + (h >> 2);
  h ^= h >> 31;
  h *= 0xbf58476d1ce4e5b9ULL;
  return h ^ (h >> 29);
}

// A prefix-cache hash as KV events carry it: the top bit cleared, so that decoders reading
// msgpack integers as signed and unsigned see the same number (kv_cache_events.h).
inline uint64_t EventHash(uint64_t h) { return h & 0x7fffffffffffffffULL; }

// Where a pool's pages live, in vLLM's words: "GPU" for device memory, "CPU" for host.
inline const char* EventMedium(const Device& device) { return device.is_cpu() ? "CPU" : "GPU"; }

}  // namespace kvstore_internal
}  // namespace specnode
