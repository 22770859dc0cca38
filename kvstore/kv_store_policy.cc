// KvStore: the mixed-precision policy over committed tokens — demotion of tokens that left
// the f16 window (int8 for critical ones, int4 for the rest, by observed attention mass),
// eviction beyond evict_window, and Settle, which applies both at pass boundaries (kv_store.h).
#include <algorithm>
#include <cassert>
#include <cmath>

#include "kvstore/kv_store.h"
#include "kvstore/kv_store_internal.h"

namespace specnode {

void KvStore::Demote(Sequence& s, int32_t pos) {
  const Loc old = s.loc[pos];
  if (old.page < 0 || pages_[old.page]->prec != KvPrecision::kFull) return;
  float sum = 0.0f, cnt = 0.0f;
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    sum += s.mass_sum[h][pos];
    cnt += s.mass_cnt[h][pos];
  }
  const bool critical = cnt > 0.0f && sum / cnt >= config_.critical_threshold;
  const KvPrecision target = critical ? KvPrecision::kInt8 : KvPrecision::kInt4;
  auto loc = TakeSlot(s, target);
  if (!loc.ok()) return;  // cannot happen after Reserve's pending bytes; stay precise
  pool_->Recode(old, *loc);
  s.loc[pos] = *loc;
  ReleaseLoc(s, old);
}

void KvStore::Evict(Sequence& s, int32_t pos) {
  if (s.loc[pos].page < 0) return;
  ReleaseLoc(s, s.loc[pos]);
  s.loc[pos].page = -1;
  ++evicted_tokens_;
}

int64_t KvStore::DemoteLimit(int64_t length) const {
  if (config_.mode != KvMode::kMixed) return 0;
  return length / config_.demote_every * config_.demote_every - config_.window_tokens;
}

int64_t KvStore::EvictLimit(int64_t length) const {
  if (!config_.evict) return 0;
  return length / config_.demote_every * config_.demote_every - config_.evict_window;
}

int32_t KvStore::PassBoundary() const {
  return config_.mode == KvMode::kMixed || config_.evict ? config_.demote_every : 0;
}

void KvStore::Settle(Sequence& s) {
  // Observations of committed queries, in position order (rows of queries at or past the
  // length were rolled back by Truncate and are gone). Adding row by row in that order
  // gives the same floats however the queries were grouped into passes.
  size_t kept = 0;
  for (size_t i = 0; i < s.staged.size(); ++i) {
    Sequence::StagedMass& m = s.staged[i];
    if (m.pos >= s.length || m.row >= 0) {
      // Not committed yet (a pass in flight). No self-move: it would empty the row.
      if (kept != i) s.staged[kept] = std::move(m);
      ++kept;
      continue;
    }
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      float* sum = s.mass_sum[h].data() + m.lo;
      float* cnt = s.mass_cnt[h].data() + m.lo;
      const float* ms = m.sum.data() + static_cast<size_t>(h) * m.width;
      const float* mc = m.cnt.data() + static_cast<size_t>(h) * m.width;
      for (int32_t j = 0; j < m.width; ++j) {
        sum[j] += ms[j];
        cnt[j] += mc[j];
      }
    }
  }
  s.staged.resize(kept);
  const int32_t demote_to = static_cast<int32_t>(DemoteLimit(s.length));
  const int32_t demote_from = std::max(config_.sink_tokens, s.demoted_upto);
  if (config_.mode == KvMode::kMixed && demote_to > demote_from) {
    SetPendingBytes(s, 0);  // the bytes Reserve set aside are what the demotions take
    for (int32_t p = demote_from; p < demote_to; ++p) Demote(s, p);
  }
  s.demoted_upto = std::max(s.demoted_upto, demote_to);
  if (config_.evict) {
    if (!warned_evict_) {
      std::fprintf(stderr,
                   "kvstore: sliding-window eviction is on: tokens older than %d "
                   "(except %d sinks) are dropped; attention is lossy\n",
                   config_.evict_window, config_.sink_tokens);
      warned_evict_ = true;
    }
    const int32_t from = std::max(config_.sink_tokens, s.evicted_upto);
    const int32_t to = static_cast<int32_t>(EvictLimit(s.length));
    for (int32_t p = from; p < to; ++p) Evict(s, p);
    s.evicted_upto = std::max(s.evicted_upto, to);
  }
}

}  // namespace specnode
