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
    key_bytes_[p] = KvRowBytes(KvRowFormat(static_cast<KvPrecision>(p), false), g_.head_dim);
    pair_bytes_[p] = KvPairBytes(static_cast<KvPrecision>(p), g_.head_dim);
  }
}

CpuPagePool::~CpuPagePool() = default;

KvPoolCaps CpuPagePool::Caps(int head_dim, std::optional<bool> rotate) {
  KvPoolCaps c;
  c.classes = {true, true, true, true};
  c.rotated = rotate.value_or(true) && IsPowerOfTwo(head_dim);
  c.slot_copies = true;
  c.tree_rows = true;
  c.page_order = false;
  return c;
}

KvPoolCaps CpuPagePool::caps() const {
  KvPoolCaps c = Caps(g_.head_dim, rotate_);
  c.rotated = rotate_;
  return c;
}

size_t CpuPagePool::SlotStride(KvPrecision p) const {
  return pair_bytes_[static_cast<int>(p)] * g_.n_kv_heads;
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
  const int c = static_cast<int>(pg.prec);
  const size_t off = (static_cast<size_t>(layer) * g_.page_tokens + s.slot) * SlotStride(pg.prec) +
                     static_cast<size_t>(kv_head) * pair_bytes_[c] + (value ? key_bytes_[c] : 0);
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
        KvDecodeRow(KvRowFormat(pages_[from.page]->prec, value), Row(from, l, h, value),
                    g_.head_dim, row.data());
        KvEncodeRow(KvRowFormat(target, value), row.data(), g_.head_dim, Row(to, l, h, value));
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
  rows_ = RowCounts<KvPoolPassSeq>(pass_);
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

namespace {

// Rows [begin, begin + n) of s as a sequence of their own: the same block table, the mass
// rows of those queries (each query's own sums: no sharing).
KvPoolPassSeq PartOf(const KvPoolPassSeq& s, int32_t begin, int32_t n) {
  KvPoolPassSeq part = s;
  part.pos0 += begin;
  part.n = n;
  auto by_pos = [](const KvMassRow& r, int32_t pos) { return r.pos < pos; };
  const auto& m = s.mass.rows;
  const auto lo = std::lower_bound(m.begin(), m.end(), part.pos0, by_pos);
  const auto hi = std::lower_bound(lo, m.end(), part.pos0 + part.n, by_pos);
  part.mass.rows = m.subspan(lo - m.begin(), hi - lo);
  return part;
}

}  // namespace

absl::Status CpuPagePool::Attend(int layer, const float* q, float scale, int32_t window,
                                 float* out) {
  const int64_t row = static_cast<int64_t>(g_.n_kv_heads) * g_.gqa_group * g_.head_dim;
  ForEachPassHead(
      threads_, rows_, g_.n_kv_heads, [&](int64_t i, int kv_head, int32_t begin, int32_t end) {
        if (!pass_[i].parents.empty()) {
          for (int32_t r = begin; r < end; ++r) {
            AttendTreeRow(pass_[i], r, layer, kv_head, q + (first_[i] + r) * row, scale, window,
                          out + (first_[i] + r) * row);
          }
          return;
        }
        AttendSeq(PartOf(pass_[i], begin, end - begin), layer, kv_head,
                  q + (first_[i] + begin) * row, scale, window, out + (first_[i] + begin) * row);
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
        KvEncodeRow(KvRowFormat(p, false), kr, hd, Row(slot, layer, h, false));
        KvEncodeRow(KvRowFormat(p, true), vr, hd, Row(slot, layer, h, true));
      }
    }
  }
}

namespace {

// Query tokens of one sequence asked together (per kv head): each cached row is read once
// per block for all of them. 16 tokens of a GQA group of 3 are 48 heads, whose scores
// ([48, context] floats) stay in L2 for contexts of a few thousand.
constexpr int kQueryBlock = 16;

// AttendSeq's working memory, per thread (different kv heads may run concurrently). A block
// of nq query tokens has nh = nq * g heads, head qi * g + h being token qi's query head h.
struct AttendScratch {
  // Per class, the positions of that class in position order and their K / V rows.
  std::array<std::vector<int32_t>, kNumKvPrecisions> pos;
  std::array<std::vector<const uint8_t*>, kNumKvPrecisions> k, v;
  // Per class, [nh]: how many of the class's rows each head sees (its token's causal prefix).
  std::array<std::vector<int>, kNumKvPrecisions> rows;
  std::vector<float> scores;  // [nh, ld]: scores, then exp(score - max); class c from column off[c]
  std::vector<float> q;       // [nh, head_dim]: rotated, scaled queries
  std::vector<float> qsum;    // [nh]
  std::vector<float> acc;     // [nh, head_dim]: Σ e * v before normalisation
  std::vector<float> inv;     // [nh]: 1 / Σ e
};

AttendScratch& Scratch() {
  thread_local AttendScratch scratch;
  return scratch;
}

using ClassOffsets = std::array<int, kNumKvPrecisions>;

// exp_sum of one head's scores laid out as the token alone lays them out — its classes back
// to back (`own`) rather than at the block's columns (`off`), since exp_sum's order of
// summation depends on where each score sits — then moved back to the block's columns.
// Returns 1 / Σ e.
float SoftmaxOfHead(const kv_kernels::KvAttentionKernels& kern, float* row, const ClassOffsets& off,
                    const ClassOffsets& rows) {
  ClassOffsets own{};
  int total = 0;
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    own[c] = total;
    if (own[c] != off[c] && rows[c] > 0) {
      std::memmove(row + own[c], row + off[c], sizeof(float) * rows[c]);  // leftwards
    }
    total += rows[c];
  }
  assert(total > 0);  // the query's own position is never evicted
  const float inv = 1.0f / kern.exp_sum(row, total);
  for (int c = kNumKvPrecisions - 1; c >= 0; --c) {  // rightwards, last class first
    if (own[c] != off[c] && rows[c] > 0) {
      std::memmove(row + off[c], row + own[c], sizeof(float) * rows[c]);
    }
  }
  return inv;
}

}  // namespace

// Each block of query tokens attends over its context class by class: the cached positions
// are grouped by precision class (in position order within a class), the kernels score and
// accumulate each group in its stored format for every head of the block at once (a token
// skips the rows after its own position), and each head's softmax runs over all of its
// rows (its normalisation is applied once to the output). Every number a token gets is the
// one it gets asked alone: the kernels compute a (row, head) score independently of the
// other heads, accumulate skips rather than zero-weights the rows a token does not see, and
// the softmax sees the token's own layout.
void CpuPagePool::AttendSeq(const KvPoolPassSeq& s, int layer, int kv_head, const float* q,
                            float scale, int32_t window, float* out) {
  if (window <= 0 || s.pos0 + s.n <= window) {
    AttendFrom(s, layer, kv_head, q, scale, 0, out);
    return;
  }
  // A sliding window: the queries whose whole prefix is inside it go in blocks as usual;
  // each later one alone, over its window only. Either way a query gets what it gets
  // asked alone (the block path's invariant), so batching still changes no result.
  const int64_t row = static_cast<int64_t>(g_.n_kv_heads) * g_.gqa_group * g_.head_dim;
  const int32_t whole = std::clamp(window - s.pos0, 0, s.n);
  if (whole > 0) AttendFrom(PartOf(s, 0, whole), layer, kv_head, q, scale, 0, out);
  for (int32_t i = whole; i < s.n; ++i) {
    AttendFrom(PartOf(s, i, 1), layer, kv_head, q + i * row, scale, s.pos0 + i + 1 - window,
               out + i * row);
  }
}

void CpuPagePool::AttendTreeRow(const KvPoolPassSeq& s, int32_t r, int layer, int kv_head,
                                const float* q, float scale, int32_t window, float* out) {
  thread_local std::vector<int32_t> path;
  TreeRowPath(s.parents, r, &path);
  KvPoolPassSeq one = s;
  one.pos0 = s.pos0 + static_cast<int32_t>(path.size()) - 1;  // the row's position
  one.n = 1;
  one.mass.rows = {};
  for (size_t m = 0; m < s.mass.rows.size(); ++m) {
    if (s.mass.rows[m].row == r) one.mass.rows = s.mass.rows.subspan(m, 1);
  }
  const int32_t lo = window > 0 ? std::max(0, one.pos0 + 1 - window) : 0;
  AttendFrom(one, layer, kv_head, q, scale, lo, out, path);
}

void CpuPagePool::AttendFrom(const KvPoolPassSeq& s, int layer, int kv_head, const float* q,
                             float scale, int32_t lo, float* out, std::span<const int32_t> path) {
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
              static_cast<size_t>(kv_head) * pair_bytes_[c];
    sc.pos[c].resize(n_ctx_max);
    sc.k[c].resize(n_ctx_max);
    sc.v[c].resize(n_ctx_max);
  }
  // Position `pos`, stored in slot table entry `j` (the same but for a tree row's path).
  auto gather = [&](int32_t j, int32_t pos) {
    const KvSlot loc = s.slots[j];
    if (loc.page < 0) return;  // evicted
    const Page& pg = *pages_[loc.page];
    const int c = static_cast<int>(pg.prec);
    const uint8_t* k_row = pg.data.data() + base[c] + static_cast<size_t>(loc.slot) * stride[c];
    const int i = count[c]++;
    sc.pos[c][i] = pos;
    sc.k[c][i] = k_row;
    sc.v[c][i] = k_row + key_bytes_[c];  // V follows K (Row's layout)
  };
  if (path.empty()) {
    for (int32_t j = lo; j < n_ctx_max; ++j) gather(j, j);
  } else {
    const int32_t first_row = pos0 + 1 - static_cast<int32_t>(path.size());  // the pass's pos0
    for (int32_t j = lo; j < first_row; ++j) gather(j, j);
    for (size_t d = 0; d < path.size(); ++d) {
      const int32_t pos = first_row + static_cast<int32_t>(d);
      if (pos >= lo) gather(first_row + path[d], pos);
    }
  }
  const int32_t min_distance = s.mass.min_distance;
  ClassOffsets len{};  // rows of each class the latest token sees
  // The sink's rows, one per observed query in row order (the manager sampled them by
  // position: a sequence observes the same queries whether it decodes one token per step,
  // verifies drafts or prefills).
  size_t next_observed = 0;
  for (int32_t i0 = 0; i0 < n; i0 += kQueryBlock) {
    const int nq = std::min<int32_t>(kQueryBlock, n - i0);
    const int nh = nq * g;
    for (int c = 0; c < kNumKvPrecisions; ++c) sc.rows[c].resize(nh);
    for (int qi = 0; qi < nq; ++qi) {
      const int32_t n_ctx = pos0 + i0 + qi + 1;
      for (int c = 0; c < kNumKvPrecisions; ++c) {
        while (len[c] < count[c] && sc.pos[c][len[c]] < n_ctx) ++len[c];
        std::fill_n(sc.rows[c].begin() + qi * g, g, len[c]);
      }
    }
    // The block's columns: each class as wide as its last token sees it.
    ClassOffsets off{};
    int width = 0;
    for (int c = 0; c < kNumKvPrecisions; ++c) {
      off[c] = width;
      width += len[c];
    }
    const size_t ld = (static_cast<size_t>(width) + kv_kernels::kScoresPad - 1) /
                      kv_kernels::kScoresPad * kv_kernels::kScoresPad;
    sc.scores.resize(static_cast<size_t>(nh) * ld);
    sc.q.resize(static_cast<size_t>(nh) * hd);
    sc.qsum.resize(nh);
    sc.acc.assign(static_cast<size_t>(nh) * hd, 0.0f);
    sc.inv.resize(nh);
    for (int qi = 0; qi < nq; ++qi) {
      const float* qi_src = q + (static_cast<size_t>(i0 + qi) * n_heads + kv_head * g) * hd;
      std::copy(qi_src, qi_src + static_cast<size_t>(g) * hd,
                sc.q.begin() + static_cast<size_t>(qi) * g * hd);
    }
    for (int h = 0; h < nh; ++h) {
      float* qh = sc.q.data() + static_cast<size_t>(h) * hd;
      if (rotate_) HadamardInPlace(qh, hd);
      float sum = 0.0f;
      for (int d = 0; d < hd; ++d) {
        qh[d] *= scale;
        sum += qh[d];
      }
      sc.qsum[h] = sum;
    }
    const kv_kernels::KvQuery query{sc.q.data(), sc.qsum.data(), nh, hd};
    for (int c = 0; c < kNumKvPrecisions; ++c) {
      if (len[c] > 0) {
        kern.scores(KvRowFormat(static_cast<KvPrecision>(c), false), sc.k[c].data(), len[c], query,
                    sc.scores.data() + off[c], ld);
      }
    }
    for (int h = 0; h < nh; ++h) {
      ClassOffsets rows{};
      for (int c = 0; c < kNumKvPrecisions; ++c) rows[c] = sc.rows[c][h];
      sc.inv[h] = SoftmaxOfHead(kern, sc.scores.data() + h * ld, off, rows);
    }
    for (int c = 0; c < kNumKvPrecisions; ++c) {
      if (len[c] == 0) continue;
      kern.accumulate(KvRowFormat(static_cast<KvPrecision>(c), true), sc.v[c].data(), len[c],
                      sc.scores.data() + off[c], ld, nh, hd, sc.rows[c].data(), sc.acc.data());
    }
    for (int qi = 0; qi < nq; ++qi) {
      const int32_t n_ctx = pos0 + i0 + qi + 1;
      if (!s.mass.on || next_observed >= s.mass.rows.size() ||
          s.mass.rows[next_observed].pos != n_ctx - 1) {
        continue;
      }
      const KvMassRow& observed = s.mass.rows[next_observed++];
      // sum[j - lo] += n_ctx * Σ_h e[h, j] * inv[h] over the token's heads for its keys j in
      // [lo, n_ctx - min_distance) (mass relative to a uniform share), cnt[j - lo] += g.
      const int32_t mass_width = n_ctx - min_distance - observed.lo;
      float* sum = observed.sum + static_cast<size_t>(kv_head) * mass_width;
      float* cnt = observed.cnt + static_cast<size_t>(kv_head) * mass_width;
      const float weight = static_cast<float>(n_ctx);
      const float* inv = sc.inv.data() + qi * g;
      for (int c = 0; c < kNumKvPrecisions; ++c) {
        const int32_t* p = sc.pos[c].data();
        const int rows = sc.rows[c][qi * g];
        const int first = static_cast<int>(std::lower_bound(p, p + rows, observed.lo) - p);
        const int end = static_cast<int>(std::lower_bound(p, p + rows, n_ctx - min_distance) - p);
        const float* e = sc.scores.data() + static_cast<size_t>(qi) * g * ld + off[c];
        for (int r = first; r < end; ++r) {
          float m = 0.0f;
          for (int h = 0; h < g; ++h) m += e[h * ld + r] * inv[h];
          sum[p[r] - observed.lo] += weight * m;
          cnt[p[r] - observed.lo] += static_cast<float>(g);
        }
      }
    }
    for (int qi = 0; qi < nq; ++qi) {
      float* oi = out + (static_cast<size_t>(i0 + qi) * n_heads + kv_head * g) * hd;
      for (int h = 0; h < g; ++h) {
        const int hh = qi * g + h;
        for (int d = 0; d < hd; ++d) oi[h * hd + d] = sc.acc[hh * hd + d] * sc.inv[hh];
        if (rotate_) HadamardInPlace(oi + h * hd, hd);
      }
    }
  }
}

}  // namespace specnode
