// The GPU page pool's per-pass tables (cuda_kv_kernels.h's KvDevicePass), built on the host
// from the KV manager's pass (kvstore/kv_page_pool.h), and the attention-mass observations
// folded back into the manager's rows once the pass's mass buffer is on the host. Host code
// only (no CUDA calls), so tests check it without a GPU.
//
// Not thread-safe; a value type.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <vector>

#include "kvstore/kv_page_pool.h"

namespace specnode {

// Where a page lives in the pool's arena, and its class.
struct KvPagePlace {
  int64_t offset = -1;  // bytes; -1 = not allocated
  int8_t cls = -1;
};

struct KvPassTables {
  static constexpr int kRowInts = 5;
  std::vector<int32_t> tok;   // [n_tok, 3] (KvDevicePass::tok)
  std::vector<int32_t> rows;  // [n_rows, kRowInts] (KvDevicePass::rows)
  int64_t mass_floats = 0;    // size of the pass's mass buffer
  // Per observed row: its sequence (index in the pass), its row of the pass and the
  // manager's row to fill.
  struct Observed {
    int32_t seq = 0;
    int64_t row = 0;
    const KvMassRow* sink = nullptr;
  };
  std::vector<Observed> observed;

  int64_t n_rows() const { return static_cast<int64_t>(rows.size() / kRowInts); }
};

// slot_stride[c]: SlotStride of class c (2 * n_kv_heads * row bytes). InvalidArgument-free:
// the manager's pass is trusted (a bad slot is our bug: asserted).
// A chain sequence's rows share one key list (its positions [0, pos0 + n)); a draft tree's
// row r (KvPoolPassSeq::parents) gets a list of its own — positions [0, pos0), then the
// slots of its path — and the length pos0 + depth(r) + 1; its mass row is the manager's
// row with row == r.
KvPassTables BuildKvPassTables(std::span<const KvPoolPassSeq> seqs,
                               std::span<const KvPagePlace> pages,
                               const std::array<int64_t, kNumKvPrecisions>& slot_stride,
                               const KvPoolGeometry& g);

// Adds the pass's mass ([obs block][n_heads, width], as the attention kernel left it after
// every layer) to the manager's rows: sum[kv][j] += Σ over kv's query heads; cnt[kv][j] +=
// gqa_group for every layer that saw the stored (not evicted) key — every layer, or with
// layer_windows [n_layers] (> 0: that layer's sliding window, Attend's) those whose window
// holds the key: what the CPU pool adds, layer by layer, for the same observations.
void AddKvPassMass(const KvPassTables& t, std::span<const KvPoolPassSeq> seqs, const float* mass,
                   const KvPoolGeometry& g, std::span<const int32_t> layer_windows = {});

}  // namespace specnode
