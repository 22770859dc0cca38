#include "kvstore/kv_store.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstore/kv_store_internal.h"
#include "model/status_macros.h"

namespace specnode {

KvMode KvStore::ResolvedMode(KvMode mode, const KvPoolCaps& caps) {
  if (mode != KvMode::kAuto) return mode;
  const bool all = caps.classes[0] && caps.classes[1] && caps.classes[2] && caps.slot_copies;
  // (mixed needs INT2 pages only with a cold tier: CheckSupported asks for them then)
  return all ? KvMode::kMixed : KvMode::kFull;
}

absl::Status KvStore::CheckSupported(const KvOptions& o, const KvPoolCaps& caps,
                                     const Device& device) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("kvstore: " + what); };
  if (o.mode == KvMode::kDense) {
    return bad("mode dense is the reference cache (model/dense_kv_cache.h), not a store mode");
  }
  const KvMode mode = ResolvedMode(o.mode, caps);
  std::vector<KvPrecision> classes;
  switch (mode) {
    case KvMode::kFull:
      classes = {KvPrecision::kFull};
      break;
    case KvMode::kInt8:
      classes = {KvPrecision::kInt8};
      break;
    case KvMode::kInt4:
      classes = {KvPrecision::kInt4};
      break;
    case KvMode::kInt2:
      classes = {KvPrecision::kInt2};
      break;
    default:
      classes = {KvPrecision::kFull, KvPrecision::kInt8, KvPrecision::kInt4};
      if (o.cold_threshold > 0.0f || o.bytes_per_token > 0) classes.push_back(KvPrecision::kInt2);
      break;
  }
  for (KvPrecision p : classes) {
    if (!caps.classes[static_cast<int>(p)]) {
      return bad(absl::StrCat("kv mode ", std::string(KvModeName(mode)), " needs ",
                              std::string(KvPrecisionName(p)), " pages, which the ", device.name(),
                              " page pool does not store"));
    }
  }
  if (o.rotate.value_or(false) && !caps.rotated) {
    return bad(absl::StrCat("kv rotation was asked for, but the ", device.name(),
                            " page pool stores K/V unrotated"));
  }
  if (o.bytes_per_token > 0 && mode != KvMode::kMixed) {
    return bad(absl::StrCat("kv.bytes_per_token needs kv mode mixed; the ", device.name(),
                            " page pool resolves mode auto to ", std::string(KvModeName(mode))));
  }
  if (mode == KvMode::kMixed && !caps.slot_copies) {
    return bad(absl::StrCat("kv mode mixed demotes tokens between pages, which the ", device.name(),
                            " page pool cannot do"));
  }
  if (o.evict && caps.page_order) {
    return bad(absl::StrCat("sliding-window eviction is not available on the ", device.name(),
                            " page pool"));
  }
  return absl::OkStatus();
}

absl::Status KvStore::CheckGeometry(const KvStoreConfig& c) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("kvstore: " + what); };
  if (c.n_layers < 1 || c.n_kv_heads < 1 || c.gqa_group < 1)
    return bad("n_layers, n_kv_heads and gqa_group must be >= 1");
  if (c.head_dim < 2 || c.head_dim % 2 != 0 || c.head_dim > 256)
    return bad("head_dim must be even and in [2, 256]");
  if (c.page_tokens < 1 || c.page_tokens > 4096) return bad("page_tokens must be in [1, 4096]");
  if (c.max_seq_len < 1) return bad("max_seq_len must be >= 1");
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const KvStoreConfig& c,
                                                         std::unique_ptr<KvPagePool> pool,
                                                         OptionsChecked checked) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("kvstore: " + what); };
  SPECNODE_RETURN_IF_ERROR(CheckGeometry(c));
  if (checked == OptionsChecked::kNo) {
    SPECNODE_RETURN_IF_ERROR(static_cast<const KvOptions&>(c).Validate("kvstore: "));
  }
  const KvPoolGeometry& g = pool->geometry();
  if (g.n_layers != c.n_layers || g.n_kv_heads != c.n_kv_heads || g.head_dim != c.head_dim ||
      g.gqa_group != c.gqa_group || g.page_tokens != c.page_tokens) {
    return bad("the page pool's geometry differs from the store's");
  }
  if (checked == OptionsChecked::kNo) {
    SPECNODE_RETURN_IF_ERROR(CheckSupported(c, pool->caps(), pool->device()));
  }
  KvStoreConfig resolved = c;
  resolved.mode = ResolvedMode(c.mode, pool->caps());
  std::unique_ptr<KvStore> s(new KvStore(resolved, std::move(pool)));
  const int64_t biggest = static_cast<int64_t>(s->PageBytes(s->WriteClass()));
  if (c.capacity_bytes < 2 * biggest) {
    return bad(absl::StrFormat("capacity_bytes %d is below two pages (%d bytes)", c.capacity_bytes,
                               2 * biggest));
  }
  return s;
}

KvStore::KvStore(const KvStoreConfig& c, std::unique_ptr<KvPagePool> pool)
    : config_(c), pool_(std::move(pool)), page_order_(pool_->NeedsPageOrder()) {
  for (int p = 0; p < kNumKvPrecisions; ++p) {
    page_bytes_[p] = pool_->PageBytes(static_cast<KvPrecision>(p));
  }
}

KvStore::~KvStore() = default;

KvPrecision KvStore::WriteClass() const {
  switch (config_.mode) {
    case KvMode::kInt8:
      return KvPrecision::kInt8;
    case KvMode::kInt4:
      return KvPrecision::kInt4;
    case KvMode::kInt2:
      return KvPrecision::kInt2;
    default:
      return KvPrecision::kFull;
  }
}

void KvStore::SetPendingBytes(Sequence& s, int64_t bytes) {
  pending_bytes_ += bytes - s.pending_bytes;
  s.pending_bytes = bytes;
}

int64_t KvStore::FreeBytes() const { return config_.capacity_bytes - used_bytes_ - pending_bytes_; }

int64_t KvStore::AvailableBytes() const {
  int64_t evictable = 0;
  for (const auto& [h, e] : prefix_cache_) {
    if (pages_[e.page]->ref == 1) evictable += PageBytes(pages_[e.page]->prec);
  }
  return FreeBytes() + evictable;
}

bool KvStore::EnsureBytes(int64_t bytes) {
  // Evict cache-only prefix pages, least recently used first.
  KvCacheEvent removed;
  removed.kind = KvCacheEvent::Kind::kBlockRemoved;
  for (auto it = lru_.end(); FreeBytes() < bytes && it != lru_.begin();) {
    --it;
    auto entry = prefix_cache_.find(*it);
    const int32_t page = entry->second.page;
    if (pages_[page]->ref != 1) continue;
    pages_[page]->cached = false;
    if (listener_ != nullptr) removed.block_hashes.push_back(kvstore_internal::EventHash(*it));
    prefix_cache_.erase(entry);
    it = lru_.erase(it);
    Unref(page);
  }
  if (!removed.block_hashes.empty()) {
    removed.medium = kvstore_internal::EventMedium(pool_->device());
    listener_->OnKvCacheEvent(std::move(removed));
  }
  return FreeBytes() >= bytes;
}

absl::StatusOr<int32_t> KvStore::AllocatePage(KvPrecision p) {
  const int64_t bytes = static_cast<int64_t>(PageBytes(p));
  if (!EnsureBytes(bytes)) return absl::ResourceExhaustedError("kvstore: out of page memory");
  int32_t id;
  if (!free_ids_.empty()) {
    id = free_ids_.back();
    free_ids_.pop_back();
  } else {
    id = static_cast<int32_t>(pages_.size());
    pages_.emplace_back();
  }
  if (id >= pool_->MaxPages()) {
    if (id == static_cast<int32_t>(pages_.size()) - 1) pages_.pop_back();
    return absl::ResourceExhaustedError(
        absl::StrCat("kvstore: the ", pool_->device().name(), " page pool has no page ", id));
  }
  if (absl::Status st = pool_->AllocatePage(id, p); !st.ok()) {
    if (id == static_cast<int32_t>(pages_.size()) - 1) {
      pages_.pop_back();
    } else {
      free_ids_.push_back(id);
    }
    return st;
  }
  auto page = std::make_unique<Page>();
  page->prec = p;
  page->ref = 1;
  pages_[id] = std::move(page);
  ++live_pages_;
  used_bytes_ += bytes;
  class_bytes_[static_cast<int>(p)] += bytes;
  return id;
}

void KvStore::Ref(int32_t page) { ++pages_[page]->ref; }

void KvStore::Unref(int32_t page) {
  Page& pg = *pages_[page];
  assert(pg.ref > 0);
  if (--pg.ref > 0) return;
  const int64_t bytes = static_cast<int64_t>(PageBytes(pg.prec));
  used_bytes_ -= bytes;
  class_bytes_[static_cast<int>(pg.prec)] -= bytes;
  pages_[page].reset();
  --live_pages_;
  pool_->ReleasePage(page);
  free_ids_.push_back(page);
}

absl::StatusOr<KvStore::Loc> KvStore::TakeSlot(Sequence& s, KvPrecision p) {
  const int c = static_cast<int>(p);
  int32_t page = s.open[c];
  if (page_order_) {
    // The next position continues the page of the one before it, or starts a page at a
    // page boundary (Reserve checked that the page is this sequence's alone).
    const size_t pos = s.loc.size();
    page = pos % config_.page_tokens == 0 ? -1 : s.loc[pos - 1].page;
  }
  if (page < 0 || pages_[page]->used >= config_.page_tokens) {
    auto id = AllocatePage(p);
    if (!id.ok()) return id.status();
    page = *id;
    s.open[c] = page;
    s.live[page] = 0;  // the allocation's reference is this sequence's
  }
  Loc loc{page, pages_[page]->used++};
  ++s.live[page];
  return loc;
}

void KvStore::ReleaseLoc(Sequence& s, Loc loc) {
  if (loc.page < 0) return;
  Page& pg = *pages_[loc.page];
  const int c = static_cast<int>(pg.prec);
  // The tail slot of a private open page is reused; any other slot just goes dead. In page
  // order a private page's tail is reused whether or not it is open: the next position
  // goes back into the same slot.
  if (pg.ref == 1 && (s.open[c] == loc.page || page_order_) && loc.slot == pg.used - 1) {
    --pg.used;
  }
  auto it = s.live.find(loc.page);
  assert(it != s.live.end() && it->second > 0);
  if (--it->second == 0) {
    s.live.erase(it);
    if (s.open[c] == loc.page) s.open[c] = -1;
    Unref(loc.page);
  }
}

int64_t KvStore::PagesNeeded(const Sequence* s, KvPrecision p, int64_t n) const {
  int64_t room = 0;
  if (s != nullptr && page_order_) {
    const int64_t have = static_cast<int64_t>(s->loc.size()) % config_.page_tokens;
    room = have == 0 ? 0 : config_.page_tokens - have;
  } else if (s != nullptr) {
    const int32_t open = s->open[static_cast<int>(p)];
    if (open >= 0) room = config_.page_tokens - pages_[open]->used;
  }
  const int64_t rest = std::max<int64_t>(0, n - room);
  return (rest + config_.page_tokens - 1) / config_.page_tokens;
}

int64_t KvStore::BytesForTokens(int64_t n) const {
  const int64_t written =
      (PagesNeeded(nullptr, WriteClass(), n) + 1) * static_cast<int64_t>(PageBytes(WriteClass()));
  if (config_.mode != KvMode::kMixed) return written;
  // Mixed: a sequence fed in passes that respect PassBoundary (the engine's) holds at most
  // sinks + window + demote_every tokens at f16 once settled; the rest is demoted, counted
  // here as INT8 (the larger class), plus the demotion reserve of one chunk. Not the f16
  // peak of all n (issue 16, item 10: admission and recompute refused sequences that fit).
  const int64_t full = std::min<int64_t>(
      n, int64_t{config_.sink_tokens} + config_.window_tokens + config_.demote_every);
  if (full == n) return written;
  const int64_t demoted = n - full + config_.demote_every;
  return (PagesNeeded(nullptr, KvPrecision::kFull, full) + 1) *
             static_cast<int64_t>(PageBytes(KvPrecision::kFull)) +
         (PagesNeeded(nullptr, KvPrecision::kInt8, demoted) + 1) *
             static_cast<int64_t>(PageBytes(KvPrecision::kInt8)) +
         static_cast<int64_t>(PageBytes(KvPrecision::kInt4));
}

int32_t KvStore::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second->length;
}

absl::Status KvStore::Reserve(SeqId seq, int32_t n_new) {
  if (n_new < 0) return absl::InvalidArgumentError("negative reservation");
  EndPoolPass();
  SPECNODE_RETURN_IF_ERROR(TakePoolError());
  auto it = seqs_.find(seq);
  Sequence* s = it == seqs_.end() ? nullptr : it->second.get();
  if (s != nullptr && s->swapped) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " is swapped out"));
  }
  // What the previous pass committed: its observations, its demotions (with the bytes the
  // previous Reserve set aside for them).
  if (s != nullptr) Settle(*s);
  const int64_t length = s == nullptr ? 0 : s->length;
  const int64_t need = length + n_new;
  if (need > config_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence of %d tokens exceeds the context length %d", need, config_.max_seq_len));
  }
  const int64_t have = s == nullptr ? 0 : static_cast<int64_t>(s->loc.size());
  const int64_t extra = std::max<int64_t>(0, need - have);
  const KvPrecision wc = WriteClass();
  if (page_order_ && extra > 0 && have % config_.page_tokens != 0) {
    // Appending goes into the page of position have - 1, which must be this sequence's
    // alone and filled exactly up to it (no copy-on-write of shared pages here).
    const Loc last = s->loc[have - 1];
    if (last.page < 0 || pages_[last.page]->ref != 1 ||
        pages_[last.page]->used != have % config_.page_tokens) {
      return absl::FailedPreconditionError(
          absl::StrCat("sequence ", seq, " would append into a shared page, which the ",
                       pool_->device().name(), " page pool cannot copy on write"));
    }
  }
  int64_t bytes = PagesNeeded(s, wc, extra) * static_cast<int64_t>(PageBytes(wc));
  // Room for the demotions the next Settle may make, when the committed length reaches at
  // most `need` (worst case: all to INT8, one partly filled page per class).
  int64_t demote_bytes = 0;
  if (config_.mode == KvMode::kMixed) {
    const int64_t from = std::max<int64_t>(config_.sink_tokens, s == nullptr ? 0 : s->demoted_upto);
    const int64_t demote = std::max<int64_t>(0, DemoteLimit(need) - from);
    if (demote > 0) {
      demote_bytes = (PagesNeeded(nullptr, KvPrecision::kInt8, demote) + 1) *
                         static_cast<int64_t>(PageBytes(KvPrecision::kInt8)) +
                     static_cast<int64_t>(PageBytes(KvPrecision::kInt4));
    }
  }
  const int64_t old_pending = s == nullptr ? 0 : s->pending_bytes;
  if (!EnsureBytes(bytes + demote_bytes - old_pending)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV store full: %d of %d bytes in use, %d more needed for %d tokens",
                        used_bytes_, config_.capacity_bytes, bytes + demote_bytes, n_new));
  }
  if (live_pages_ + PagesNeeded(s, wc, extra) > pool_->MaxPages()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("KV store full: the %s page pool holds %d pages", pool_->device().name(),
                        pool_->MaxPages()));
  }
  const bool fresh = s == nullptr;
  if (fresh) s = &NewSequence(seq);
  SetPendingBytes(*s, 0);  // re-counted below; the bytes were ensured including it
  for (int64_t i = 0; i < extra; ++i) {
    auto loc = TakeSlot(*s, wc);
    if (!loc.ok()) {
      // The bytes were there, but a device pool may still refuse a page (its arena
      // fragmented between classes): give back what this call took, as if it had not run.
      while (static_cast<int64_t>(s->loc.size()) > have) {
        ReleaseLoc(*s, s->loc.back());
        s->loc.pop_back();
      }
      SetPendingBytes(*s, old_pending);
      if (fresh) seqs_.erase(seq);
      return loc.status();
    }
    s->loc.push_back(*loc);
  }
  SetPendingBytes(*s, demote_bytes);
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    s->mass_sum[h].resize(s->loc.size(), 0.0f);
    s->mass_cnt[h].resize(s->loc.size(), 0.0f);
  }
  return absl::OkStatus();
}

KvStore::Sequence& KvStore::NewSequence(SeqId seq) {
  auto fresh = std::make_unique<Sequence>();
  fresh->mass_sum.resize(config_.n_kv_heads);
  fresh->mass_cnt.resize(config_.n_kv_heads);
  Sequence& s = *fresh;
  seqs_[seq] = std::move(fresh);
  return s;
}

absl::Status KvStore::BeginPass(std::span<const KvPassEntry> entries, ThreadPool* threads) {
  EndPoolPass();  // a pass that ended without a Commit
  SPECNODE_RETURN_IF_ERROR(TakePoolError());
  const int nkv = config_.n_kv_heads;
  const bool observe = config_.mode == KvMode::kMixed;
  const int32_t every = config_.mass_sample_every;
  const int32_t min_distance = config_.window_tokens / 2;
  pass_.resize(entries.size());
  pass_mass_.resize(entries.size());
  for (size_t i = 0; i < entries.size(); ++i) {
    const KvPassEntry& e = entries[i];
    auto it = seqs_.find(e.seq);
    if (it == seqs_.end() || it->second->swapped ||
        static_cast<int64_t>(it->second->loc.size()) < int64_t{e.pos0} + e.n || e.n < 1) {
      return absl::FailedPreconditionError(absl::StrCat("kvstore: pass over sequence ", e.seq,
                                                        " positions [", e.pos0, ", ", e.pos0 + e.n,
                                                        ") that are not reserved"));
    }
    Sequence& s = *it->second;
    // A row per observed query (positions that are multiples of `every`), over the keys
    // that can still be demoted: those below max(sinks, demoted_upto) never will be again.
    std::vector<KvMassRow>& rows = pass_mass_[i];
    rows.clear();
    if (observe) {
      std::erase_if(s.staged, [](const Sequence::StagedMass& m) { return m.row >= 0; });
      const size_t first_new = s.staged.size();
      const int32_t lo = std::max(config_.sink_tokens, s.demoted_upto);
      auto stage = [&](int32_t q, int32_t row) {
        const int32_t width = q + 1 - min_distance - lo;
        if (q % every != 0 || width <= 0) return;
        Sequence::StagedMass& m = s.staged.emplace_back();
        m.pos = q;
        m.lo = lo;
        m.width = width;
        m.row = row;
        m.sum.assign(static_cast<size_t>(nkv) * width, 0.0f);
        m.cnt.assign(static_cast<size_t>(nkv) * width, 0.0f);
      };
      if (e.parents.empty()) {
        for (int32_t q = e.pos0; q < e.pos0 + e.n; ++q) stage(q, -1);
      } else {
        const std::vector<int32_t> depth = TreeRowDepths(e.parents);
        for (int32_t r = 0; r < e.n; ++r) stage(e.pos0 + depth[r], r);
      }
      // Pointers once every row of this pass exists (emplace_back may move the rows, not
      // their data).
      for (size_t r = first_new; r < s.staged.size(); ++r) {
        Sequence::StagedMass& m = s.staged[r];
        rows.push_back({m.pos, m.lo, m.sum.data(), m.cnt.data(), m.row});
      }
    }
    KvPoolPassSeq& p = pass_[i];
    p.seq = e.seq;
    p.pos0 = e.pos0;
    p.n = e.n;
    p.slots = std::span<const Loc>(s.loc.data(), static_cast<size_t>(e.pos0 + e.n));
    p.mass.on = observe;
    p.mass.sample_every = every;
    p.mass.min_distance = min_distance;
    p.mass.rows = rows;
    p.parents = e.parents;
    if (!p.parents.empty() && !tree_passes()) {
      return absl::UnimplementedError(absl::StrCat("kvstore: the ", pool_->device().name(),
                                                   " page pool does not take draft-tree passes"));
    }
  }
  pass_open_ = true;
  return pool_->BeginPass(pass_, threads);
}

absl::Status KvStore::Write(int layer, const float* k, const float* v) {
  return pool_->Write(layer, k, v);
}

absl::Status KvStore::Attend(int layer, const float* q, float scale, int32_t window, float* out) {
  return pool_->Attend(layer, q, scale, window, out);
}

void KvStore::EndPoolPass() {
  if (!pass_open_) return;
  pass_open_ = false;
  absl::Status st = pool_->EndPass();
  if (!st.ok() && pool_error_.ok()) pool_error_ = std::move(st);
}

absl::Status KvStore::TakePoolError() {
  absl::Status st = std::move(pool_error_);
  pool_error_ = absl::OkStatus();
  return st;
}

void KvStore::Commit(SeqId seq, int32_t new_length) {
  // The pass's observations reach their rows before anything reads or drops them.
  EndPoolPass();
  Sequence& s = *seqs_.at(seq);
  assert(new_length <= static_cast<int32_t>(s.loc.size()));
  // Demotion waits for Settle: the caller may still roll back part of this pass (rejected
  // drafts), whose observations must not count and whose length must not move the window.
  s.length = new_length;
}

absl::Status KvStore::Truncate(SeqId seq, int32_t n) {
  auto it = seqs_.find(seq);
  const int32_t length = it == seqs_.end() ? 0 : it->second->length;
  if (n < 0 || n > length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot truncate a %d-token sequence to %d", length, n));
  }
  if (it == seqs_.end()) return absl::OkStatus();
  EndPoolPass();
  SPECNODE_RETURN_IF_ERROR(TakePoolError());
  Sequence& s = *it->second;
  if (s.swapped) return absl::FailedPreconditionError("sequence is swapped out");
  // Observations of queries at positions >= n are of rolled-back tokens: dropped.
  // So are a tree pass's rows that no KeepRows resolved.
  std::erase_if(s.staged, [n](const Sequence::StagedMass& m) { return m.pos >= n || m.row >= 0; });
  for (int32_t p = static_cast<int32_t>(s.loc.size()) - 1; p >= n; --p) ReleaseLoc(s, s.loc[p]);
  s.loc.resize(n);
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    s.mass_sum[h].resize(n);
    s.mass_cnt[h].resize(n);
  }
  s.length = n;
  s.demoted_upto = std::min(s.demoted_upto, n);
  s.evicted_upto = std::min(s.evicted_upto, n);
  Settle(s);  // with the pending bytes still set aside
  SetPendingBytes(s, 0);
  return absl::OkStatus();
}

void KvStore::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  EndPoolPass();  // its mass rows may point into this sequence
  Sequence& s = *it->second;
  for (const Loc& loc : s.loc) ReleaseLoc(s, loc);
  SetPendingBytes(s, 0);
  host_bytes_ -= static_cast<int64_t>(s.host_rows.size());
  seqs_.erase(it);
}

}  // namespace specnode
