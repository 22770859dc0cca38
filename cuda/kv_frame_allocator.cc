#include "cuda/kv_frame_allocator.h"

#include <cassert>

namespace specnode {

KvFrameAllocator::KvFrameAllocator(int64_t n_chunks, int64_t chunk_bytes,
                                   const std::array<int64_t, kClasses>& page_bytes)
    : chunk_bytes_(chunk_bytes), page_bytes_(page_bytes), chunks_(n_chunks) {
  for (int c = 0; c < kClasses; ++c) {
    assert(page_bytes[c] > 0 && page_bytes[c] <= chunk_bytes);
    frames_[c] = chunk_bytes / page_bytes[c];
  }
  free_chunks_.reserve(n_chunks);
  for (int64_t i = n_chunks - 1; i >= 0; --i) free_chunks_.push_back(static_cast<int32_t>(i));
}

int64_t KvFrameAllocator::Allocate(int c) {
  int32_t id;
  if (!partial_[c].empty()) {
    // The lowest partly used chunk first: frees then empty the highest chunks, which go
    // back to every class.
    id = *partial_[c].begin();
  } else if (!free_chunks_.empty()) {
    id = free_chunks_.back();
    free_chunks_.pop_back();
    Chunk& ch = chunks_[id];
    ch.cls = c;
    ch.free.clear();
    for (int64_t f = frames_[c] - 1; f >= 0; --f) ch.free.push_back(static_cast<int32_t>(f));
    partial_[c].insert(id);
  } else {
    return -1;
  }
  Chunk& ch = chunks_[id];
  const int32_t frame = ch.free.back();
  ch.free.pop_back();
  ++ch.live;
  if (ch.free.empty()) partial_[c].erase(id);
  return static_cast<int64_t>(id) * chunk_bytes_ + frame * page_bytes_[c];
}

void KvFrameAllocator::Release(int c, int64_t offset) {
  const int32_t id = static_cast<int32_t>(offset / chunk_bytes_);
  Chunk& ch = chunks_[id];
  assert(ch.cls == c && ch.live > 0);
  ch.free.push_back(static_cast<int32_t>((offset % chunk_bytes_) / page_bytes_[c]));
  if (ch.free.size() == 1) partial_[c].insert(id);
  if (--ch.live > 0) return;
  partial_[c].erase(id);
  ch.cls = -1;
  ch.free.clear();
  // Keep the free list's lowest index at the back (chunks fill from the arena's start).
  auto it = free_chunks_.begin();
  while (it != free_chunks_.end() && *it > id) ++it;
  free_chunks_.insert(it, id);
}

}  // namespace specnode
