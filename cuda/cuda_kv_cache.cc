#include "cuda/cuda_kv_cache.h"

#include <algorithm>
#include <cassert>

#include "absl/strings/str_cat.h"
#include "model/status_macros.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<CudaKvCache>> CudaKvCache::Create(const CudaKvCacheOptions& o) {
  if (o.n_layers <= 0 || o.n_kv_heads <= 0 || o.head_dim <= 0 || o.context_length <= 0 ||
      o.page_tokens <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "CudaKvCache: layers, kv heads, head_dim, context length and page_tokens must be > 0 "
        "(got ",
        o.n_layers, ", ", o.n_kv_heads, ", ", o.head_dim, ", ", o.context_length, ", ",
        o.page_tokens, ")"));
  }
  std::unique_ptr<CudaKvCache> c(new CudaKvCache());
  c->o_ = o;
  const int64_t page = c->page_bytes();
  const int64_t pages = o.capacity_bytes / page;
  if (pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("CudaKvCache: capacity ", o.capacity_bytes,
                                                   " bytes is below one page (", page, " bytes)"));
  }
  // Pool rows are addressed with int32 (row = page * page_tokens + slot).
  const int64_t max_pages = int64_t{0x7fffffff} / o.page_tokens;
  c->n_pages_ = static_cast<int32_t>(std::min(pages, max_pages));
  SPECNODE_ASSIGN_OR_RETURN(c->pools_, DeviceBuffer::Allocate(
                                           static_cast<size_t>(c->n_pages_) * page));
  // Popped from the back: page 0 first.
  c->free_.resize(c->n_pages_);
  for (int32_t i = 0; i < c->n_pages_; ++i) c->free_[i] = c->n_pages_ - 1 - i;
  return c;
}

int64_t CudaKvCache::page_bytes() const {
  return int64_t{2} * o_.n_layers * o_.page_tokens * kv_dim() * 2;  // K and V, f16
}

int32_t CudaKvCache::PagesFor(int32_t tokens) const {
  return (tokens + o_.page_tokens - 1) / o_.page_tokens;
}

int32_t CudaKvCache::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second.length;
}

absl::Status CudaKvCache::Reserve(SeqId seq, int32_t count) {
  const int32_t length = Length(seq);
  if (count < 0 || static_cast<int64_t>(length) + count > o_.context_length) {
    return absl::InvalidArgumentError(absl::StrCat("sequence ", seq, ": ", length, " + ", count,
                                                   " tokens exceed the context length ",
                                                   o_.context_length));
  }
  Seq& s = seqs_[seq];
  const int32_t need = PagesFor(length + count) - static_cast<int32_t>(s.pages.size());
  if (need > static_cast<int32_t>(free_.size())) {
    if (s.pages.empty() && s.length == 0) seqs_.erase(seq);
    return absl::ResourceExhaustedError(absl::StrCat("GPU KV cache full: sequence ", seq,
                                                     " needs ", need, " more pages, ",
                                                     free_.size(), " free"));
  }
  for (int32_t i = 0; i < need; ++i) {
    s.pages.push_back(free_.back());
    free_.pop_back();
  }
  return absl::OkStatus();
}

void CudaKvCache::Commit(SeqId seq, int32_t length) {
  Seq& s = seqs_[seq];
  assert(PagesFor(length) <= static_cast<int32_t>(s.pages.size()));
  s.length = length;
}

absl::Status CudaKvCache::Truncate(SeqId seq, int32_t n) {
  auto it = seqs_.find(seq);
  const int32_t length = it == seqs_.end() ? 0 : it->second.length;
  if (n < 0 || n > length) {
    return absl::InvalidArgumentError(
        absl::StrCat("truncate sequence ", seq, " to ", n, " of its ", length, " tokens"));
  }
  if (it == seqs_.end()) return absl::OkStatus();
  Seq& s = it->second;
  s.length = n;
  const int32_t keep = PagesFor(n);
  while (static_cast<int32_t>(s.pages.size()) > keep) {
    free_.push_back(s.pages.back());
    s.pages.pop_back();
  }
  return absl::OkStatus();
}

void CudaKvCache::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  for (auto p = it->second.pages.rbegin(); p != it->second.pages.rend(); ++p) free_.push_back(*p);
  seqs_.erase(it);
}

int32_t CudaKvCache::RowOf(SeqId seq, int32_t pos) const {
  const Seq& s = seqs_.at(seq);
  return s.pages[pos / o_.page_tokens] * o_.page_tokens + pos % o_.page_tokens;
}

const std::vector<int32_t>& CudaKvCache::Pages(SeqId seq) const {
  static const std::vector<int32_t> kNone;
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? kNone : it->second.pages;
}

uint16_t* CudaKvCache::k_pool(int layer) const {
  const size_t per_pool = static_cast<size_t>(n_pages_) * o_.page_tokens * kv_dim();
  return pools_.as<uint16_t>() + (2 * static_cast<size_t>(layer)) * per_pool;
}

uint16_t* CudaKvCache::v_pool(int layer) const {
  const size_t per_pool = static_cast<size_t>(n_pages_) * o_.page_tokens * kv_dim();
  return pools_.as<uint16_t>() + (2 * static_cast<size_t>(layer) + 1) * per_pool;
}

}  // namespace specnode
