// CudaPagePool: the KV store's pages on one GPU (a KvPagePool, kvstore/kv_page_pool.h),
// driven by the device-agnostic KV manager (kvstore/kv_store.h) exactly as the CPU's pool
// is: every precision class (f16; int8 with a per-row scale; int4 with scale and min), rows
// Hadamard-rotated as on the CPU, demotion on the device, the host tier, forks and the
// prefix cache (the manager's, over pages addressed per token: no page order). So
// `kv.mode: mixed | int8 | int4 | full` mean the same on `--device cuda:N` and on the CPU.
//
// Memory: one device arena allocated at Create (room for capacity_bytes in any one class,
// plus one spare chunk per class), pages of the three sizes placed in it by a slab
// allocator (kv_frame_allocator.h);
// a page's bytes are laid out as the CPU pool's (cuda_kv_kernels.h), so PageBytes,
// SlotBytes and the byte accounting per class are the CPU pool's, and a slot's swapped
// bytes are the same on both devices. AllocatePage can refuse (ResourceExhausted, nothing
// changed) when the arena is fragmented for that class.
//
// A pass: BeginPass builds, in the backend's step tables (cuda_backend.h), per row its
// sequence's first token entry, its context length and its mass observation, then per
// cached position of every sequence its slot's device offset and class (kv_pass_tables.h);
// Write encodes the new rows into their slots' classes (rotating first), Attend runs paged
// attention over every class and, for observed rows, writes the attention mass into a
// device buffer; EndPass copies that to the host and adds it to the manager's rows. The
// tables' addresses depend on the number of rows only, so a recorded pass (a CUDA graph)
// replays with new tables.
//
// Demotion: Recode queues (from, to) slot pairs; one kernel re-encodes the queue on the
// backend's stream before anything could read or overwrite those slots (the next pass, a
// swap, a page release, or a second job for the same target). No host round trip.
// Host tier: ReadSlots / WriteSlots gather or scatter a sequence's slots in one kernel and
// one asynchronous copy on the stream through pinned staging memory; the call waits for it
// (the manager's host tier is ordinary memory, read when the call returns). Bit-exact.
//
// Errors of calls that return nothing (Recode, ReadSlot, WriteSlot, ReleasePage's flush)
// are kept and returned by the next BeginPass / Write / Attend.
//
// Not thread-safe; the backend must outlive the pool.
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/container/flat_hash_set.h"
#include "absl/status/statusor.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_buffer.h"
#include "cuda/kv_frame_allocator.h"
#include "cuda/kv_pass_tables.h"
#include "kvstore/kv_page_pool.h"

namespace specnode {

namespace cuda_internal {
struct KvDeviceFormat;
struct KvDevicePass;
}  // namespace cuda_internal

class CudaPagePool final : public KvPagePool {
 public:
  // InvalidArgument for bad geometry (head_dim odd or beyond the kernels' 256, zero sizes)
  // or a capacity below one page; ResourceExhausted / Internal when the device allocation
  // fails. rotate: as CpuPagePool (unset: rotate when head_dim is a power of two).
  static absl::StatusOr<std::unique_ptr<CudaPagePool>> Create(CudaBackend* backend,
                                                              const KvPoolGeometry& geometry,
                                                              int64_t capacity_bytes,
                                                              std::optional<bool> rotate);
  ~CudaPagePool() override;

  // What a GPU pool of this head_dim stores: every class, rotated when asked (unset: yes)
  // and head_dim is a power of two, slot copies, no page order — CpuPagePool::Caps.
  static KvPoolCaps Caps(int head_dim, std::optional<bool> rotate);

  Device device() const override { return backend_->device(); }
  const KvPoolGeometry& geometry() const override { return g_; }
  KvPoolCaps caps() const override;
  size_t PageBytes(KvPrecision p) const override;
  size_t SlotBytes(KvPrecision p) const override;
  int64_t MaxPages() const override { return max_pages_; }
  absl::Status AllocatePage(int32_t id, KvPrecision p) override;
  void ReleasePage(int32_t id) override;
  KvPrecision PageClass(int32_t id) const override;
  void Recode(KvSlot from, KvSlot to) override;
  void ReadSlot(KvSlot s, uint8_t* host) const override;
  void WriteSlot(KvSlot s, const uint8_t* host) override;
  absl::Status ReadSlots(std::span<const KvSlot> slots, uint8_t* host) override;
  absl::Status WriteSlots(std::span<const KvSlot> slots, const uint8_t* host) override;
  absl::Status BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool* threads) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float scale, int32_t window, float* out) override;
  absl::Status EndPass() override;
  uint64_t PassSignature() const override;

  int64_t arena_bytes() const { return alloc_->arena_bytes(); }
  // Recode jobs launched so far, and the launches that ran them (tests, docs).
  int64_t recoded() const { return recoded_; }
  int64_t recode_launches() const { return recode_launches_; }

 private:
  CudaPagePool(CudaBackend* backend, const KvPoolGeometry& g, bool rotate);
  cuda_internal::KvDeviceFormat Format() const;
  // The chunked attention's scratch (Create, after the arena).
  absl::Status AllocateAttentionScratch();
  // The pass's device tables (uploaded first) for a launch; the kept error, if any.
  absl::StatusOr<cuda_internal::KvDevicePass> PassArgs();
  int64_t SlotBase(KvSlot s) const;  // the slot's layer-0 byte offset in the arena
  // Runs the queued Recode jobs (one launch) and empties the queue.
  absl::Status FlushRecodes();
  absl::Status TakeError();
  void KeepError(absl::Status st);
  // Gathers (to_host) or scatters the slots through the staging buffers.
  absl::Status CopySlots(std::span<const KvSlot> slots, uint8_t* host, bool to_host);

  CudaBackend* backend_;
  KvPoolGeometry g_;
  bool rotate_;
  std::array<int64_t, kNumKvPrecisions> key_bytes_{}, pair_bytes_{}, slot_stride_{}, page_bytes_{};
  DeviceBuffer arena_;
  std::unique_ptr<KvFrameAllocator> alloc_;
  int64_t max_pages_ = 0;
  std::vector<KvPagePlace> places_;  // by page id

  // The pass.
  std::vector<KvPoolPassSeq> pass_;
  std::vector<int32_t> layer_windows_;  // the pass's window per layer (Attend's; 0: none)
  KvPassTables tables_;
  int64_t rows_off_ = 0, tok_off_ = 0;  // offsets in the backend's step tables
  DeviceBuffer mass_;                   // [tables_.mass_floats] f32, grown to powers of two
  // The chunked attention's partials and counters (cuda_kv_kernels.h, KvAttentionScratch),
  // allocated at Create for kv_chunks::kChunkedRows rows.
  DeviceBuffer attn_partials_, attn_counters_;
  PinnedHostBuffer mass_host_;

  // Demotion queue: [jobs, 6] (cuda_kv_kernels.h) and the (page, slot) targets in it.
  std::vector<int32_t> recode_jobs_;
  absl::flat_hash_set<int64_t> recode_targets_;
  DeviceBuffer recode_dev_;
  int64_t recoded_ = 0, recode_launches_ = 0;

  // Host tier staging.
  DeviceBuffer copy_jobs_, copy_staging_;
  PinnedHostBuffer copy_host_;

  mutable absl::Status error_;
};

}  // namespace specnode
