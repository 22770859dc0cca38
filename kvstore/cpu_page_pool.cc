#include "kvstore/cpu_page_pool.h"

#include <algorithm>
#include <cassert>
#include <cstring>
#include <utility>

#include "kvstore/kv_attention_kernels.h"
#include "model/llama/cpu_kv_cache.h"

namespace specnode {

CpuPagePool::CpuPagePool(const KvPoolGeometry& geometry, bool rotate)
    : g_(geometry),
      rotate_(rotate && IsPowerOfTwo(geometry.head_dim)),
      kernels_(&kv_kernels::SelectedKvKernels(geometry.head_dim)) {
  for (int p = 0; p < kNumKvPrecisions; ++p) {
    row_bytes_[p] = KvRowBytes(static_cast<KvPrecision>(p), g_.head_dim);
  }
}

CpuPagePool::~CpuPagePool() = default;

KvPoolCaps CpuPagePool::Caps(int head_dim, std::optional<bool> rotate) {
  KvPoolCaps c;
  c.classes = {true, true, true};
  c.rotated = rotate.value_or(true) && IsPowerOfTwo(head_dim);
  c.slot_copies = true;
  c.page_order = false;
  return c;
}

KvPoolCaps CpuPagePool::caps() const {
  KvPoolCaps c = Caps(g_.head_dim, rotate_);
  c.rotated = rotate_;
  return c;
}

size_t CpuPagePool::SlotStride(KvPrecision p) const {
  return row_bytes_[static_cast<int>(p)] * 2 * g_.n_kv_heads;
}

size_t CpuPagePool::PageBytes(KvPrecision p) const {
  return SlotStride(p) * g_.page_tokens * g_.n_layers;
}

size_t CpuPagePool::SlotBytes(KvPrecision p) const { return SlotStride(p) * g_.n_layers; }

absl::Status CpuPagePool::AllocatePage(int32_t id, KvPrecision p) {
  if (id >= static_cast<int32_t>(pages_.size())) pages_.resize(id + 1);
  assert(pages_[id] == nullptr);
  auto page = std::make_unique<Page>();
  page->prec = p;
  page->data.assign(PageBytes(p), 0);
  pages_[id] = std::move(page);
  return absl::OkStatus();
}

void CpuPagePool::ReleasePage(int32_t id) { pages_[id].reset(); }

const uint8_t* CpuPagePool::Row(KvSlot s, int layer, int kv_head, bool value) const {
  const Page& pg = *pages_[s.page];
  const size_t rb = row_bytes_[static_cast<int>(pg.prec)];
  const size_t off = (static_cast<size_t>(layer) * g_.page_tokens + s.slot) * SlotStride(pg.prec) +
                     (2 * static_cast<size_t>(kv_head) + (value ? 1 : 0)) * rb;
  return pg.data.data() + off;
}

uint8_t* CpuPagePool::Row(KvSlot s, int layer, int kv_head, bool value) {
  return const_cast<uint8_t*>(std::as_const(*this).Row(s, layer, kv_head, value));
}

void CpuPagePool::Recode(KvSlot from, KvSlot to) {
  const KvPrecision target = pages_[to.page]->prec;
  std::vector<float> row(g_.head_dim);
  for (int l = 0; l < g_.n_layers; ++l) {
    for (int h = 0; h < g_.n_kv_heads; ++h) {
      for (bool value : {false, true}) {
        // Both rows are in the stored (rotated) basis: no rotation here.
        KvDecodeRow(pages_[from.page]->prec, Row(from, l, h, value), g_.head_dim, row.data());
        KvEncodeRow(target, row.data(), g_.head_dim, Row(to, l, h, value));
      }
    }
  }
}

void CpuPagePool::ReadSlot(KvSlot s, uint8_t* host) const {
  const size_t stride = SlotStride(pages_[s.page]->prec);
  for (int l = 0; l < g_.n_layers; ++l) {
    std::memcpy(host + l * stride, Row(s, l, 0, false), stride);
  }
}

void CpuPagePool::WriteSlot(KvSlot s, const uint8_t* host) {
  const size_t stride = SlotStride(pages_[s.page]->prec);
  for (int l = 0; l < g_.n_layers; ++l) {
    std::memcpy(Row(s, l, 0, false), host + l * stride, stride);
  }
}

absl::Status CpuPagePool::BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool* threads) {
  pass_.assign(seqs.begin(), seqs.end());
  first_ = FirstRows<KvPoolPassSeq>(pass_);
  threads_ = threads;
  return absl::OkStatus();
}

absl::Status CpuPagePool::Write(int layer, const float* k, const float* v) {
  const int64_t row = static_cast<int64_t>(g_.n_kv_heads) * g_.head_dim;
  // Sequences own disjoint slots, so they are written concurrently (rotation and encoding
  // per row are the work).
  ForEachPassSequence(threads_, static_cast<int64_t>(pass_.size()), [&](int64_t i) {
    WriteSeq(pass_[i], layer, k + first_[i] * row, v + first_[i] * row);
  });
  return absl::OkStatus();
}

absl::Status CpuPagePool::Attend(int layer, const float* q, float scale, float* out) {
  const int64_t row = static_cast<int64_t>(g_.n_kv_heads) * g_.gqa_group * g_.head_dim;
  ForEachPassHead(
      threads_, static_cast<int64_t>(pass_.size()), g_.n_kv_heads, [&](int64_t i, int kv_head) {
        AttendSeq(pass_[i], layer, kv_head, q + first_[i] * row, scale, out + first_[i] * row);
      });
  return absl::OkStatus();
}

void CpuPagePool::WriteSeq(const KvPoolPassSeq& s, int layer, const float* k, const float* v) {
  const int hd = g_.head_dim;
  std::vector<float> rk(hd), rv(hd);
  for (int32_t i = 0; i < s.n; ++i) {
    const KvSlot slot = s.slots[s.pos0 + i];
    const KvPrecision p = pages_[slot.page]->prec;
    for (int h = 0; h < g_.n_kv_heads; ++h) {
      const size_t off = (static_cast<size_t>(i) * g_.n_kv_heads + h) * hd;
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
      if (p == KvPrecision::kFull) {
        // The same bytes as KvEncodeRow, with the table's F16C encoder.
        kernels_->encode_f16(kr, hd, Row(slot, layer, h, false));
        kernels_->encode_f16(vr, hd, Row(slot, layer, h, true));
      } else {
        KvEncodeRow(p, kr, hd, Row(slot, layer, h, false));
        KvEncodeRow(p, vr, hd, Row(slot, layer, h, true));
      }
    }
  }
}

namespace {

// AttendSeq's working memory, per thread (different kv heads may run concurrently).
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
// normalisation is applied once to the output).
void CpuPagePool::AttendSeq(const KvPoolPassSeq& s, int layer, int kv_head, const float* q,
                            float scale, float* out) {
  const kv_kernels::KvAttentionKernels& kern = *kernels_;
  const int hd = g_.head_dim;
  const int g = g_.gqa_group;
  const int n_heads = g_.n_kv_heads * g;
  const int32_t pos0 = s.pos0;
  const int32_t n = s.n;
  const int32_t n_ctx_max = pos0 + n;
  AttendScratch& sc = Scratch();
  // Row(slot, layer, kv_head, false) is data + base[c] + slot * stride[c] (inlined: this
  // loop visits every cached position of every layer and head).
  std::array<size_t, kNumKvPrecisions> base{}, stride{};
  std::array<int, kNumKvPrecisions> count{};
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    const KvPrecision p = static_cast<KvPrecision>(c);
    stride[c] = SlotStride(p);
    base[c] = static_cast<size_t>(layer) * g_.page_tokens * stride[c] +
              2 * static_cast<size_t>(kv_head) * row_bytes_[c];
    sc.pos[c].resize(n_ctx_max);
    sc.k[c].resize(n_ctx_max);
    sc.v[c].resize(n_ctx_max);
  }
  for (int32_t j = 0; j < n_ctx_max; ++j) {
    const KvSlot loc = s.slots[j];
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
  const int32_t min_distance = s.mass.min_distance;
  std::array<int, kNumKvPrecisions> len{}, off{};
  // The sink's rows, one per observed query in row order (the manager sampled them by
  // position: a sequence observes the same queries whether it decodes one token per step,
  // verifies drafts or prefills).
  size_t next_observed = 0;
  for (int32_t i = 0; i < n; ++i) {
    const int32_t n_ctx = pos0 + i + 1;
    const KvMassRow* observed = nullptr;
    if (s.mass.on && next_observed < s.mass.rows.size() &&
        s.mass.rows[next_observed].pos == n_ctx - 1) {
      observed = &s.mass.rows[next_observed++];
    }
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
      if (observed != nullptr) {
        const int32_t* p = sc.pos[c].data();
        const int32_t width = n_ctx - min_distance - observed->lo;
        mass.sum = observed->sum + static_cast<size_t>(kv_head) * width;
        mass.cnt = observed->cnt + static_cast<size_t>(kv_head) * width;
        mass.pos = p;
        mass.first = static_cast<int>(std::lower_bound(p, p + len[c], observed->lo) - p);
        mass.n = static_cast<int>(std::lower_bound(p, p + len[c], n_ctx - min_distance) - p);
        mass.base = observed->lo;
        mass.weight = static_cast<float>(n_ctx);
        mass.inv = sc.inv.data();
      }
      kern.accumulate(static_cast<KvPrecision>(c), sc.v[c].data(), len[c],
                      sc.scores.data() + off[c], ld, g, hd, sc.acc.data(),
                      observed != nullptr ? &mass : nullptr);
    }
    float* oi = out + (static_cast<size_t>(i) * n_heads + kv_head * g) * hd;
    for (int h = 0; h < g; ++h) {
      for (int d = 0; d < hd; ++d) oi[h * hd + d] = sc.acc[h * hd + d] * sc.inv[h];
      if (rotate_) HadamardInPlace(oi + h * hd, hd);
    }
  }
}

}  // namespace specnode
