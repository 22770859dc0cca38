// KvStore: forks, the prefix cache, swapping to the host tier, and usage accounting.
#include <cassert>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstore/kv_store.h"
#include "kvstore/kv_store_internal.h"
#include "model/status_macros.h"

namespace specnode {

absl::Status KvStore::Fork(SeqId src, SeqId dst) {
  auto it = seqs_.find(src);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("fork: no sequence ", src));
  if (seqs_.count(dst))
    return absl::AlreadyExistsError(absl::StrCat("fork: sequence ", dst, " exists"));
  Sequence& s = *it->second;
  if (s.swapped) return absl::FailedPreconditionError("fork: source is swapped out");
  if (page_order_ && s.length % config_.page_tokens != 0) {
    return absl::UnimplementedError(
        absl::StrCat("fork: sequence ", src, " ends inside a page, and the ",
                     pool_->device().name(), " page pool cannot copy the shared page on write"));
  }
  Settle(s);  // dst starts from src's settled state (no staged rows of its own)
  auto d = std::make_unique<Sequence>();
  d->length = s.length;
  d->loc.assign(s.loc.begin(), s.loc.begin() + s.length);
  for (const Loc& loc : d->loc) {
    if (loc.page < 0) continue;
    if (d->live[loc.page]++ == 0) Ref(loc.page);
  }
  d->mass_sum.resize(config_.n_kv_heads);
  d->mass_cnt.resize(config_.n_kv_heads);
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    d->mass_sum[h].assign(s.mass_sum[h].begin(), s.mass_sum[h].begin() + s.length);
    d->mass_cnt[h].assign(s.mass_cnt[h].begin(), s.mass_cnt[h].begin() + s.length);
  }
  d->demoted_upto = std::min(s.demoted_upto, s.length);
  d->evicted_upto = std::min(s.evicted_upto, s.length);
  seqs_[dst] = std::move(d);
  return absl::OkStatus();
}

namespace {
// Hash of the token ids of blocks [0, b], chained from the previous block's hash.
uint64_t BlockHash(uint64_t prev, std::span<const int32_t> block) {
  uint64_t h = prev ^ 0x51afd7ed558ccd3ULL;
  for (int32_t t : block) h = kvstore_internal::Mix(h, static_cast<uint32_t>(t));
  return h;
}
}  // namespace

int32_t KvStore::MatchPrefix(SeqId seq, std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  if (it != seqs_.end() && (it->second->length > 0 || !it->second->loc.empty())) return 0;
  const int32_t P = config_.page_tokens;
  uint64_t h = 0;
  std::vector<int32_t> pages;
  for (size_t b = 0; (b + 1) * P < tokens.size(); ++b) {
    auto block = tokens.subspan(b * P, P);
    h = BlockHash(h, block);
    auto e = prefix_cache_.find(h);
    if (e == prefix_cache_.end() ||
        !std::equal(block.begin(), block.end(), e->second.tokens.begin()))
      break;
    lru_.splice(lru_.begin(), lru_, e->second.lru);
    pages.push_back(e->second.page);
  }
  if (pages.empty() || static_cast<int64_t>(pages.size()) * P > config_.max_seq_len) return 0;
  Sequence& s = it == seqs_.end() ? NewSequence(seq) : *it->second;
  for (int32_t page : pages) {
    Ref(page);
    s.live[page] = P;
    for (int32_t slot = 0; slot < P; ++slot) s.loc.push_back({page, slot});
  }
  s.length = static_cast<int32_t>(s.loc.size());
  for (int h2 = 0; h2 < config_.n_kv_heads; ++h2) {
    s.mass_sum[h2].assign(s.length, 0.0f);
    s.mass_cnt[h2].assign(s.length, 0.0f);
  }
  return s.length;
}

void KvStore::PublishPrefix(SeqId seq, std::span<const int32_t> tokens) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second->swapped) return;
  const Sequence& s = *it->second;
  const int32_t P = config_.page_tokens;
  const size_t limit = std::min<size_t>(s.length, tokens.size());
  // The run of consecutive blocks added so far, reported as one BlockStored when it ends (a
  // block already cached, a block that cannot be cached, or the end).
  std::optional<KvCacheEvent> run;
  auto end_run = [&] {
    if (run.has_value()) listener_->OnKvCacheEvent(*std::move(run));
    run.reset();
  };
  uint64_t h = 0;
  for (size_t b = 0; (b + 1) * P <= limit; ++b) {
    auto block = tokens.subspan(b * P, P);
    const uint64_t parent = h;
    h = BlockHash(h, block);
    // Cached already (by this sequence earlier, whose own copy may since have been demoted,
    // or by another): the chain goes on through it.
    if (prefix_cache_.count(h)) {
      end_run();
      continue;
    }
    const int32_t page = s.loc[b * P].page;
    if (page < 0) break;
    const Page& pg = *pages_[page];
    if (pg.prec != KvPrecision::kFull || pg.used != P) break;
    bool in_order = true;
    for (int32_t slot = 0; slot < P && in_order; ++slot) {
      const Loc loc = s.loc[b * P + slot];
      in_order = loc.page == page && loc.slot == slot;
    }
    if (!in_order) break;
    Ref(page);
    pages_[page]->cached = true;
    lru_.push_front(h);
    prefix_cache_[h] =
        CacheEntry{page, std::vector<int32_t>(block.begin(), block.end()), lru_.begin()};
    if (listener_ == nullptr) continue;
    if (!run.has_value()) {
      run.emplace();
      run->kind = KvCacheEvent::Kind::kBlockStored;
      if (b > 0) run->parent_block_hash = kvstore_internal::EventHash(parent);
      run->block_size = P;
      run->medium = kvstore_internal::EventMedium(pool_->device());
    }
    run->block_hashes.push_back(kvstore_internal::EventHash(h));
    run->token_ids.insert(run->token_ids.end(), block.begin(), block.end());
  }
  end_run();
}

absl::Status KvStore::SetEventListener(KvCacheEventListener* listener) {
  listener_ = listener;
  return absl::OkStatus();
}

bool KvStore::IsSwapped(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it != seqs_.end() && it->second->swapped;
}

absl::Status KvStore::SwapOut(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("swap-out: no sequence ", seq));
  Sequence& s = *it->second;
  if (s.swapped) return absl::OkStatus();
  if (!pool_->SupportsSlotCopies()) {
    return absl::UnimplementedError(absl::StrCat("swap-out: the ", pool_->device().name(),
                                                 " page pool cannot copy KV to the host"));
  }
  EndPoolPass();
  SPECNODE_RETURN_IF_ERROR(TakePoolError());
  Settle(s);  // the committed state, with the bytes its demotions were given
  // Uncommitted reservations are dropped; committed rows are copied byte for byte.
  for (int32_t p = static_cast<int32_t>(s.loc.size()) - 1; p >= s.length; --p)
    ReleaseLoc(s, s.loc[p]);
  s.loc.resize(s.length);
  int64_t bytes = 0;
  for (const Loc& loc : s.loc) {
    if (loc.page >= 0) bytes += static_cast<int64_t>(pool_->SlotBytes(pages_[loc.page]->prec));
  }
  if (host_bytes_ + bytes > config_.host_capacity_bytes) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("host swap tier full: %d of %d bytes in use, %d needed", host_bytes_,
                        config_.host_capacity_bytes, bytes));
  }
  s.host_class.resize(s.loc.size());
  s.host_rows.resize(bytes);
  std::vector<Loc> stored;  // the slots with storage, in position order (one copy)
  stored.reserve(s.loc.size());
  for (size_t p = 0; p < s.loc.size(); ++p) {
    const Loc loc = s.loc[p];
    if (loc.page < 0) {
      s.host_class[p] = kvstore_internal::kEvictedClass;
      continue;
    }
    s.host_class[p] = static_cast<uint8_t>(pages_[loc.page]->prec);
    stored.push_back(loc);
  }
  if (absl::Status st = pool_->ReadSlots(stored, s.host_rows.data()); !st.ok()) {
    // Nothing released yet: the sequence stays where it is.
    s.host_class.clear();
    s.host_rows.clear();
    return st;
  }
  for (const Loc& loc : s.loc) ReleaseLoc(s, loc);
  s.loc.clear();
  s.open.fill(-1);
  SetPendingBytes(s, 0);
  s.swapped = true;
  host_bytes_ += bytes;
  return absl::OkStatus();
}

absl::Status KvStore::SwapIn(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return absl::NotFoundError(absl::StrCat("swap-in: no sequence ", seq));
  Sequence& s = *it->second;
  if (!s.swapped) return absl::OkStatus();
  std::array<int64_t, kNumKvPrecisions> count{};
  for (uint8_t c : s.host_class) {
    if (c != kvstore_internal::kEvictedClass) ++count[c];
  }
  int64_t bytes = 0;
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    bytes += PagesNeeded(nullptr, static_cast<KvPrecision>(c), count[c]) *
             static_cast<int64_t>(PageBytes(static_cast<KvPrecision>(c)));
  }
  if (!EnsureBytes(bytes)) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("swap-in of sequence %d needs %d bytes; %d of %d in use", seq, bytes,
                        used_bytes_, config_.capacity_bytes));
  }
  int64_t pages = 0;
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    pages += PagesNeeded(nullptr, static_cast<KvPrecision>(c), count[c]);
  }
  if (live_pages_ + pages > pool_->MaxPages()) {
    return absl::ResourceExhaustedError(
        absl::StrFormat("swap-in of sequence %d needs %d pages; the %s page pool holds %d", seq,
                        pages, pool_->device().name(), pool_->MaxPages()));
  }
  s.loc.resize(s.host_class.size());
  std::vector<Loc> stored;
  stored.reserve(s.host_class.size());
  for (size_t p = 0; p < s.host_class.size(); ++p) {
    if (s.host_class[p] == kvstore_internal::kEvictedClass) {
      s.loc[p] = Loc{};
      continue;
    }
    auto loc = TakeSlot(s, static_cast<KvPrecision>(s.host_class[p]));
    if (!loc.ok()) {
      // Bytes were ensured above, but a device pool may still refuse a page (a fragmented
      // arena): the slots taken so far go back and the sequence stays swapped out.
      s.loc.resize(p);
      for (const Loc& taken : s.loc) ReleaseLoc(s, taken);
      s.loc.clear();
      s.open.fill(-1);
      return loc.status();
    }
    s.loc[p] = *loc;
    stored.push_back(*loc);
  }
  if (absl::Status st = pool_->WriteSlots(stored, s.host_rows.data()); !st.ok()) {
    // The host copy stays authoritative: give the slots back, still swapped out.
    for (const Loc& loc : s.loc) ReleaseLoc(s, loc);
    s.loc.clear();
    s.open.fill(-1);
    return st;
  }
  host_bytes_ -= static_cast<int64_t>(s.host_rows.size());
  s.host_rows.clear();
  s.host_rows.shrink_to_fit();
  s.host_class.clear();
  s.swapped = false;
  return absl::OkStatus();
}

KvUsage KvStore::Usage() const {
  KvUsage u;
  u.bytes = class_bytes_;
  u.capacity_bytes = config_.capacity_bytes;
  u.used_bytes = used_bytes_;
  u.host_bytes = host_bytes_;
  u.evicted_tokens = evicted_tokens_;
  u.pages = live_pages_;
  u.cached_prefix_pages = static_cast<int64_t>(prefix_cache_.size());
  u.cache_only_bytes = AvailableBytes() - FreeBytes();
  for (const auto& [id, s] : seqs_) {
    auto t = SequenceTokens(id);
    for (int c = 0; c < kNumKvPrecisions; ++c) u.tokens[c] += t[c];
  }
  return u;
}

std::optional<KvPrecision> KvStore::PositionClass(SeqId seq, int32_t pos) const {
  auto it = seqs_.find(seq);
  if (it == seqs_.end() || it->second->swapped || pos < 0 ||
      pos >= static_cast<int32_t>(it->second->loc.size())) {
    return std::nullopt;
  }
  const int32_t page = it->second->loc[pos].page;
  if (page < 0) return std::nullopt;
  return pages_[page]->prec;
}

std::array<int64_t, kKvClasses> KvStore::SequenceTokens(SeqId seq) const {
  std::array<int64_t, kNumKvPrecisions> t{};
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return t;
  const Sequence& s = *it->second;
  if (s.swapped) {
    for (uint8_t c : s.host_class) {
      if (c != kvstore_internal::kEvictedClass) ++t[c];
    }
    return t;
  }
  for (int32_t p = 0; p < s.length; ++p) {
    if (s.loc[p].page >= 0) ++t[static_cast<int>(pages_[s.loc[p].page]->prec)];
  }
  return t;
}

}  // namespace specnode
