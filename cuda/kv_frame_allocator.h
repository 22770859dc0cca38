// KvFrameAllocator: where the GPU page pool (cuda_page_pool.h) puts pages of its four
// sizes (one per precision class) in one preallocated device arena. Slab allocation: the
// arena is cut into equal chunks; a chunk serves one class at a time, split into frames of
// that class's page size; a chunk whose frames are all free goes back to the free chunks
// and may then serve another class. Allocation and release are O(log chunks), host
// bookkeeping only (offsets into the arena; no device memory is touched).
//
// Fragmentation: a class's free frames sit in its partly used chunks, which other classes
// cannot use, so Allocate can refuse while the arena has free bytes. The pool sizes the
// arena for the KV manager's whole byte capacity in any one class (chunk tails included)
// plus one spare chunk per class; a refusal beyond that reaches the manager as
// ResourceExhausted, which gives back what the call took (nothing changed), like a full
// store.
//
// Not thread-safe.
#pragma once

#include <array>
#include <cstdint>
#include <set>
#include <vector>

namespace specnode {

class KvFrameAllocator {
 public:
  static constexpr int kClasses = 4;  // KvPrecision's (kvstore/kv_precision.h)

  // n_chunks chunks of chunk_bytes; page_bytes[c] <= chunk_bytes for every class.
  KvFrameAllocator(int64_t n_chunks, int64_t chunk_bytes,
                   const std::array<int64_t, kClasses>& page_bytes);

  // Byte offset in the arena of a free frame of class c, or -1 when there is none.
  int64_t Allocate(int c);
  // Gives back a frame Allocate returned (of class c).
  void Release(int c, int64_t offset);

  int64_t chunk_bytes() const { return chunk_bytes_; }
  int64_t arena_bytes() const { return chunk_bytes_ * static_cast<int64_t>(chunks_.size()); }
  int64_t free_chunks() const { return static_cast<int64_t>(free_chunks_.size()); }
  int64_t frames_per_chunk(int c) const { return frames_[c]; }
  // Frames of class c the whole arena would hold (an upper bound on live pages).
  int64_t MaxFrames(int c) const { return frames_[c] * static_cast<int64_t>(chunks_.size()); }

 private:
  struct Chunk {
    int cls = -1;               // class served, -1 = free
    int32_t live = 0;           // frames handed out
    std::vector<int32_t> free;  // free frame indices (the next one at the back)
  };

  int64_t chunk_bytes_;
  std::array<int64_t, kClasses> page_bytes_;
  std::array<int64_t, kClasses> frames_{};
  std::vector<Chunk> chunks_;
  std::vector<int32_t> free_chunks_;                 // lowest index at the back
  std::array<std::set<int32_t>, kClasses> partial_;  // chunks of a class with a free frame
};

}  // namespace specnode
