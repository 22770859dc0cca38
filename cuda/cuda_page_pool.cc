#include "cuda/cuda_page_pool.h"

#include <algorithm>
#include <cassert>
#include <cmath>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_attention.h"
#include "cuda/cuda_check.h"
#include "model/status_macros.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<CudaPagePool>> CudaPagePool::Create(CudaBackend* backend,
                                                                   const KvPoolGeometry& g,
                                                                   int64_t capacity_bytes,
                                                                   int32_t max_seq_len) {
  if (g.n_layers <= 0 || g.n_kv_heads <= 0 || g.head_dim <= 0 || g.page_tokens <= 0 ||
      max_seq_len <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda page pool: layers, kv heads, head_dim, page_tokens and context length must be "
        "> 0 (got ",
        g.n_layers, ", ", g.n_kv_heads, ", ", g.head_dim, ", ", g.page_tokens, ", ", max_seq_len,
        ")"));
  }
  if (g.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", g.head_dim, " exceeds the GPU attention kernel's 256"));
  }
  std::unique_ptr<CudaPagePool> p(new CudaPagePool(backend, g));
  const int64_t page = static_cast<int64_t>(p->PageBytes(KvPrecision::kFull));
  const int64_t pages = capacity_bytes / page;
  if (pages < 1) {
    return absl::InvalidArgumentError(absl::StrCat("cuda page pool: capacity ", capacity_bytes,
                                                   " bytes is below one page (", page, " bytes)"));
  }
  // Pool rows are addressed with int32 (row = page * page_tokens + slot).
  const int64_t max_pages = int64_t{0x7fffffff} / g.page_tokens;
  p->n_pages_ = static_cast<int32_t>(std::min(pages, max_pages));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend->device_index()));
  SPECNODE_ASSIGN_OR_RETURN(p->pools_,
                            DeviceBuffer::Allocate(static_cast<size_t>(p->n_pages_) * page));
  p->page_stride_ = std::max(1, (max_seq_len + g.page_tokens - 1) / g.page_tokens);
  return p;
}

KvPoolCaps CudaPagePool::Caps() {
  KvPoolCaps c;
  c.classes = {true, false, false};
  c.rotated = false;
  c.slot_copies = false;
  c.page_order = true;
  return c;
}

size_t CudaPagePool::PageBytes(KvPrecision p) const {
  return SlotBytes(p) * static_cast<size_t>(g_.page_tokens);
}

size_t CudaPagePool::SlotBytes(KvPrecision p) const {
  // K and V of every layer, f16 (the only class stored here).
  return size_t{2} * g_.n_layers * kv_dim() * 2;
}

absl::Status CudaPagePool::AllocatePage(int32_t id, KvPrecision p) {
  if (p != KvPrecision::kFull || id < 0 || id >= n_pages_) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda page pool: no ", std::string(KvPrecisionName(p)), " page ", id));
  }
  return absl::OkStatus();
}

void CudaPagePool::Recode(KvSlot, KvSlot) { assert(false && "CudaPagePool has no slot copies"); }
void CudaPagePool::ReadSlot(KvSlot, uint8_t*) const { assert(false && "CudaPagePool::ReadSlot"); }
void CudaPagePool::WriteSlot(KvSlot, const uint8_t*) { assert(false && "CudaPagePool::WriteSlot"); }

absl::Status CudaPagePool::BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool*) {
  const int P = g_.page_tokens;
  int64_t n = 0;
  int max_pages = 1;
  for (const KvPoolPassSeq& s : seqs) {
    if (s.mass.on) {
      return absl::FailedPreconditionError("cuda page pool: attention-mass observation");
    }
    n += s.n;
    max_pages = std::max(max_pages, (s.pos0 + s.n + P - 1) / P);
  }
  // Only a cache longer than the context could exceed the fixed stride; then it grows (and
  // recorded passes are recorded again, the stride being part of their signature).
  page_stride_ = std::max(page_stride_, max_pages);
  rows_ = n;
  CudaStepTables& t = backend_->tables();
  // Per-row tables first, the page table last: offsets depend on the rows only.
  kv_rows_ = t.Stage(n);
  table_row_ = t.Stage(n);
  ctx_ = t.Stage(n);
  page_table_ = t.Stage(static_cast<int64_t>(seqs.size()) * page_stride_);
  int32_t* kv_rows = t.staged(kv_rows_);
  int32_t* table_row = t.staged(table_row_);
  int32_t* ctx = t.staged(ctx_);
  int32_t* page_table = t.staged(page_table_);
  int64_t row = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const KvPoolPassSeq& s = seqs[i];
    const int32_t length = s.pos0 + s.n;
    for (int32_t p = 0; p < length; p += P) {
      // Page order (kv_page_pool.h): the page holding positions [p, p + P).
      assert(s.slots[p].slot == 0);
      page_table[i * page_stride_ + p / P] = s.slots[p].page;
    }
    for (int32_t j = 0; j < s.n; ++j, ++row) {
      const int32_t pos = s.pos0 + j;
      const KvSlot slot = s.slots[pos];
      assert(slot.page >= 0 && slot.slot == pos % P);
      kv_rows[row] = slot.page * P + slot.slot;
      table_row[row] = static_cast<int32_t>(i);
      ctx[row] = pos + 1;
    }
  }
  return absl::OkStatus();
}

absl::Status CudaPagePool::Write(int layer, const float* k, const float* v) {
  SPECNODE_RETURN_IF_ERROR(backend_->UploadTables());
  const CudaStepTables& t = backend_->tables();
  return CudaKvWrite(k, v, t.device(kv_rows_), rows_, kv_dim(), k_pool(layer), v_pool(layer),
                     backend_->stream());
}

absl::Status CudaPagePool::Attend(int layer, const float* q, float scale, float* out) {
  SPECNODE_RETURN_IF_ERROR(backend_->UploadTables());
  const CudaStepTables& t = backend_->tables();
  CudaAttentionArgs a;
  a.q = q;
  a.k_pool = k_pool(layer);
  a.v_pool = v_pool(layer);
  a.page_table = t.device(page_table_);
  a.table_row = t.device(table_row_);
  a.ctx = t.device(ctx_);
  a.n = rows_;
  a.n_heads = g_.n_kv_heads * g_.gqa_group;
  a.n_kv_heads = g_.n_kv_heads;
  a.head_dim = g_.head_dim;
  a.page_tokens = g_.page_tokens;
  a.max_pages = page_stride_;
  a.scale = scale;
  a.out = out;
  return CudaPagedAttention(a, backend_->stream());
}

uint64_t CudaPagePool::PassSignature() const {
  return MixSignature(reinterpret_cast<uintptr_t>(pools_.data()),
                      static_cast<uint64_t>(page_stride_));
}

uint16_t* CudaPagePool::k_pool(int layer) const {
  const size_t per_pool = static_cast<size_t>(n_pages_) * g_.page_tokens * kv_dim();
  return pools_.as<uint16_t>() + (2 * static_cast<size_t>(layer)) * per_pool;
}

uint16_t* CudaPagePool::v_pool(int layer) const {
  const size_t per_pool = static_cast<size_t>(n_pages_) * g_.page_tokens * kv_dim();
  return pools_.as<uint16_t>() + (2 * static_cast<size_t>(layer) + 1) * per_pool;
}

}  // namespace specnode
