#include "cuda/cuda_llama_forward.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_attention.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_ops.h"
#include "model/ggml_types.h"
#include "model/status_macros.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<CudaLlamaForward>> CudaLlamaForward::Create(
    const LlamaConfig& config, const LlamaWeights& weights, const CudaForwardOptions& options) {
  SPECNODE_ASSIGN_OR_RETURN(const int devices, CudaDeviceCount());
  if (options.device < 0 || options.device >= devices) {
    return absl::InvalidArgumentError(absl::StrCat("cuda:", options.device, " does not exist (",
                                                   devices, " CUDA devices visible)"));
  }
  if (weights.shard.size > 1 && options.reducer == nullptr) {
    return absl::InvalidArgumentError(
        "a tensor-parallel shard on the GPU needs a reducer (an NCCL all-reduce)");
  }
  if (config.head_dim > 256) {
    return absl::InvalidArgumentError(
        absl::StrCat("head_dim ", config.head_dim, " exceeds the GPU attention kernel's 256"));
  }
  std::unique_ptr<CudaLlamaForward> f(new CudaLlamaForward());
  f->config_ = config;
  f->device_ = options.device;
  f->n_heads_ = weights.n_heads_local;
  f->n_kv_heads_ = weights.n_kv_heads_local;
  f->d_ff_ = weights.d_ff_local;
  f->reducer_ = weights.shard.size > 1 ? options.reducer : nullptr;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(options.device));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&f->stream_, cudaStreamNonBlocking));
  SPECNODE_ASSIGN_OR_RETURN(f->mm_, CudaMatMulContext::Create(f->stream_));
  SPECNODE_ASSIGN_OR_RETURN(f->token_embd_, f->Upload(weights.token_embd));
  if (weights.output.data == weights.token_embd.data) {
    f->output_.view = f->token_embd_.view;  // tied: one device copy
  } else {
    SPECNODE_ASSIGN_OR_RETURN(f->output_, f->Upload(weights.output));
  }
  SPECNODE_ASSIGN_OR_RETURN(f->output_norm_, f->UploadNorm(weights.output_norm, config.d_model));
  for (const LayerWeights& lw : weights.layers) {
    DeviceLayer d;
    SPECNODE_ASSIGN_OR_RETURN(d.attn_norm, f->UploadNorm(lw.attn_norm, config.d_model));
    SPECNODE_ASSIGN_OR_RETURN(d.ffn_norm, f->UploadNorm(lw.ffn_norm, config.d_model));
    SPECNODE_ASSIGN_OR_RETURN(d.wq, f->Upload(lw.wq));
    SPECNODE_ASSIGN_OR_RETURN(d.wk, f->Upload(lw.wk));
    SPECNODE_ASSIGN_OR_RETURN(d.wv, f->Upload(lw.wv));
    SPECNODE_ASSIGN_OR_RETURN(d.wo, f->Upload(lw.wo));
    SPECNODE_ASSIGN_OR_RETURN(d.w_gate, f->Upload(lw.w_gate));
    SPECNODE_ASSIGN_OR_RETURN(d.w_up, f->Upload(lw.w_up));
    SPECNODE_ASSIGN_OR_RETURN(d.w_down, f->Upload(lw.w_down));
    f->layers_.push_back(std::move(d));
  }
  CudaKvCacheOptions ko;
  ko.n_layers = static_cast<int>(weights.layers.size());
  ko.n_kv_heads = f->n_kv_heads_;
  ko.head_dim = config.head_dim;
  ko.context_length = config.context_length;
  ko.capacity_bytes = options.kv_capacity_bytes;
  ko.page_tokens = options.kv_page_tokens;
  SPECNODE_ASSIGN_OR_RETURN(f->cache_, CudaKvCache::Create(ko));
  f->page_stride_ = std::max(1, (config.context_length + ko.page_tokens - 1) / ko.page_tokens);
  const char* env = std::getenv("SPECNODE_CUDA_GRAPHS");
  const bool env_off = env != nullptr && std::string(env) == "0";
  if (options.cuda_graphs && !env_off && f->reducer_ == nullptr) {
    f->graphs_ = std::make_unique<CudaGraphCache>();
  }
  return f;
}

CudaLlamaForward::~CudaLlamaForward() {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  mm_.reset();  // its cuBLAS handle is bound to stream_
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::StatusOr<CudaLlamaForward::DeviceMatrix> CudaLlamaForward::Upload(const WeightView& w) {
  // Compact: each row's own bytes only (a column slice's row_stride spans the whole row).
  const size_t row_bytes = GgmlRowBytes(w.type, w.cols);
  std::vector<uint8_t> host(row_bytes * static_cast<size_t>(w.rows));
  for (int64_t r = 0; r < w.rows; ++r) {
    std::memcpy(host.data() + r * row_bytes, static_cast<const uint8_t*>(w.data) + r * w.row_stride,
                row_bytes);
  }
  DeviceMatrix m;
  SPECNODE_ASSIGN_OR_RETURN(m.buffer, DeviceBuffer::FromHost(host.data(), host.size()));
  m.view = WeightView{w.type, m.buffer.data(), w.rows, w.cols, row_bytes};
  weight_bytes_ += static_cast<int64_t>(host.size());
  return m;
}

absl::StatusOr<DeviceBuffer> CudaLlamaForward::UploadNorm(const float* v, int64_t n) {
  weight_bytes_ += n * static_cast<int64_t>(sizeof(float));
  return DeviceBuffer::FromHost(v, static_cast<size_t>(n) * sizeof(float));
}

absl::Status CudaLlamaForward::Ensure(DeviceBuffer& buf, size_t bytes) {
  if (bytes <= buf.size()) return absl::OkStatus();
  return buf.Reserve(std::bit_ceil(std::max<size_t>(bytes, 256)));
}

absl::Status CudaLlamaForward::ToDevice(DeviceBuffer& buf, const void* host, size_t bytes) {
  SPECNODE_RETURN_IF_ERROR(Ensure(buf, bytes));
  if (bytes == 0) return absl::OkStatus();
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(buf.data(), host, bytes, cudaMemcpyHostToDevice, stream_));
  return absl::OkStatus();
}

absl::Status CudaLlamaForward::Forward(std::span<const BatchEntry> batch,
                                       std::vector<float>* logits) {
  SPECNODE_ASSIGN_OR_RETURN(const int64_t n, ValidateBatch(batch, config_.vocab_size));
  if (n == 0) {
    if (logits != nullptr) logits->clear();
    return absl::OkStatus();
  }
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  std::vector<int32_t> pos0(batch.size());
  // Undoes the reservations of entries [0, upto): nothing changes on failure.
  auto undo = [&](size_t upto) {
    for (size_t j = 0; j < upto; ++j) {
      if (pos0[j] == 0) {
        cache_->Free(batch[j].seq);
      } else {
        (void)cache_->Truncate(batch[j].seq, pos0[j]);
      }
    }
  };
  for (size_t i = 0; i < batch.size(); ++i) {
    pos0[i] = cache_->Length(batch[i].seq);
    absl::Status s = cache_->Reserve(batch[i].seq, static_cast<int32_t>(batch[i].tokens.size()));
    if (!s.ok()) {
      undo(i);
      return s;
    }
  }
  absl::Status s = Run(batch, pos0, n, logits);
  if (!s.ok()) {
    undo(batch.size());
    return s;
  }
  for (size_t i = 0; i < batch.size(); ++i) {
    cache_->Commit(batch[i].seq, pos0[i] + static_cast<int32_t>(batch[i].tokens.size()));
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaForward::Run(std::span<const BatchEntry> batch,
                                   const std::vector<int32_t>& pos0, int64_t n,
                                   std::vector<float>* logits) {
  const int d = config_.d_model;
  // The step's tables on the host, then one copy (layout in the header).
  int max_pages = 1;
  for (const BatchEntry& e : batch) {
    max_pages = std::max(max_pages, static_cast<int>(cache_->Pages(e.seq).size()));
  }
  // Only a cache larger than the context could exceed the fixed stride; then the stride
  // grows (and graphs recapture, the stride being part of their signature).
  page_stride_ = std::max(page_stride_, max_pages);
  const size_t rows = static_cast<size_t>(n);
  h_tables_.assign(5 * rows + batch.size() * static_cast<size_t>(page_stride_), 0);
  int32_t* ids = h_tables_.data();
  int32_t* positions = ids + rows;
  int32_t* kv_rows = positions + rows;
  int32_t* table_row = kv_rows + rows;
  int32_t* ctx = table_row + rows;
  int32_t* page_table = ctx + rows;
  size_t t = 0;
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::vector<int32_t>& pages = cache_->Pages(batch[i].seq);
    std::copy(pages.begin(), pages.end(), page_table + i * page_stride_);
    for (size_t j = 0; j < batch[i].tokens.size(); ++j, ++t) {
      const int32_t pos = pos0[i] + static_cast<int32_t>(j);
      ids[t] = batch[i].tokens[j];
      positions[t] = pos;
      kv_rows[t] = cache_->RowOf(batch[i].seq, pos);
      table_row[t] = static_cast<int32_t>(i);
      ctx[t] = pos + 1;
    }
  }
  SPECNODE_RETURN_IF_ERROR(ToDevice(tables_, h_tables_.data(), h_tables_.size() * sizeof(int32_t)));

  const size_t f = sizeof(float);
  SPECNODE_RETURN_IF_ERROR(Ensure(x_, n * d * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(h_, n * d * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(q_, n * n_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(k_, n * n_kv_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(v_, n * n_kv_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(attn_, n * n_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(gate_, n * d_ff_ * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(up_, n * d_ff_ * f));

  // Passes of many rows (prefill chunks) are compute-bound and their sizes rarely repeat:
  // capturing them would cost more than their launches.
  constexpr int64_t kGraphMaxRows = 64;
  if (graphs_ != nullptr && n <= kGraphMaxRows) {
    // Everything Body bakes into its launches besides n.
    GraphSignature sig;
    for (const DeviceBuffer* b : {&x_, &h_, &q_, &k_, &v_, &attn_, &gate_, &up_, &tables_}) {
      sig.Add(b->data());
    }
    sig.Add(static_cast<uint64_t>(page_stride_));
    SPECNODE_RETURN_IF_ERROR(graphs_->Run(stream_, n, sig.value(), [&] { return Body(n); }));
  } else {
    SPECNODE_RETURN_IF_ERROR(Body(n));
  }
  return Head(batch, logits);
}

absl::Status CudaLlamaForward::Body(int64_t n) {
  SPECNODE_RETURN_IF_ERROR(
      CudaEmbeddingRows(token_embd_.view, tables_.as<int32_t>(), n, x_.as<float>(), stream_));
  if (layers_.empty()) return absl::OkStatus();
  // Each layer starts with h = its attention norm of x: here for the first, fused into the
  // previous layer's last residual add for the others.
  SPECNODE_RETURN_IF_ERROR(CudaRmsNorm(x_.as<float>(), layers_[0].attn_norm.as<float>(), n,
                                       config_.d_model, config_.rms_eps, h_.as<float>(), stream_));
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    SPECNODE_RETURN_IF_ERROR(Layer(l, n));
  }
  return absl::OkStatus();
}

absl::Status CudaLlamaForward::Head(std::span<const BatchEntry> batch, std::vector<float>* logits) {
  if (logits == nullptr) {
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  // Final norm and head over the rows that need logits only: one norm launch per run of
  // consecutive rows (a decode batch or a verification pass is a single run).
  const int d = config_.d_model;
  const size_t f = sizeof(float);
  const std::vector<int64_t> out_rows = LogitRows(batch);
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  const int64_t vocab = config_.vocab_size;
  SPECNODE_RETURN_IF_ERROR(Ensure(normed_, n_out * d * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(logits_, n_out * vocab * f));
  for (int64_t r = 0; r < n_out;) {
    int64_t run = 1;
    while (r + run < n_out && out_rows[r + run] == out_rows[r] + run) ++run;
    SPECNODE_RETURN_IF_ERROR(CudaRmsNorm(x_.as<float>() + out_rows[r] * d, output_norm_.as<float>(),
                                         run, d, config_.rms_eps, normed_.as<float>() + r * d,
                                         stream_));
    r += run;
  }
  SPECNODE_RETURN_IF_ERROR(
      CudaMatMul(mm_.get(), output_.view, normed_.as<float>(), n_out, logits_.as<float>()));
  logits->resize(static_cast<size_t>(n_out * vocab));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), logits_.data(), logits->size() * f,
                                                cudaMemcpyDeviceToHost, stream_));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaLlamaForward::Layer(int l, int64_t n) {
  const DeviceLayer& lw = layers_[l];
  const int d = config_.d_model;
  const int hd = config_.head_dim;
  float* x = x_.as<float>();
  float* h = h_.as<float>();
  float* q = q_.as<float>();
  float* k = k_.as<float>();
  float* v = v_.as<float>();
  float* attn = attn_.as<float>();
  float* gate = gate_.as<float>();
  float* up = up_.as<float>();
  CudaMatMulContext* mm = mm_.get();

  // Attention block; h = attention norm of x already (Body).
  {
    const WeightView ws[] = {lw.wq.view, lw.wk.view, lw.wv.view};
    float* const ys[] = {q, k, v};
    SPECNODE_RETURN_IF_ERROR(CudaMatMulSharedInput(mm, ws, h, n, ys));
  }
  const int32_t* tables = tables_.as<int32_t>();
  const int32_t* positions = tables + n;
  const int32_t* kv_rows = tables + 2 * n;
  SPECNODE_RETURN_IF_ERROR(CudaRopeNormPair(q, k, positions, n, n_heads_, n_kv_heads_, hd,
                                            config_.rope_dim, config_.rope_base, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaKvWrite(k, v, kv_rows, n, cache_->kv_dim(), cache_->k_pool(l),
                                       cache_->v_pool(l), stream_));
  CudaAttentionArgs a;
  a.q = q;
  a.k_pool = cache_->k_pool(l);
  a.v_pool = cache_->v_pool(l);
  a.page_table = tables + 5 * n;
  a.table_row = tables + 3 * n;
  a.ctx = tables + 4 * n;
  a.n = n;
  a.n_heads = n_heads_;
  a.n_kv_heads = n_kv_heads_;
  a.head_dim = hd;
  a.page_tokens = cache_->options().page_tokens;
  a.max_pages = page_stride_;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.out = attn;
  SPECNODE_RETURN_IF_ERROR(CudaPagedAttention(a, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.wo.view, attn, n, h));
  SPECNODE_RETURN_IF_ERROR(AllReduce(h, n * d));
  // Residual add + feed-forward norm in one launch.
  SPECNODE_RETURN_IF_ERROR(
      CudaAddRmsNorm(x, h, lw.ffn_norm.as<float>(), n, d, config_.rms_eps, h, stream_));

  // Feed-forward block.
  {
    const WeightView ws[] = {lw.w_gate.view, lw.w_up.view};
    float* const ys[] = {gate, up};
    SPECNODE_RETURN_IF_ERROR(CudaMatMulSharedInput(mm, ws, h, n, ys));
  }
  SPECNODE_RETURN_IF_ERROR(CudaSwiGlu(gate, up, n * d_ff_, gate, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.w_down.view, gate, n, h));
  SPECNODE_RETURN_IF_ERROR(AllReduce(h, n * d));
  // Residual add, fused with the next layer's attention norm where there is one.
  if (l + 1 < static_cast<int>(layers_.size())) {
    return CudaAddRmsNorm(x, h, layers_[l + 1].attn_norm.as<float>(), n, d, config_.rms_eps, h,
                          stream_);
  }
  return CudaAddInPlace(x, h, n * d, stream_);
}

absl::Status CudaLlamaForward::AllReduce(float* h, int64_t count) {
  if (reducer_ == nullptr) return absl::OkStatus();
  // The reducer runs on its own stream and returns when the sum is in place: the partial
  // sums must be complete first, and later kernels on stream_ start after it returned.
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return reducer_->AllReduceSum(h, count);
}

}  // namespace specnode
