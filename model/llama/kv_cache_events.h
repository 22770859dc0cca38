// What a KV cache's prefix cache tells the world: a block of whole pages registered under
// its chained hash (stored), dropped from the cache (removed), or the whole cache emptied
// (cleared). The shape follows vLLM's KV events (BlockStored / BlockRemoved /
// AllBlocksCleared), which KV-aware routers (llm-d's precise prefix-cache scorer, Dynamo's
// KV router) consume; node/serve/kv_event_publisher.h puts them on the wire.
//
// Hashes. A block's hash chains its parent's: block b of a token sequence hashes (hash of
// block b - 1, the block's `block_size` token ids). A router that sees BlockStored for a run
// of blocks learns the run's hashes, its parent (the block before the run, or none for a
// run starting at token 0) and the run's token ids, block_size per block, in order.
// Hashes are 63-bit (the top bit clear) so that every msgpack decoder, signed or not,
// reads the same integer.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace specnode {

struct KvCacheEvent {
  enum class Kind { kBlockStored, kBlockRemoved, kAllBlocksCleared };
  Kind kind = Kind::kBlockStored;
  // kBlockStored: the run's blocks, first to last; kBlockRemoved: the blocks dropped (each
  // one independently; not necessarily a chain).
  std::vector<uint64_t> block_hashes;
  // kBlockStored: the hash of the block before the run; nullopt when the run starts at the
  // sequence's first token.
  std::optional<uint64_t> parent_block_hash;
  // kBlockStored: block_size x block_hashes.size() token ids, the run's, in order.
  std::vector<int32_t> token_ids;
  int32_t block_size = 0;  // kBlockStored: tokens per block (the cache's page_tokens)
  // Where the blocks live, as vLLM names it: "GPU" for device memory, "CPU" for host memory.
  std::string medium;
  bool operator==(const KvCacheEvent&) const = default;
};

// Receives a cache's events, in the order they happen, on the thread that drives the cache
// (the scheduler's step loop); must not block for long and must not call back into the
// cache. Implementations used across threads do their own locking.
class KvCacheEventListener {
 public:
  virtual ~KvCacheEventListener() = default;
  virtual void OnKvCacheEvent(KvCacheEvent event) = 0;
};

}  // namespace specnode
