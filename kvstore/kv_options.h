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
// critical, else INT4). An explicit mode a device cannot store is refused, never changed.
enum class KvMode : uint8_t { kAuto, kDense, kFull, kInt8, kInt4, kMixed };
std::string_view KvModeName(KvMode m);  // "auto", "dense", "full", "int8", "int4", "mixed"
// InvalidArgument listing the names for anything else.
absl::StatusOr<KvMode> ParseKvMode(std::string_view name);

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
