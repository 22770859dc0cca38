// KvStore: the mixed-precision policy over committed tokens — demotion of tokens that left
// the f16 window (int8 for critical ones, int2 for cold ones, int4 for the rest, by observed
// attention mass; or, with a byte budget, the classes kv_byte_budget.h chooses),
// eviction beyond evict_window, and Settle, which applies both at pass boundaries (kv_store.h).
#include <algorithm>
#include <cassert>
#include <cmath>

#include "kvstore/kv_byte_budget.h"
#include "kvstore/kv_store.h"
#include "kvstore/kv_store_internal.h"

namespace specnode {

float KvStore::MeanMass(const Sequence& s, int32_t pos, bool* seen) const {
  float sum = 0.0f, cnt = 0.0f;
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    sum += s.mass_sum[h][pos];
    cnt += s.mass_cnt[h][pos];
  }
  *seen = cnt > 0.0f;
  return cnt > 0.0f ? sum / cnt : 0.0f;
}

KvPrecision KvStore::ThresholdClass(const Sequence& s, int32_t pos) const {
  bool seen = false;
  const float mass = MeanMass(s, pos, &seen);
  if (seen && mass >= config_.critical_threshold) return KvPrecision::kInt8;
  if (seen && mass < config_.cold_threshold) return KvPrecision::kInt2;
  return KvPrecision::kInt4;
}

void KvStore::Demote(Sequence& s, int32_t pos, KvPrecision target) {
  const Loc old = s.loc[pos];
  // Only ever down (a larger KvPrecision value is less precise).
  if (old.page < 0 || static_cast<int>(pages_[old.page]->prec) >= static_cast<int>(target)) return;
  auto loc = TakeSlot(s, target);
  if (!loc.ok()) return;  // no bytes for the new slot (a budget's re-demotion): stay
  pool_->Recode(old, *loc);
  s.loc[pos] = *loc;
  ReleaseLoc(s, old);
}

bool KvStore::DemoteToBudget(Sequence& s, int32_t demote_to) {
  const int32_t boundary =
      static_cast<int32_t>(s.length / config_.demote_every * config_.demote_every);
  const int64_t horizon = int64_t{boundary} + config_.demote_every;
  std::array<int64_t, kNumKvPrecisions> slot{};
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    slot[c] = static_cast<int64_t>(pool_->SlotBytes(static_cast<KvPrecision>(c)));
  }
  // Until the next boundary the sinks, the window and the tokens to come stay f16; and, so
  // that the budget holds for pages and not just rows: the sinks' last page is whole (its
  // other slots were demoted), and each demoted class's open page may be partly filled.
  const int32_t first = std::min(config_.sink_tokens, demote_to);
  const int64_t pt = config_.page_tokens;
  const int64_t sink_pages = (first + pt - 1) / pt;
  const int64_t tails = (pt - 1) * (slot[1] + slot[2] + slot[3]);
  const int64_t fixed = slot[0] * (sink_pages * pt + (horizon - demote_to)) + tails;
  const int64_t allowance = config_.bytes_per_token * horizon - fixed;
  std::vector<BudgetToken> tokens;
  std::vector<int32_t> where;
  for (int32_t p = first; p < demote_to; ++p) {
    if (s.loc[p].page < 0) continue;  // evicted
    const KvPrecision now = pages_[s.loc[p].page]->prec;
    bool seen = false;
    // Recency ranking: the position stands in for the mass (newer = more precise).
    const float mass = config_.budget_rank == KvBudgetRank::kRecency ? static_cast<float>(p + 1)
                                                                     : MeanMass(s, p, &seen);
    // A token leaving the window may stay as precise as int8, the thresholds' best.
    const KvPrecision best = now == KvPrecision::kFull ? KvPrecision::kInt8 : now;
    tokens.push_back({mass, best});
    where.push_back(p);
  }
  const std::optional<std::vector<KvPrecision>> cls =
      ChooseClassesForBudget(tokens, allowance, slot, KvPrecision::kInt2);
  if (!cls.has_value()) return false;  // the budget cannot hold yet: thresholds
  for (size_t i = 0; i < where.size(); ++i) Demote(s, where[i], (*cls)[i]);
  // Tokens moved down out of int8 / int4 pages leave dead slots there: pack those classes.
  Compact(s, KvPrecision::kInt8, demote_to);
  Compact(s, KvPrecision::kInt4, demote_to);
  return true;
}

void KvStore::Compact(Sequence& s, KvPrecision c, int32_t upto) {
  // Private pages of class c holding dead slots (shared pages' slots are other sequences'
  // too, and stay as they are).
  auto holed = [&](int32_t page) {
    const Page& pg = *pages_[page];
    if (pg.prec != c || pg.ref != 1) return false;
    auto it = s.live.find(page);
    return it != s.live.end() && it->second < pg.used;
  };
  std::vector<int32_t> moving;
  for (int32_t p = 0; p < upto; ++p) {
    if (s.loc[p].page >= 0 && holed(s.loc[p].page)) moving.push_back(p);
  }
  if (moving.empty()) return;
  // Fresh pages take them (not the open page's tail, if it is one of the holed).
  const int ci = static_cast<int>(c);
  if (s.open[ci] >= 0 && holed(s.open[ci])) s.open[ci] = -1;
  std::vector<uint8_t> bytes(pool_->SlotBytes(c));
  for (int32_t p : moving) {
    auto loc = TakeSlot(s, c);
    if (!loc.ok()) return;  // no page to spare now: the rest stay where they are
    // Byte for byte (attention reads the same rows, so no result changes).
    pool_->ReadSlot(s.loc[p], bytes.data());
    pool_->WriteSlot(*loc, bytes.data());
    const Loc old = s.loc[p];
    s.loc[p] = *loc;
    ReleaseLoc(s, old);
  }
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
    if (config_.bytes_per_token <= 0 || !DemoteToBudget(s, demote_to)) {
      for (int32_t p = demote_from; p < demote_to; ++p) Demote(s, p, ThresholdClass(s, p));
    }
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
