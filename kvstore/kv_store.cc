#include "kvstore/kv_store.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "kvstore/kv_attention_kernels.h"
#include "kvstore/kv_store_internal.h"

namespace specnode {

std::string_view KvModeName(KvMode m) {
  switch (m) {
    case KvMode::kFull:
      return "full";
    case KvMode::kInt8:
      return "int8";
    case KvMode::kInt4:
      return "int4";
    case KvMode::kMixed:
      return "mixed";
  }
  return "?";
}

absl::StatusOr<KvMode> ParseKvMode(std::string_view name) {
  for (KvMode m : {KvMode::kFull, KvMode::kInt8, KvMode::kInt4, KvMode::kMixed}) {
    if (KvModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV mode '", std::string(name), "' (full, int8, int4, mixed)"));
}

absl::StatusOr<std::unique_ptr<KvStore>> KvStore::Create(const KvStoreConfig& c) {
  auto bad = [](const std::string& what) { return absl::InvalidArgumentError("kvstore: " + what); };
  if (c.n_layers < 1 || c.n_kv_heads < 1 || c.gqa_group < 1)
    return bad("n_layers, n_kv_heads and gqa_group must be >= 1");
  if (c.head_dim < 2 || c.head_dim % 2 != 0 || c.head_dim > 256)
    return bad("head_dim must be even and in [2, 256]");
  if (c.max_seq_len < 1) return bad("max_seq_len must be >= 1");
  if (c.page_tokens < 1 || c.page_tokens > 4096) return bad("page_tokens must be in [1, 4096]");
  if (c.sink_tokens < 0) return bad("sink_tokens must be >= 0");
  if (c.window_tokens < 1) return bad("window_tokens must be >= 1");
  if (c.mass_sample_every < 1) return bad("mass_sample_every must be >= 1");
  if (!(c.critical_threshold >= 0.0f)) return bad("critical_threshold must be >= 0");
  if (c.evict && c.evict_window < c.window_tokens)
    return bad("evict_window must be >= window_tokens");
  if (c.host_capacity_bytes < 0) return bad("host_capacity_bytes must be >= 0");
  std::unique_ptr<KvStore> s(new KvStore(c));
  const int64_t biggest = static_cast<int64_t>(s->PageBytes(KvPrecision::kFull));
  if (c.capacity_bytes < 2 * biggest) {
    return bad(absl::StrFormat("capacity_bytes %d is below two full-precision pages (%d bytes)",
                               c.capacity_bytes, 2 * biggest));
  }
  return s;
}

KvStore::KvStore(const KvStoreConfig& c)
    : CpuKvCache(c.n_kv_heads, c.head_dim, c.gqa_group),
      config_(c),
      rotate_(c.rotate && IsPowerOfTwo(c.head_dim)),
      kernels_(&kv_kernels::SelectedKvKernels(c.head_dim)) {
  for (int p = 0; p < kNumKvPrecisions; ++p) {
    row_bytes_[p] = KvRowBytes(static_cast<KvPrecision>(p), c.head_dim);
    page_bytes_[p] = row_bytes_[p] * 2 * c.n_kv_heads * c.page_tokens * c.n_layers;
  }
}

KvStore::~KvStore() = default;

size_t KvStore::SlotStride(KvPrecision p) const {
  return row_bytes_[static_cast<int>(p)] * 2 * config_.n_kv_heads;
}

const uint8_t* KvStore::Row(int32_t page, int32_t slot, int layer, int kv_head, bool value) const {
  const Page& pg = *pages_[page];
  const size_t rb = row_bytes_[static_cast<int>(pg.prec)];
  const size_t off =
      (static_cast<size_t>(layer) * config_.page_tokens + slot) * SlotStride(pg.prec) +
      (2 * static_cast<size_t>(kv_head) + (value ? 1 : 0)) * rb;
  return pg.data.data() + off;
}

uint8_t* KvStore::Row(int32_t page, int32_t slot, int layer, int kv_head, bool value) {
  return const_cast<uint8_t*>(std::as_const(*this).Row(page, slot, layer, kv_head, value));
}

KvPrecision KvStore::WriteClass() const {
  switch (config_.mode) {
    case KvMode::kInt8:
      return KvPrecision::kInt8;
    case KvMode::kInt4:
      return KvPrecision::kInt4;
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
  for (auto it = lru_.end(); FreeBytes() < bytes && it != lru_.begin();) {
    --it;
    auto entry = prefix_cache_.find(*it);
    const int32_t page = entry->second.page;
    if (pages_[page]->ref != 1) continue;
    pages_[page]->cached = false;
    prefix_cache_.erase(entry);
    it = lru_.erase(it);
    Unref(page);
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
  auto page = std::make_unique<Page>();
  page->prec = p;
  page->ref = 1;
  page->data.assign(bytes, 0);
  pages_[id] = std::move(page);
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
  free_ids_.push_back(page);
}

absl::StatusOr<KvStore::Loc> KvStore::TakeSlot(Sequence& s, KvPrecision p) {
  const int c = static_cast<int>(p);
  int32_t page = s.open[c];
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
  // The tail slot of a private open page is reused; any other slot just goes dead.
  if (pg.ref == 1 && s.open[c] == loc.page && loc.slot == pg.used - 1) --pg.used;
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
  if (s != nullptr) {
    const int32_t open = s->open[static_cast<int>(p)];
    if (open >= 0) room = config_.page_tokens - pages_[open]->used;
  }
  const int64_t rest = std::max<int64_t>(0, n - room);
  return (rest + config_.page_tokens - 1) / config_.page_tokens;
}

int64_t KvStore::BytesForTokens(int64_t n) const {
  return (PagesNeeded(nullptr, WriteClass(), n) + 1) *
         static_cast<int64_t>(PageBytes(WriteClass()));
}

int32_t KvStore::Length(SeqId seq) const {
  auto it = seqs_.find(seq);
  return it == seqs_.end() ? 0 : it->second->length;
}

absl::Status KvStore::Reserve(SeqId seq, int32_t n_new) {
  if (n_new < 0) return absl::InvalidArgumentError("negative reservation");
  auto it = seqs_.find(seq);
  Sequence* s = it == seqs_.end() ? nullptr : it->second.get();
  if (s != nullptr && s->swapped) {
    return absl::FailedPreconditionError(absl::StrCat("sequence ", seq, " is swapped out"));
  }
  const int64_t length = s == nullptr ? 0 : s->length;
  const int64_t need = length + n_new;
  if (need > config_.max_seq_len) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "sequence of %d tokens exceeds the context length %d", need, config_.max_seq_len));
  }
  const int64_t have = s == nullptr ? 0 : static_cast<int64_t>(s->loc.size());
  const int64_t extra = std::max<int64_t>(0, need - have);
  const KvPrecision wc = WriteClass();
  int64_t bytes = PagesNeeded(s, wc, extra) * static_cast<int64_t>(PageBytes(wc));
  // Room for the demotions the next Commit will make (worst case: all to INT8, one
  // partly filled page per class).
  int64_t demote_bytes = 0;
  if (config_.mode == KvMode::kMixed) {
    const int64_t from = std::max<int64_t>(config_.sink_tokens, s == nullptr ? 0 : s->demoted_upto);
    const int64_t demote = std::max<int64_t>(0, need - config_.window_tokens - from);
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
  if (s == nullptr) {
    auto fresh = std::make_unique<Sequence>();
    fresh->mass_sum.resize(config_.n_kv_heads);
    fresh->mass_cnt.resize(config_.n_kv_heads);
    s = fresh.get();
    seqs_[seq] = std::move(fresh);
  }
  SetPendingBytes(*s, 0);  // re-counted below; the bytes were ensured including it
  for (int64_t i = 0; i < extra; ++i) {
    auto loc = TakeSlot(*s, wc);
    assert(loc.ok());  // bytes were ensured above
    s->loc.push_back(*loc);
  }
  SetPendingBytes(*s, demote_bytes);
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    s->mass_sum[h].resize(s->loc.size(), 0.0f);
    s->mass_cnt[h].resize(s->loc.size(), 0.0f);
  }
  return absl::OkStatus();
}

void KvStore::WriteSeq(SeqId seq, int layer, int32_t pos0, int32_t n, const float* k,
                       const float* v) {
  Sequence& s = *seqs_.at(seq);
  const int hd = config_.head_dim;
  std::vector<float> rk(hd), rv(hd);
  for (int32_t i = 0; i < n; ++i) {
    const Loc loc = s.loc[pos0 + i];
    const KvPrecision p = pages_[loc.page]->prec;
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      const size_t off = (static_cast<size_t>(i) * config_.n_kv_heads + h) * hd;
      const float* kr = k + off;
      const float* vr = v + off;
      if (rotate_) {
        std::copy(kr, kr + hd, rk.begin());
        std::copy(vr, vr + hd, rv.begin());
        HadamardInPlace(rk.data(), hd);
        HadamardInPlace(rv.data(), hd);
        kr = rk.data();
        vr = rv.data();
      }
      KvEncodeRow(p, kr, hd, Row(loc.page, loc.slot, layer, h, false));
      KvEncodeRow(p, vr, hd, Row(loc.page, loc.slot, layer, h, true));
    }
  }
}

namespace {

// Attend's working memory, per thread (Attend for different kv heads may run concurrently).
struct AttendScratch {
  // Per class, the positions of that class in position order and their K / V rows.
  std::array<std::vector<int32_t>, kNumKvPrecisions> pos;
  std::array<std::vector<const uint8_t*>, kNumKvPrecisions> k, v;
  std::vector<float> scores;  // [g, ld]: scores, then exp(score - max)
  std::vector<float> q;       // [g, head_dim]: rotated, scaled query
  std::vector<float> qsum;    // [g]
  std::vector<float> acc;     // [g, head_dim]: Σ e * v before normalisation
  std::vector<float> inv;     // [g]: 1 / Σ e
};

AttendScratch& Scratch() {
  thread_local AttendScratch scratch;
  return scratch;
}

}  // namespace

// Each query token attends over its context class by class: the cached positions are
// grouped by precision class (in position order within a class), the kernels score and
// accumulate each group in its stored format, and the softmax runs over all of them (its
// normalisation is applied once to the output). Which positions a query sees, and so the
// groups it hands the kernels, depends only on the block table and its own position, so
// the result does not depend on the batch or on other queries of the call.
void KvStore::AttendSeq(SeqId seq, int layer, int32_t pos0, int32_t n, int kv_head,
                        const float* q, float scale, float* out) {
  Sequence& s = *seqs_.at(seq);
  assert(!s.swapped);
  const kv_kernels::KvAttentionKernels& kern = *kernels_;
  const int hd = config_.head_dim;
  const int g = config_.gqa_group;
  const int n_heads = config_.n_kv_heads * g;
  const int32_t n_ctx_max = pos0 + n;
  AttendScratch& sc = Scratch();
  // Row(page, slot, layer, kv_head, false) is data + base[c] + slot * stride[c] (inlined:
  // this loop visits every cached position of every layer and head).
  std::array<size_t, kNumKvPrecisions> base{}, stride{};
  std::array<int, kNumKvPrecisions> count{};
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    const KvPrecision p = static_cast<KvPrecision>(c);
    stride[c] = SlotStride(p);
    base[c] = static_cast<size_t>(layer) * config_.page_tokens * stride[c] +
              2 * static_cast<size_t>(kv_head) * row_bytes_[c];
    sc.pos[c].resize(n_ctx_max);
    sc.k[c].resize(n_ctx_max);
    sc.v[c].resize(n_ctx_max);
  }
  for (int32_t j = 0; j < n_ctx_max; ++j) {
    const Loc loc = s.loc[j];
    if (loc.page < 0) continue;  // evicted
    const Page& pg = *pages_[loc.page];
    const int c = static_cast<int>(pg.prec);
    const uint8_t* k_row = pg.data.data() + base[c] + static_cast<size_t>(loc.slot) * stride[c];
    const int i = count[c]++;
    sc.pos[c][i] = j;
    sc.k[c][i] = k_row;
    sc.v[c][i] = k_row + row_bytes_[c];  // V follows K (Row's layout)
  }
  const size_t ld = (static_cast<size_t>(n_ctx_max) + kv_kernels::kScoresPad - 1) /
                    kv_kernels::kScoresPad * kv_kernels::kScoresPad;
  sc.scores.resize(static_cast<size_t>(g) * ld);
  sc.q.resize(static_cast<size_t>(g) * hd);
  sc.qsum.resize(g);
  sc.acc.resize(static_cast<size_t>(g) * hd);
  sc.inv.resize(g);
  const kv_kernels::KvQuery query{sc.q.data(), sc.qsum.data(), g, hd};
  const int32_t min_distance = config_.window_tokens / 2;
  std::array<int, kNumKvPrecisions> len{}, off{};
  for (int32_t i = 0; i < n; ++i) {
    const int32_t n_ctx = pos0 + i + 1;
    const float* qi = q + (static_cast<size_t>(i) * n_heads + kv_head * g) * hd;
    std::copy(qi, qi + static_cast<size_t>(g) * hd, sc.q.begin());
    for (int h = 0; h < g; ++h) {
      float* qh = sc.q.data() + h * hd;
      if (rotate_) HadamardInPlace(qh, hd);
      float sum = 0.0f;
      for (int d = 0; d < hd; ++d) {
        qh[d] *= scale;
        sum += qh[d];
      }
      sc.qsum[h] = sum;
    }
    int total = 0;
    for (int c = 0; c < kNumKvPrecisions; ++c) {
      while (len[c] < count[c] && sc.pos[c][len[c]] < n_ctx) ++len[c];
      off[c] = total;
      total += len[c];
      if (len[c] > 0) {
        kern.scores(static_cast<KvPrecision>(c), sc.k[c].data(), len[c], query,
                    sc.scores.data() + off[c], ld);
      }
    }
    assert(total > 0);  // the query's own position is never evicted
    for (int h = 0; h < g; ++h) sc.inv[h] = 1.0f / kern.exp_sum(sc.scores.data() + h * ld, total);
    std::fill(sc.acc.begin(), sc.acc.end(), 0.0f);
    for (int c = 0; c < kNumKvPrecisions; ++c) {
      if (len[c] == 0) continue;
      kv_kernels::KvMassOut mass;
      // Sampled by the query's position, not by step: a sequence observes the same
      // queries whether it decodes one token per step, verifies drafts or prefills, and a
      // verification pass costs no more per row than a decode step.
      const bool observe = config_.mode == KvMode::kMixed && n_ctx - min_distance > 0 &&
                           (n_ctx - 1) % config_.mass_sample_every == 0;
      if (observe) {
        const int32_t* p = sc.pos[c].data();
        mass.sum = s.mass_sum[kv_head].data();
        mass.cnt = s.mass_cnt[kv_head].data();
        mass.pos = p;
        mass.n = static_cast<int>(std::lower_bound(p, p + len[c], n_ctx - min_distance) - p);
        mass.weight = static_cast<float>(n_ctx);
        mass.inv = sc.inv.data();
      }
      kern.accumulate(static_cast<KvPrecision>(c), sc.v[c].data(), len[c],
                      sc.scores.data() + off[c], ld, g, hd, sc.acc.data(),
                      observe ? &mass : nullptr);
    }
    float* oi = out + (static_cast<size_t>(i) * n_heads + kv_head * g) * hd;
    for (int h = 0; h < g; ++h) {
      for (int d = 0; d < hd; ++d) oi[h * hd + d] = sc.acc[h * hd + d] * sc.inv[h];
      if (rotate_) HadamardInPlace(oi + h * hd, hd);
    }
  }
}

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
  std::vector<float> row(config_.head_dim);
  for (int l = 0; l < config_.n_layers; ++l) {
    for (int h = 0; h < config_.n_kv_heads; ++h) {
      for (bool value : {false, true}) {
        KvDecodeRow(KvPrecision::kFull, Row(old.page, old.slot, l, h, value), config_.head_dim,
                    row.data());
        KvEncodeRow(target, row.data(), config_.head_dim, Row(loc->page, loc->slot, l, h, value));
      }
    }
  }
  s.loc[pos] = *loc;
  ReleaseLoc(s, old);
}

void KvStore::Evict(Sequence& s, int32_t pos) {
  if (s.loc[pos].page < 0) return;
  ReleaseLoc(s, s.loc[pos]);
  s.loc[pos].page = -1;
  ++evicted_tokens_;
}

void KvStore::Commit(SeqId seq, int32_t new_length) {
  Sequence& s = *seqs_.at(seq);
  assert(new_length <= static_cast<int32_t>(s.loc.size()));
  s.length = new_length;
  SetPendingBytes(s, 0);
  if (config_.mode == KvMode::kMixed) {
    const int32_t from = std::max(config_.sink_tokens, s.demoted_upto);
    const int32_t to = new_length - config_.window_tokens;
    for (int32_t p = from; p < to; ++p) Demote(s, p);
    s.demoted_upto = std::max(s.demoted_upto, to);
  }
  if (config_.evict) {
    if (!warned_evict_) {
      std::fprintf(stderr,
                   "kvstore: sliding-window eviction is on: tokens older than %d "
                   "(except %d sinks) are dropped; attention is lossy\n",
                   config_.evict_window, config_.sink_tokens);
      warned_evict_ = true;
    }
    const int32_t from = std::max(config_.sink_tokens, s.evicted_upto);
    const int32_t to = new_length - config_.evict_window;
    for (int32_t p = from; p < to; ++p) Evict(s, p);
    s.evicted_upto = std::max(s.evicted_upto, to);
  }
}

absl::Status KvStore::Truncate(SeqId seq, int32_t n) {
  auto it = seqs_.find(seq);
  const int32_t length = it == seqs_.end() ? 0 : it->second->length;
  if (n < 0 || n > length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("cannot truncate a %d-token sequence to %d", length, n));
  }
  if (it == seqs_.end()) return absl::OkStatus();
  Sequence& s = *it->second;
  if (s.swapped) return absl::FailedPreconditionError("sequence is swapped out");
  for (int32_t p = static_cast<int32_t>(s.loc.size()) - 1; p >= n; --p) ReleaseLoc(s, s.loc[p]);
  s.loc.resize(n);
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    s.mass_sum[h].resize(n);
    s.mass_cnt[h].resize(n);
  }
  s.length = n;
  s.demoted_upto = std::min(s.demoted_upto, n);
  s.evicted_upto = std::min(s.evicted_upto, n);
  SetPendingBytes(s, 0);
  return absl::OkStatus();
}

void KvStore::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  Sequence& s = *it->second;
  for (const Loc& loc : s.loc) ReleaseLoc(s, loc);
  SetPendingBytes(s, 0);
  host_bytes_ -= static_cast<int64_t>(s.host_rows.size());
  seqs_.erase(it);
}

}  // namespace specnode
