#include "coordinator/suffix_index.h"

#include <algorithm>
#include <cassert>

namespace specnode {

SuffixIndex::SuffixIndex(int max_n) : max_n_(max_n) {
  assert(max_n >= 1 && max_n <= 64);
  window_.reserve(max_n);
}

uint64_t SuffixIndex::Key(const int32_t* tokens, int n) {
  // FNV-1a over n and the token ids: n-grams of different lengths never share a key by
  // construction of the input; a 64-bit collision only costs a bad draft (the target
  // verifies every drafted token).
  uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(n);
  h *= 1099511628211ull;
  for (int i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(tokens[i]);
    h *= 1099511628211ull;
  }
  return h;
}

void SuffixIndex::Record(uint64_t key, int32_t token) {
  std::vector<Next>& next = next_[key];
  for (Next& e : next) {
    if (e.token == token) {
      ++e.count;
      e.last = position_;
      return;
    }
  }
  if (static_cast<int>(next.size()) >= kMaxNext) {
    // Full: the rarest continuation, oldest among equals, makes room.
    auto victim = std::min_element(next.begin(), next.end(), [](const Next& a, const Next& b) {
      return a.count != b.count ? a.count < b.count : a.last < b.last;
    });
    *victim = Next{token, 1, position_};
    return;
  }
  next.push_back(Next{token, 1, position_});
}

void SuffixIndex::Append(std::span<const int32_t> tokens) {
  for (int32_t t : tokens) {
    const int w = static_cast<int>(window_.size());
    for (int n = 1; n <= w; ++n) Record(Key(window_.data() + w - n, n), t);
    if (w == max_n_) window_.erase(window_.begin());
    window_.push_back(t);
    ++position_;
  }
}

void SuffixIndex::Break() { window_.clear(); }

void SuffixIndex::Clear() {
  window_.clear();
  next_.clear();
  position_ = 0;
}

SuffixIndex::Match SuffixIndex::Longest(std::span<const int32_t> tail, int min_n) const {
  Match m;
  const int top = std::min<int>(max_n_, static_cast<int>(tail.size()));
  for (int n = top; n >= std::max(1, min_n); --n) {
    auto it = next_.find(Key(tail.data() + tail.size() - n, n));
    if (it == next_.end()) continue;
    m.n = n;
    m.next = it->second;
    std::sort(m.next.begin(), m.next.end(), [](const Next& a, const Next& b) {
      return a.count != b.count ? a.count > b.count : a.last > b.last;
    });
    for (const Next& e : m.next) m.total += e.count;
    return m;
  }
  return m;
}

}  // namespace specnode
