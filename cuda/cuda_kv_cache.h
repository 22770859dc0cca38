// CudaKvCache: the KV cache of one model on one GPU — f16 K/V pools in device memory, split
// into pages of `page_tokens` token rows, and the host bookkeeping of which pages each
// sequence owns. The same Reserve / Commit / Truncate / Free life cycle as model/kv_cache.h
// (a failed forward pass leaves every sequence as it was), without the CPU store's mixed
// precision: every token is kept in f16 (the "full" mode of kvstore/).
//
// Pool layout and addressing: cuda_attention.h. Pages are handed out lowest id first from a
// free list; a sequence's page list grows as it does and shrinks on Truncate.
//
// Not thread-safe: the forward pass that owns it drives it. Create() with the intended device
// current; the pools are freed with the cache.
#pragma once

#include <cstdint>
#include <memory>
#include <unordered_map>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "cuda/device_buffer.h"
#include "model/kv_cache.h"

namespace specnode {

struct CudaKvCacheOptions {
  int n_layers = 0;
  int n_kv_heads = 0;  // on this device (a tensor-parallel shard's share)
  int head_dim = 0;
  int context_length = 0;          // longest sequence
  int64_t capacity_bytes = 1 << 30;  // K + V pools of every layer together
  int page_tokens = 16;
};

class CudaKvCache {
 public:
  // InvalidArgument for bad geometry or a capacity below one page per layer; Internal when
  // the device allocation fails.
  static absl::StatusOr<std::unique_ptr<CudaKvCache>> Create(const CudaKvCacheOptions& options);

  int32_t Length(SeqId seq) const;
  // Makes room for `count` more tokens after the committed length (pages from the free
  // list). InvalidArgument past the context length, ResourceExhausted when the pool has too
  // few free pages; in both cases nothing changes.
  absl::Status Reserve(SeqId seq, int32_t count);
  // The tokens up to `length` are written: it becomes the sequence's length.
  void Commit(SeqId seq, int32_t length);
  // Drops positions [n, Length(seq)) and returns the pages no longer needed.
  // InvalidArgument when n > Length(seq).
  absl::Status Truncate(SeqId seq, int32_t n);
  void Free(SeqId seq);

  // Pool row of position `pos` of `seq` (reserved or committed).
  int32_t RowOf(SeqId seq, int32_t pos) const;
  // The sequence's page ids in position order (empty for an unknown sequence).
  const std::vector<int32_t>& Pages(SeqId seq) const;

  uint16_t* k_pool(int layer) const;  // [pool_rows, kv_dim] f16 bits (device)
  uint16_t* v_pool(int layer) const;
  const CudaKvCacheOptions& options() const { return o_; }
  int kv_dim() const { return o_.n_kv_heads * o_.head_dim; }
  int32_t total_pages() const { return n_pages_; }
  int32_t free_pages() const { return static_cast<int32_t>(free_.size()); }
  int64_t page_bytes() const;  // K + V of every layer for one page

 private:
  struct Seq {
    int32_t length = 0;
    std::vector<int32_t> pages;
  };
  CudaKvCache() = default;
  int32_t PagesFor(int32_t tokens) const;

  CudaKvCacheOptions o_;
  int32_t n_pages_ = 0;
  DeviceBuffer pools_;          // [n_layers][K, V][n_pages * page_tokens, kv_dim] f16
  std::vector<int32_t> free_;   // free page ids; taken from the back (lowest id first)
  std::unordered_map<SeqId, Seq> seqs_;
};

}  // namespace specnode
