#include "cuda/kv_pass_tables.h"

#include <algorithm>
#include <cassert>
#include <vector>

#include "cuda/kv_attention_chunks.h"
#include "model/llama/kv_cache.h"

namespace specnode {

KvPassTables BuildKvPassTables(std::span<const KvPoolPassSeq> seqs,
                               std::span<const KvPagePlace> pages,
                               const std::array<int64_t, kNumKvPrecisions>& slot_stride,
                               const KvPoolGeometry& g) {
  KvPassTables t;
  const int n_heads = g.n_kv_heads * g.gqa_group;
  std::vector<int32_t> path;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const KvPoolPassSeq& s = seqs[i];
    // Slot table entry j's row (offset, class), or class -1 for an evicted position.
    auto emit = [&](int32_t j) {
      const KvSlot loc = s.slots[j];
      if (loc.page < 0) {
        t.tok.insert(t.tok.end(), {0, 0, -1});
        return;
      }
      const KvPagePlace& p = pages[loc.page];
      assert(p.offset >= 0 && loc.slot >= 0 && loc.slot < g.page_tokens);
      const int64_t off = p.offset + loc.slot * slot_stride[p.cls];
      t.tok.insert(t.tok.end(), {static_cast<int32_t>(static_cast<uint32_t>(off & 0xffffffffu)),
                                 static_cast<int32_t>(off >> 32), p.cls});
    };
    // Row r at position pos, its keys from tok entry `base` on (the row's own slot last),
    // observed by `m` (or not).
    auto add_row = [&](int32_t base, int32_t pos, const KvMassRow* m) {
      int32_t lo = 0, width = 0, offset = 0;
      if (m != nullptr) {
        lo = m->lo;
        width = pos + 1 - s.mass.min_distance - m->lo;
        assert(width > 0);
        offset = static_cast<int32_t>(t.mass_floats);
        t.observed.push_back({static_cast<int32_t>(i), t.n_rows(), m});
        t.mass_floats += static_cast<int64_t>(n_heads) * width;
      }
      assert(t.tok[3 * (base + pos) + 2] >= 0);  // a row's own slot is never evicted
      t.rows.insert(t.rows.end(), {base, pos + 1, lo, width, offset});
    };
    if (s.parents.empty()) {
      const int32_t base = static_cast<int32_t>(t.tok.size() / 3);
      for (int32_t j = 0; j < s.pos0 + s.n; ++j) emit(j);
      // The sink's rows, one per observed query in row order (the CPU pool's matching).
      size_t next = 0;
      for (int32_t r = 0; r < s.n; ++r) {
        const int32_t pos = s.pos0 + r;
        const bool observed =
            s.mass.on && next < s.mass.rows.size() && s.mass.rows[next].pos == pos;
        add_row(base, pos, observed ? &s.mass.rows[next++] : nullptr);
      }
      continue;
    }
    // A draft tree: each row its own key list, the cached positions then its path, so the
    // kernels see exactly what the path decoded alone shows them (KvPoolPassSeq::parents).
    // O(pos0) entries per row: a tree's few rows, not a long prefill.
    for (int32_t r = 0; r < s.n; ++r) {
      TreeRowPath(s.parents, r, &path);
      const int32_t base = static_cast<int32_t>(t.tok.size() / 3);
      for (int32_t j = 0; j < s.pos0; ++j) emit(j);
      for (int32_t row : path) emit(s.pos0 + row);
      const KvMassRow* m = nullptr;
      for (const KvMassRow& candidate : s.mass.rows) {
        if (s.mass.on && candidate.row == r) m = &candidate;
      }
      add_row(base, s.pos0 + static_cast<int32_t>(path.size()) - 1, m);
    }
  }
  return t;
}

void AddKvPassMass(const KvPassTables& t, std::span<const KvPoolPassSeq> seqs, const float* mass,
                   const KvPoolGeometry& g, std::span<const int32_t> layer_windows) {
  const int gq = g.gqa_group;
  std::vector<float> count;  // per observed key: gqa_group x the layers that saw it
  for (size_t o = 0; o < t.observed.size(); ++o) {
    const KvMassRow& m = *t.observed[o].sink;
    const int32_t* r = t.rows.data() + t.observed[o].row * KvPassTables::kRowInts;
    const int32_t length = r[1], lo = r[2], width = r[3];
    const float* block = mass + r[4];
    // Every layer sees every key, except a windowed one the keys before its window's start
    // (the attention kernels' own bound, kv_chunks::WindowStart).
    count.assign(static_cast<size_t>(width), 0.0f);
    for (int l = 0; l < g.n_layers; ++l) {
      const int32_t w = static_cast<size_t>(l) < layer_windows.size() ? layer_windows[l] : 0;
      const int32_t first = std::max(kv_chunks::WindowStart(length, w) - lo, 0);
      for (int32_t jj = first; jj < width; ++jj) count[jj] += static_cast<float>(gq);
    }
    for (int kv = 0; kv < g.n_kv_heads; ++kv) {
      float* sum = m.sum + static_cast<size_t>(kv) * width;
      float* cnt = m.cnt + static_cast<size_t>(kv) * width;
      for (int32_t jj = 0; jj < width; ++jj) {
        if (t.tok[3 * (r[0] + lo + jj) + 2] < 0) continue;  // evicted: never observed
        float w = 0.0f;
        for (int h = 0; h < gq; ++h) w += block[static_cast<size_t>(kv * gq + h) * width + jj];
        sum[jj] += w;
        cnt[jj] += count[jj];
      }
    }
  }
}

}  // namespace specnode
