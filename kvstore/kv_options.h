// KvOptions: what a user chooses about the KV cache (the YAML `kv:` section, the --kv-*
// flags), as typed values. Parsed once at the edge (node/ config and flags) and carried
// as is into the store's config (KvStoreConfig derives from it): never re-read from text.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specnode {

// kAuto: the device's best — mixed where its page pool stores every class and copies slots
// (the CPU's and the GPU's pools), full elsewhere — resolved when the store is built
// (KvStore::ResolvedMode).
// kDense: the f32 reference cache (model/dense_kv_cache.h), CPU only. The others are the
// paged store (kv_store.h): every token in f16 (kFull), INT8 or INT4 from the start, or
// the per-token policy (kMixed: f16 sinks and recent window, older tokens INT8 when
// critical, INT2 when cold (cold_threshold > 0), else INT4). kInt2: every token INT2 (the
// uniform end of the frontier; far lossier than the others). An explicit mode a device cannot store
// is refused, never changed. kInt2 (the cold tier's class for every token) is last so that earlier
// values keep theirs.
enum class KvMode : uint8_t { kAuto, kDense, kFull, kInt8, kInt4, kMixed, kInt2 };
// "auto", "dense", "full", "int8", "int4", "mixed", "int2"
std::string_view KvModeName(KvMode m);
// InvalidArgument listing the names for anything else.
absl::StatusOr<KvMode> ParseKvMode(std::string_view name);

// What ranks tokens under a byte budget (KvOptions::budget_rank).
enum class KvBudgetRank : uint8_t { kMass, kRecency };
std::string_view KvBudgetRankName(KvBudgetRank r);  // "mass", "recency"
absl::StatusOr<KvBudgetRank> ParseKvBudgetRank(std::string_view name);

struct KvOptions {
  KvMode mode = KvMode::kAuto;
  int64_t capacity_bytes = int64_t{1} << 30;       // device pages (the primary tier)
  // kv.memory_utilization (--gpu-memory-utilization): in (0, 1], the KV cache takes what is
  // left of this fraction of the device's memory once the model is loaded (kv_budget.h;
  // the host's memory on the CPU), replacing capacity_bytes; 0 = capacity_bytes stands.
  double memory_utilization = 0.0;
  int64_t host_capacity_bytes = int64_t{4} << 30;  // swap tier; 0 = none (preemption recomputes)
  // Mixed-mode defaults tuned with `specnode kv-eval` on tests/data/kv-eval (SmolLM2-135M,
  // docs/kvstore.md): 8-token pages waste fewer bytes in partly used pages than 16, and
  // threshold 4 keeps ~5% of tokens INT8, the most that stays >= 3x below f16.
  int page_tokens = 8;
  int sink_tokens = 4;
  int window_tokens = 64;
  float critical_threshold = 4.0f;
  // Mixed mode: a token leaving the window whose attention mass (relative to a uniform
  // share, as critical_threshold) is below this goes to the INT2 cold tier instead of INT4.
  // 0 = no cold tier (the default: every class but INT2).
  float cold_threshold = 0.0f;
  // Mixed mode: a byte budget instead of the thresholds, in bytes per token (K and V rows
  // of every layer and kv head, what `specnode kv-eval` reports as KV B/token). At each
  // demotion boundary the store chooses every demotable token's class (int8, int4 or int2;
  // a token never moves up) by its attention mass so that the sequence's rows stay within
  // the budget until the next boundary, with the least expected error
  // (kvstore/kv_byte_budget.h) — demoting older tokens further as the sequence grows. The
  // sinks and the window stay f16; while they alone exceed it (short sequences) the
  // thresholds apply. 0 = off (the thresholds decide).
  int64_t bytes_per_token = 0;
  // What ranks tokens for the budget: their attention mass (the store's policy), or their
  // recency alone (newer tokens more precise: the recency tiers of vllm#49198, kept as
  // the comparison kv-eval's frontier measures at equal bytes).
  KvBudgetRank budget_rank = KvBudgetRank::kMass;
  int mass_sample_every = 4;
  // Mixed mode demotes when a sequence's committed length reaches a multiple of this many
  // tokens (those older than the window then), and a pass never holds rows of one sequence
  // on both sides of such a boundary (ModelRunner::PassBoundary): so every query sees the
  // same cache whether the sequence decoded, verified drafts or prefilled in chunks, and
  // the chunks of a long prefill or recompute each fit beside the demoted rest.
  int demote_every = 64;
  bool evict = false;  // sliding-window eviction with sinks (lossy)
  int evict_window = 1024;
  // Store K and V Hadamard-rotated (kv_precision.h). Unset: the device's default (the CPU
  // and GPU pools rotate when head_dim is a power of two; a pool that cannot rotate stores
  // them as they are). Set to true where the pool cannot: refused.
  std::optional<bool> rotate;
  // Prefix caching in serving (kv.prefix_cache): a new sequence starts from the longest run
  // of whole pages another sequence left with the same token ids (KvCache::MatchPrefix), and
  // a sequence's full-precision pages are published after its prefill and when it ends.
  // Off: every prompt is prefilled in full. (Mixed mode: the cached tokens' attention mass
  // starts afresh for the new sequence, so demotion there may differ from a cold start.)
  bool prefix_cache = true;

  // InvalidArgument naming the field (as `prefix` + field name, e.g. "kv.window_tokens")
  // for values out of range.
  absl::Status Validate(std::string_view prefix = "kv.") const;
};

}  // namespace specnode
