// CudaPagePool: the KV store's pages on one GPU (a KvPagePool, kvstore/kv_page_pool.h),
// driven by the device-agnostic KV manager (kvstore/kv_store.h) like the CPU's pool. It
// starts as the GPU cache it replaces: f16 pages only (kFull; INT8 / INT4, demotion and the
// host tier are issue 17), unrotated rows, pages addressed by each sequence's page list
// (NeedsPageOrder: token p in slot p % page_tokens of the sequence's (p / page_tokens)-th
// page, which the manager keeps). A mode it cannot store is refused by the manager when the
// store is created, naming this device.
//
// Pool layout and kernels: cuda_attention.h — per layer one K and one V pool
// [n_pages * page_tokens, kv_dim] f16; a page id is the index of its page_tokens rows. All
// pages are allocated up front (capacity_bytes / PageBytes pages): the manager's ids stay
// below MaxPages(), AllocatePage / ReleasePage only check that.
//
// A pass: BeginPass stages, in the backend's step tables after the ids and positions, each
// row's pool row, its page-table row and its context length, then the page table with a
// fixed row stride (context / page_tokens pages, grown only if a sequence needs more), so
// that a recorded pass (a CUDA graph) of the same rows replays with new tables; Write and
// Attend launch CudaKvWrite / CudaPagedAttention on the backend's stream.
//
// Not thread-safe; the backend must outlive the pool.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "cuda/cuda_backend.h"
#include "cuda/device_buffer.h"
#include "kvstore/kv_page_pool.h"

namespace specnode {

class CudaPagePool final : public KvPagePool {
 public:
  // InvalidArgument for bad geometry (head_dim beyond the attention kernel's 256) or a
  // capacity below one page; Internal / ResourceExhausted when the device allocation fails.
  // max_seq_len sets the page table's row stride.
  static absl::StatusOr<std::unique_ptr<CudaPagePool>> Create(CudaBackend* backend,
                                                              const KvPoolGeometry& geometry,
                                                              int64_t capacity_bytes,
                                                              int32_t max_seq_len);

  // f16 pages only, unrotated, no slot copies, page order.
  static KvPoolCaps Caps();

  std::string device() const override { return backend_->device(); }
  const KvPoolGeometry& geometry() const override { return g_; }
  KvPoolCaps caps() const override { return Caps(); }
  size_t PageBytes(KvPrecision p) const override;
  size_t SlotBytes(KvPrecision p) const override;
  int64_t MaxPages() const override { return n_pages_; }
  absl::Status AllocatePage(int32_t id, KvPrecision p) override;
  void ReleasePage(int32_t id) override {}
  // Not supported (SupportsSlotCopies() is false); the manager never calls them.
  void Recode(KvSlot from, KvSlot to) override;
  void ReadSlot(KvSlot s, uint8_t* host) const override;
  void WriteSlot(KvSlot s, const uint8_t* host) override;
  absl::Status BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool* threads) override;
  absl::Status Write(int layer, const float* k, const float* v) override;
  absl::Status Attend(int layer, const float* q, float scale, float* out) override;
  uint64_t PassSignature() const override;

  int kv_dim() const { return g_.n_kv_heads * g_.head_dim; }
  uint16_t* k_pool(int layer) const;  // [n_pages * page_tokens, kv_dim] f16 bits (device)
  uint16_t* v_pool(int layer) const;

 private:
  CudaPagePool(CudaBackend* backend, const KvPoolGeometry& g) : backend_(backend), g_(g) {}

  CudaBackend* backend_;
  KvPoolGeometry g_;
  int32_t n_pages_ = 0;
  DeviceBuffer pools_;   // [n_layers][K, V][n_pages * page_tokens, kv_dim] f16
  int page_stride_ = 1;  // pages per page-table row
  // The pass: its rows and where BeginPass staged its tables (CudaStepTables offsets).
  int64_t rows_ = 0;
  int64_t kv_rows_ = 0, table_row_ = 0, ctx_ = 0, page_table_ = 0;
};

}  // namespace specnode
