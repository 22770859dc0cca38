#include "cuda/cuda_llama_forward.h"

#include <algorithm>
#include <cmath>
#include <cstring>

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
  return buf.Reserve(std::max<size_t>(bytes, 1));
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
  // The step's tables on the host, then one copy each.
  h_ids_.clear();
  h_positions_.clear();
  h_kv_rows_.clear();
  h_table_row_.clear();
  h_ctx_.clear();
  max_pages_ = 1;
  for (const BatchEntry& e : batch) {
    max_pages_ = std::max(max_pages_, static_cast<int>(cache_->Pages(e.seq).size()));
  }
  h_page_table_.assign(batch.size() * static_cast<size_t>(max_pages_), 0);
  for (size_t i = 0; i < batch.size(); ++i) {
    const std::vector<int32_t>& pages = cache_->Pages(batch[i].seq);
    std::copy(pages.begin(), pages.end(), h_page_table_.begin() + i * max_pages_);
    for (size_t j = 0; j < batch[i].tokens.size(); ++j) {
      const int32_t pos = pos0[i] + static_cast<int32_t>(j);
      h_ids_.push_back(batch[i].tokens[j]);
      h_positions_.push_back(pos);
      h_kv_rows_.push_back(cache_->RowOf(batch[i].seq, pos));
      h_table_row_.push_back(static_cast<int32_t>(i));
      h_ctx_.push_back(pos + 1);
    }
  }
  const size_t ints = static_cast<size_t>(n) * sizeof(int32_t);
  SPECNODE_RETURN_IF_ERROR(ToDevice(ids_, h_ids_.data(), ints));
  SPECNODE_RETURN_IF_ERROR(ToDevice(positions_, h_positions_.data(), ints));
  SPECNODE_RETURN_IF_ERROR(ToDevice(kv_rows_, h_kv_rows_.data(), ints));
  SPECNODE_RETURN_IF_ERROR(ToDevice(table_row_, h_table_row_.data(), ints));
  SPECNODE_RETURN_IF_ERROR(ToDevice(ctx_, h_ctx_.data(), ints));
  SPECNODE_RETURN_IF_ERROR(
      ToDevice(page_table_, h_page_table_.data(), h_page_table_.size() * sizeof(int32_t)));

  const size_t f = sizeof(float);
  SPECNODE_RETURN_IF_ERROR(Ensure(x_, n * d * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(h_, n * d * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(q_, n * n_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(k_, n * n_kv_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(v_, n * n_kv_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(attn_, n * n_heads_ * config_.head_dim * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(gate_, n * d_ff_ * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(up_, n * d_ff_ * f));

  SPECNODE_RETURN_IF_ERROR(
      CudaEmbeddingRows(token_embd_.view, ids_.as<int32_t>(), n, x_.as<float>(), stream_));
  for (int l = 0; l < static_cast<int>(layers_.size()); ++l) {
    SPECNODE_RETURN_IF_ERROR(Layer(l, n));
  }
  if (logits == nullptr) {
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
    return absl::OkStatus();
  }
  // Final norm and head over the rows that need logits only.
  const std::vector<int64_t> out_rows = LogitRows(batch);
  const int64_t n_out = static_cast<int64_t>(out_rows.size());
  const int64_t vocab = config_.vocab_size;
  SPECNODE_RETURN_IF_ERROR(Ensure(normed_, n_out * d * f));
  SPECNODE_RETURN_IF_ERROR(Ensure(logits_, n_out * vocab * f));
  for (int64_t r = 0; r < n_out; ++r) {
    SPECNODE_RETURN_IF_ERROR(CudaRmsNorm(x_.as<float>() + out_rows[r] * d,
                                         output_norm_.as<float>(), 1, d, config_.rms_eps,
                                         normed_.as<float>() + r * d, stream_));
  }
  SPECNODE_RETURN_IF_ERROR(
      CudaMatMul(mm_.get(), output_.view, normed_.as<float>(), n_out, logits_.as<float>()));
  logits->resize(static_cast<size_t>(n_out * vocab));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(logits->data(), logits_.data(),
                                                logits->size() * f, cudaMemcpyDeviceToHost,
                                                stream_));
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

  // Attention block.
  SPECNODE_RETURN_IF_ERROR(
      CudaRmsNorm(x, lw.attn_norm.as<float>(), n, d, config_.rms_eps, h, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.wq.view, h, n, q));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.wk.view, h, n, k));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.wv.view, h, n, v));
  const int32_t* positions = positions_.as<int32_t>();
  SPECNODE_RETURN_IF_ERROR(
      CudaRopeNorm(q, positions, n, n_heads_, hd, config_.rope_dim, config_.rope_base, stream_));
  SPECNODE_RETURN_IF_ERROR(
      CudaRopeNorm(k, positions, n, n_kv_heads_, hd, config_.rope_dim, config_.rope_base, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaKvWrite(k, v, kv_rows_.as<int32_t>(), n, cache_->kv_dim(),
                                       cache_->k_pool(l), cache_->v_pool(l), stream_));
  CudaAttentionArgs a;
  a.q = q;
  a.k_pool = cache_->k_pool(l);
  a.v_pool = cache_->v_pool(l);
  a.page_table = page_table_.as<int32_t>();
  a.table_row = table_row_.as<int32_t>();
  a.ctx = ctx_.as<int32_t>();
  a.n = n;
  a.n_heads = n_heads_;
  a.n_kv_heads = n_kv_heads_;
  a.head_dim = hd;
  a.page_tokens = cache_->options().page_tokens;
  a.max_pages = max_pages_;
  a.scale = 1.0f / std::sqrt(static_cast<float>(hd));
  a.out = attn;
  SPECNODE_RETURN_IF_ERROR(CudaPagedAttention(a, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.wo.view, attn, n, h));
  SPECNODE_RETURN_IF_ERROR(AllReduce(h, n * d));
  SPECNODE_RETURN_IF_ERROR(CudaAddInPlace(x, h, n * d, stream_));

  // Feed-forward block.
  SPECNODE_RETURN_IF_ERROR(
      CudaRmsNorm(x, lw.ffn_norm.as<float>(), n, d, config_.rms_eps, h, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.w_gate.view, h, n, gate));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.w_up.view, h, n, up));
  SPECNODE_RETURN_IF_ERROR(CudaSwiGlu(gate, up, n * d_ff_, gate, stream_));
  SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm, lw.w_down.view, gate, n, h));
  SPECNODE_RETURN_IF_ERROR(AllReduce(h, n * d));
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
