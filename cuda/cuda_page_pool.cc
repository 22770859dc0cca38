#include "cuda/cuda_page_pool.h"

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_kv_kernels.h"
#include "kvstore/kv_row_codec.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

// A chunk holds this many f16 pages (and proportionally more of the smaller classes): big
// enough that a chunk's tail waste is a small fraction, small enough that the spare chunks
// per class cost little next to the capacity.
constexpr int64_t kFullPagesPerChunk = 16;

// The attention kernel's grid has one block row per pass row.
constexpr int64_t kMaxPassRows = 65535;

void PushOffset(std::vector<int32_t>& v, int64_t off) {
  v.push_back(static_cast<int32_t>(static_cast<uint32_t>(off & 0xffffffffu)));
  v.push_back(static_cast<int32_t>(off >> 32));
}

int64_t SlotKey(KvSlot s) {
  return (static_cast<int64_t>(s.page) << 32) | static_cast<uint32_t>(s.slot);
}

}  // namespace

CudaPagePool::CudaPagePool(CudaBackend* backend, const KvPoolGeometry& g, bool rotate)
    : backend_(backend), g_(g), rotate_(rotate) {
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    key_bytes_[c] = KvRowBytes(KvRowFormat(static_cast<KvPrecision>(c), false), g.head_dim);
    pair_bytes_[c] = KvPairBytes(static_cast<KvPrecision>(c), g.head_dim);
    slot_stride_[c] = pair_bytes_[c] * g.n_kv_heads;
    page_bytes_[c] = slot_stride_[c] * g.page_tokens * g.n_layers;
  }
}

CudaPagePool::~CudaPagePool() = default;

absl::StatusOr<std::unique_ptr<CudaPagePool>> CudaPagePool::Create(CudaBackend* backend,
                                                                   const KvPoolGeometry& g,
                                                                   int64_t capacity_bytes,
                                                                   std::optional<bool> rotate) {
  if (g.n_layers <= 0 || g.n_kv_heads <= 0 || g.head_dim <= 0 || g.page_tokens <= 0 ||
      g.gqa_group <= 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        "cuda page pool: layers, kv heads, head_dim, gqa group and page_tokens must be > 0 "
        "(got ",
        g.n_layers, ", ", g.n_kv_heads, ", ", g.head_dim, ", ", g.gqa_group, ", ", g.page_tokens,
        ")"));
  }
  if (g.head_dim > kv_codec::kMaxHeadDim || g.head_dim % 2 != 0) {
    return absl::InvalidArgumentError(absl::StrCat("cuda page pool: head_dim ", g.head_dim,
                                                   " must be even and at most ",
                                                   kv_codec::kMaxHeadDim));
  }
  const KvPoolCaps caps = Caps(g.head_dim, rotate);
  std::unique_ptr<CudaPagePool> p(new CudaPagePool(backend, g, caps.rotated));
  const int64_t full_page = p->page_bytes_[0];
  if (capacity_bytes < full_page) {
    return absl::InvalidArgumentError(absl::StrCat("cuda page pool: capacity ", capacity_bytes,
                                                   " bytes is below one page (", full_page,
                                                   " bytes)"));
  }
  const int64_t chunk = full_page * kFullPagesPerChunk;
  // Chunks for the manager's whole budget in any one class (a chunk's tail is waste, so the
  // smaller classes need more chunks than capacity / chunk), plus a spare chunk per class
  // for the partly used chunks of mixed classes.
  int64_t n_chunks = 0;
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    const int64_t pages = capacity_bytes / p->page_bytes_[c] + 1;
    const int64_t frames = chunk / p->page_bytes_[c];
    n_chunks = std::max(n_chunks, (pages + frames - 1) / frames);
  }
  n_chunks += kNumKvPrecisions;
  p->alloc_ = std::make_unique<KvFrameAllocator>(
      n_chunks, chunk,
      std::array<int64_t, KvFrameAllocator::kClasses>{p->page_bytes_[0], p->page_bytes_[1],
                                                      p->page_bytes_[2], p->page_bytes_[3]});
  // Page ids are the manager's; the most pages that can be live is the arena in the
  // smallest class's frames.
  p->max_pages_ = std::min<int64_t>(p->alloc_->MaxFrames(kv_codec::kInt2), int64_t{0x7fffffff});
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(backend->device_index()));
  auto arena = DeviceBuffer::Allocate(static_cast<size_t>(p->alloc_->arena_bytes()));
  if (!arena.ok()) {
    return absl::ResourceExhaustedError(absl::StrCat(
        "cuda page pool: cannot allocate ", p->alloc_->arena_bytes(), " bytes of KV pages on ",
        backend->device().name(), " (capacity ", capacity_bytes,
        " in any class + a spare chunk per class): ", arena.status().message()));
  }
  p->arena_ = *std::move(arena);
  SPECNODE_RETURN_IF_ERROR(p->AllocateAttentionScratch());
  return p;
}

absl::Status CudaPagePool::AllocateAttentionScratch() {
  const cuda_internal::KvDeviceFormat f = Format();
  const size_t partial_bytes = cuda_internal::KvAttentionScratchFloats(f) * sizeof(float);
  const size_t counter_bytes = cuda_internal::KvAttentionCounters(f) * sizeof(unsigned);
  auto partials = DeviceBuffer::Allocate(partial_bytes);
  auto counters = DeviceBuffer::Allocate(counter_bytes);
  if (!partials.ok() || !counters.ok()) {
    return absl::ResourceExhaustedError(
        absl::StrCat("cuda page pool: cannot allocate ", partial_bytes + counter_bytes,
                     " bytes of attention scratch on ", device().name(), ": ",
                     (partials.ok() ? counters.status() : partials.status()).message()));
  }
  attn_partials_ = *std::move(partials);
  attn_counters_ = *std::move(counters);
  // On the pool's stream (non-blocking: the legacy stream would not order it before the
  // first attention launch).
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cudaMemsetAsync(attn_counters_.data(), 0, counter_bytes, backend_->stream()));
  return absl::OkStatus();
}

KvPoolCaps CudaPagePool::Caps(int head_dim, std::optional<bool> rotate) {
  KvPoolCaps c;
  c.classes = {true, true, true, true};
  c.rotated = rotate.value_or(true) && IsPowerOfTwo(head_dim);
  c.slot_copies = true;
  // Draft trees: each tree row gets its own key list in the pass tables (kv_pass_tables.h),
  // which the attention and encode kernels read as they read a chain row's.
  c.tree_rows = true;
  c.page_order = false;
  return c;
}

KvPoolCaps CudaPagePool::caps() const {
  KvPoolCaps c = Caps(g_.head_dim, rotate_);
  c.rotated = rotate_;
  return c;
}

size_t CudaPagePool::PageBytes(KvPrecision p) const {
  return static_cast<size_t>(page_bytes_[static_cast<int>(p)]);
}

size_t CudaPagePool::SlotBytes(KvPrecision p) const {
  return static_cast<size_t>(slot_stride_[static_cast<int>(p)] * g_.n_layers);
}

absl::Status CudaPagePool::AllocatePage(int32_t id, KvPrecision p) {
  if (id < 0 || id >= max_pages_) {
    return absl::InvalidArgumentError(
        absl::StrCat(device().name(), " page pool: page id ", id, " beyond ", max_pages_));
  }
  const int64_t off = alloc_->Allocate(static_cast<int>(p));
  if (off < 0) {
    return absl::ResourceExhaustedError(
        absl::StrCat(device().name(), " page pool: no room for a ", std::string(KvPrecisionName(p)),
                     " page (arena of ", alloc_->arena_bytes(), " bytes, ", alloc_->free_chunks(),
                     " free chunks)"));
  }
  if (id >= static_cast<int32_t>(places_.size())) places_.resize(id + 1);
  places_[id] = {off, static_cast<int8_t>(p)};
  return absl::OkStatus();
}

void CudaPagePool::ReleasePage(int32_t id) {
  // A queued demotion may read this page's frame, or, once the frame serves another page,
  // write it: run the queue before the frame can be handed out again.
  if (!recode_jobs_.empty()) KeepError(FlushRecodes());
  KvPagePlace& place = places_[id];
  assert(place.offset >= 0);
  alloc_->Release(place.cls, place.offset);
  place = KvPagePlace{};
}

KvPrecision CudaPagePool::PageClass(int32_t id) const {
  return static_cast<KvPrecision>(places_[id].cls);
}

int64_t CudaPagePool::SlotBase(KvSlot s) const {
  const KvPagePlace& place = places_[s.page];
  return place.offset + s.slot * slot_stride_[place.cls];
}

cuda_internal::KvDeviceFormat CudaPagePool::Format() const {
  cuda_internal::KvDeviceFormat f;
  f.arena = arena_.as<uint8_t>();
  f.n_kv_heads = g_.n_kv_heads;
  f.head_dim = g_.head_dim;
  f.gqa_group = g_.gqa_group;
  f.page_tokens = g_.page_tokens;
  for (int c = 0; c < kNumKvPrecisions; ++c) {
    f.key_bytes[c] = static_cast<int>(key_bytes_[c]);
    f.pair_bytes[c] = static_cast<int>(pair_bytes_[c]);
  }
  f.rotate = rotate_ ? 1 : 0;
  // HadamardInPlace's scaling, computed as it computes it.
  f.hadamard_norm = 1.0f / std::sqrt(static_cast<float>(g_.head_dim));
  return f;
}

void CudaPagePool::KeepError(absl::Status st) {
  if (!st.ok() && error_.ok()) error_ = std::move(st);
}

absl::Status CudaPagePool::TakeError() {
  absl::Status st = std::move(error_);
  error_ = absl::OkStatus();
  return st;
}

void CudaPagePool::Recode(KvSlot from, KvSlot to) {
  // Two jobs writing one slot in the same launch would race (the manager can reuse a
  // released tail slot): the first must have run.
  if (recode_targets_.contains(SlotKey(to))) KeepError(FlushRecodes());
  const KvPagePlace& src = places_[from.page];
  const KvPagePlace& dst = places_[to.page];
  PushOffset(recode_jobs_, SlotBase(from));
  recode_jobs_.push_back(src.cls);
  PushOffset(recode_jobs_, SlotBase(to));
  recode_jobs_.push_back(dst.cls);
  recode_targets_.insert(SlotKey(to));
}

absl::Status CudaPagePool::FlushRecodes() {
  if (recode_jobs_.empty()) return absl::OkStatus();
  // The queue is emptied whatever happens: after a failure its jobs may name frames that
  // are released next, and the error (kept by the caller) ends the pass anyway.
  std::vector<int32_t> jobs;
  jobs.swap(recode_jobs_);
  recode_targets_.clear();
  const int64_t n_jobs = static_cast<int64_t>(jobs.size() / 6);
  const size_t bytes = jobs.size() * sizeof(int32_t);
  SPECNODE_RETURN_IF_ERROR(recode_dev_.Grow(bytes));
  // From pageable memory the runtime stages the copy before returning, so `jobs` may go;
  // stream order puts it after every earlier launch that read the table.
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(recode_dev_.data(), jobs.data(), bytes,
                                                cudaMemcpyHostToDevice, backend_->stream()));
  SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchKvRecode(
      Format(), g_.n_layers, recode_dev_.as<int32_t>(), n_jobs, backend_->stream()));
  recoded_ += n_jobs;
  ++recode_launches_;
  return absl::OkStatus();
}

absl::Status CudaPagePool::CopySlots(std::span<const KvSlot> slots, uint8_t* host, bool to_host) {
  if (slots.empty()) return absl::OkStatus();
  // Pending demotions write slots a swap reads, or read slots it overwrites.
  SPECNODE_RETURN_IF_ERROR(FlushRecodes());
  std::vector<int32_t> jobs;
  jobs.reserve(slots.size() * 5);
  int64_t total = 0;
  for (const KvSlot& s : slots) {
    const int cls = places_[s.page].cls;
    PushOffset(jobs, SlotBase(s));
    jobs.push_back(cls);
    PushOffset(jobs, total);
    total += slot_stride_[cls] * g_.n_layers;
  }
  cudaStream_t stream = backend_->stream();
  SPECNODE_RETURN_IF_ERROR(copy_jobs_.Grow(jobs.size() * sizeof(int32_t)));
  SPECNODE_RETURN_IF_ERROR(copy_staging_.Grow(static_cast<size_t>(total)));
  SPECNODE_RETURN_IF_ERROR(copy_host_.Reserve(static_cast<size_t>(total)));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy_jobs_.data(), jobs.data(),
                                                jobs.size() * sizeof(int32_t),
                                                cudaMemcpyHostToDevice, stream));
  const int64_t n = static_cast<int64_t>(slots.size());
  if (to_host) {
    SPECNODE_CUDA_RETURN_IF_ERROR(
        cuda_internal::LaunchKvCopySlots(Format(), g_.n_layers, copy_jobs_.as<int32_t>(), n,
                                         copy_staging_.as<uint8_t>(), true, stream));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy_host_.data(), copy_staging_.data(),
                                                  static_cast<size_t>(total),
                                                  cudaMemcpyDeviceToHost, stream));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
    std::memcpy(host, copy_host_.data(), static_cast<size_t>(total));
  } else {
    std::memcpy(copy_host_.data(), host, static_cast<size_t>(total));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(copy_staging_.data(), copy_host_.data(),
                                                  static_cast<size_t>(total),
                                                  cudaMemcpyHostToDevice, stream));
    SPECNODE_CUDA_RETURN_IF_ERROR(
        cuda_internal::LaunchKvCopySlots(Format(), g_.n_layers, copy_jobs_.as<int32_t>(), n,
                                         copy_staging_.as<uint8_t>(), false, stream));
    // The pinned staging is reused by the next copy, and errors surface here.
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  }
  return absl::OkStatus();
}

absl::Status CudaPagePool::ReadSlots(std::span<const KvSlot> slots, uint8_t* host) {
  return CopySlots(slots, host, /*to_host=*/true);
}

absl::Status CudaPagePool::WriteSlots(std::span<const KvSlot> slots, const uint8_t* host) {
  return CopySlots(slots, const_cast<uint8_t*>(host), /*to_host=*/false);
}

void CudaPagePool::ReadSlot(KvSlot s, uint8_t* host) const {
  // Logically const; the copy first runs the demotion queue (which may target this slot).
  auto* self = const_cast<CudaPagePool*>(this);
  self->KeepError(self->ReadSlots({&s, 1}, host));
}

void CudaPagePool::WriteSlot(KvSlot s, const uint8_t* host) {
  KeepError(WriteSlots({&s, 1}, host));
}

absl::Status CudaPagePool::BeginPass(std::span<const KvPoolPassSeq> seqs, ThreadPool*) {
  // Nothing of a previous pass survives, whatever fails below (EndPass is then a no-op).
  tables_ = KvPassTables{};
  pass_.clear();
  layer_windows_.assign(static_cast<size_t>(g_.n_layers), 0);
  SPECNODE_RETURN_IF_ERROR(TakeError());
  SPECNODE_RETURN_IF_ERROR(FlushRecodes());  // demotions land before the pass reads them
  std::vector<KvPoolPassSeq> pass(seqs.begin(), seqs.end());
  KvPassTables tables = BuildKvPassTables(pass, places_, slot_stride_, g_);
  const int64_t n = tables.n_rows();
  if (n > kMaxPassRows) {
    return absl::InvalidArgumentError(
        absl::StrCat(device().name(), " page pool: a pass of ", n, " rows exceeds ", kMaxPassRows));
  }
  if (tables.mass_floats > int64_t{0x7fffffff}) {
    return absl::InvalidArgumentError(absl::StrCat(
        device().name(), " page pool: the pass observes too many keys (", tables.mass_floats, ")"));
  }
  if (tables.mass_floats > 0) {
    SPECNODE_RETURN_IF_ERROR(mass_.Grow(static_cast<size_t>(tables.mass_floats) * sizeof(float)));
  }
  // Per-row tables first (their offsets depend on the rows only), the token table last.
  CudaStepTables& t = backend_->tables();
  rows_off_ = t.Stage(static_cast<int64_t>(tables.rows.size()));
  tok_off_ = t.Stage(std::max<int64_t>(1, static_cast<int64_t>(tables.tok.size())));
  std::copy(tables.rows.begin(), tables.rows.end(), t.staged(rows_off_));
  std::copy(tables.tok.begin(), tables.tok.end(), t.staged(tok_off_));
  pass_ = std::move(pass);
  tables_ = std::move(tables);
  return absl::OkStatus();
}

absl::StatusOr<cuda_internal::KvDevicePass> CudaPagePool::PassArgs() {
  SPECNODE_RETURN_IF_ERROR(TakeError());
  SPECNODE_RETURN_IF_ERROR(backend_->UploadTables());  // a no-op once uploaded
  const CudaStepTables& t = backend_->tables();
  cuda_internal::KvDevicePass p;
  p.tok = t.device(tok_off_);
  p.rows = t.device(rows_off_);
  p.mass = mass_.as<float>();
  p.n = tables_.n_rows();
  return p;
}

absl::Status CudaPagePool::Write(int layer, const float* k, const float* v) {
  SPECNODE_ASSIGN_OR_RETURN(const cuda_internal::KvDevicePass p, PassArgs());
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cuda_internal::LaunchKvEncode(Format(), p, layer, k, v, backend_->stream()));
  return absl::OkStatus();
}

absl::Status CudaPagePool::Attend(int layer, const float* q, float scale, int32_t window,
                                  float* out) {
  SPECNODE_ASSIGN_OR_RETURN(const cuda_internal::KvDevicePass p, PassArgs());
  // The layer's window, for counting the observed mass (AddKvPassMass).
  if (layer >= 0 && layer < g_.n_layers) layer_windows_[layer] = window;
  SPECNODE_CUDA_RETURN_IF_ERROR(cuda_internal::LaunchKvAttention(
      Format(), p, layer, q, scale, window, out,
      {attn_partials_.as<float>(), attn_counters_.as<unsigned>()},
      backend_->ProduceQ16ForPool(out, p.n * g_.n_kv_heads * g_.gqa_group * g_.head_dim,
                                  g_.head_dim),
      backend_->stream()));
  return absl::OkStatus();
}

absl::Status CudaPagePool::EndPass() {
  // Taken out first: the observations are added once, or not at all if this fails.
  KvPassTables tables;
  std::swap(tables, tables_);
  if (tables.observed.empty()) return absl::OkStatus();
  const size_t bytes = static_cast<size_t>(tables.mass_floats) * sizeof(float);
  SPECNODE_RETURN_IF_ERROR(mass_host_.Reserve(bytes));
  cudaStream_t stream = backend_->stream();
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(mass_host_.data(), mass_.data(), bytes, cudaMemcpyDeviceToHost, stream));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream));
  AddKvPassMass(tables, pass_, reinterpret_cast<const float*>(mass_host_.data()), g_,
                layer_windows_);
  return absl::OkStatus();
}

uint64_t CudaPagePool::PassSignature() const {
  // What the recorded launches bake in besides the step tables (the backend mixes those):
  // the arena, the mass buffer and the format's scalars (fixed per pool).
  return MixSignature(MixSignature(reinterpret_cast<uintptr_t>(arena_.data()),
                                   reinterpret_cast<uintptr_t>(mass_.data())),
                      reinterpret_cast<uintptr_t>(attn_partials_.data()));
}

}  // namespace specnode
