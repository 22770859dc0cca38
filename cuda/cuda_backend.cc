#include "cuda/cuda_backend.h"

#include <algorithm>
#include <bit>
#include <cstdlib>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "cuda/cuda_check.h"
#include "cuda/cuda_embedding.h"
#include "cuda/cuda_ops.h"
#include "cuda/cuda_sample.h"
#include "cuda/cuda_topk.h"
#include "model/gguf/ggml_converted_types.h"
#include "model/gguf/ggml_types.h"
#include "model/llama/sampling.h"
#include "model/status_macros.h"

namespace specnode {

void CudaStepTables::Restart() {
  host_.clear();
  uploaded_ = false;
}

int64_t CudaStepTables::Stage(int64_t count) {
  if (uploaded_) {
    host_.clear();
    uploaded_ = false;
  }
  const int64_t offset = static_cast<int64_t>(host_.size());
  host_.resize(host_.size() + count, 0);
  return offset;
}

absl::Status CudaStepTables::Upload(cudaStream_t stream) {
  if (uploaded_) return absl::OkStatus();
  const size_t bytes = host_.size() * sizeof(int32_t);
  if (bytes > buffer_.size()) {
    SPECNODE_RETURN_IF_ERROR(buffer_.Reserve(std::bit_ceil(std::max<size_t>(bytes, 256))));
  }
  if (bytes > 0) {
    SPECNODE_CUDA_RETURN_IF_ERROR(
        cudaMemcpyAsync(buffer_.data(), host_.data(), bytes, cudaMemcpyHostToDevice, stream));
  }
  uploaded_ = true;
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<CudaBackend>> CudaBackend::Create(const CudaBackendOptions& o) {
  SPECNODE_ASSIGN_OR_RETURN(const int devices, CudaDeviceCount());
  if (o.device < 0 || o.device >= devices) {
    return absl::InvalidArgumentError(
        absl::StrCat("cuda:", o.device, " does not exist (", devices, " CUDA devices visible)"));
  }
  std::unique_ptr<CudaBackend> b(new CudaBackend());
  b->device_ = o.device;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(o.device));
  cudaDeviceProp prop;
  const bool have_prop = cudaGetDeviceProperties(&prop, o.device) == cudaSuccess;
  if (have_prop) b->device_name_ = prop.name;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamCreateWithFlags(&b->stream_, cudaStreamNonBlocking));
  SPECNODE_ASSIGN_OR_RETURN(b->mm_, CudaMatMulContext::Create(b->stream_));
  const char* env = std::getenv("SPECNODE_CUDA_GRAPHS");
  const bool env_off = env != nullptr && std::string(env) == "0";
  if (o.cuda_graphs && !env_off) b->graphs_ = std::make_unique<CudaGraphCache>();
  const char* qa_env = std::getenv("SPECNODE_CUDA_QUANT_ACT");
  b->quant_act_ = o.quant_act && !(qa_env != nullptr && std::string(qa_env) == "0");
  // int8 mma.m16n8k16 needs sm_80; older devices keep the dp2a kernel (the same bits).
  const char* tc_env = std::getenv("SPECNODE_CUDA_TENSOR_CORES");
  b->mm_->set_tensor_cores(o.tensor_cores && have_prop && prop.major >= 8 &&
                           !(tc_env != nullptr && std::string(tc_env) == "0"));
  // Where tensor cores take over from dp2a, for finding the crossover on a device (the same
  // bits either way): SPECNODE_CUDA_MMA_MIN_TOKENS=N, a positive integer.
  if (const char* mt = std::getenv("SPECNODE_CUDA_MMA_MIN_TOKENS"); mt != nullptr) {
    char* end = nullptr;
    const long v = std::strtol(mt, &end, 10);
    if (end == mt || *end != '\0' || v < 1) {
      return absl::InvalidArgumentError(
          absl::StrCat("SPECNODE_CUDA_MMA_MIN_TOKENS must be a positive integer, not '", mt, "'"));
    }
    b->mm_->set_mma_min_tokens(v);
  }
  return b;
}

CudaBackend::~CudaBackend() {
  if (stream_ != nullptr) (void)cudaStreamSynchronize(stream_);
  graphs_.reset();
  mm_.reset();  // its cuBLAS handle is bound to stream_
  if (stream_ != nullptr) (void)cudaStreamDestroy(stream_);
}

absl::StatusOr<DeviceMemoryInfo> CudaBackend::MemoryInfo() const {
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  size_t free_bytes = 0, total_bytes = 0;
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemGetInfo(&free_bytes, &total_bytes));
  return DeviceMemoryInfo{static_cast<int64_t>(total_bytes),
                          static_cast<int64_t>(total_bytes - free_bytes)};
}

std::string CudaBackend::Describe() const {
  // Which matmuls run, so that a log or a bench record says which path it measured.
  return absl::StrCat(
      "cuda:", device_, device_name_.empty() ? "" : " (" + device_name_ + ")",
      quant_act_ ? ", int16-activation matmuls (kQuantAct" : ", f32-activation matmuls (kFused",
      quant_act_ && mm_->tensor_cores() ? ", on tensor cores from 32 tokens)" : ")",
      graphs_ != nullptr ? ", CUDA graphs" : ", eager");
}

namespace {

// Weights on the device: the views (LlamaWeights with device pointers) and the buffers
// behind them.
struct DeviceWeights {
  LlamaWeights view;
  std::vector<DeviceBuffer> buffers;
};

}  // namespace

BackendCaps CudaBackend::Caps() {
  BackendCaps c;
  c.features = AllGraphFeatures();
  c.max_head_dim = 256;
  c.int8_activations = false;
  return c;
}

absl::StatusOr<std::shared_ptr<const LlamaWeights>> CudaBackend::UploadWeights(
    std::shared_ptr<const LlamaWeights> weights) {
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  const LlamaWeights& w = *weights;
  // What the graph needs was checked against Caps() before the load (runner_factory.cc);
  // every vector (norms, biases, Q/K norms, post-norms, RoPE factors) uploads as a norm.
  auto d = std::make_shared<DeviceWeights>();
  auto matrix = [&](const WeightView& stored) -> absl::StatusOr<WeightView> {
    // kQuantAct runs the K-quants as stored; other storage-only types (Q5_0 / Q5_1), the
    // K-quants under kFused and a K-quant embedding table (its row lookup has no K-quant
    // kernel; a tied head shares it) are converted to their compute type on the host first
    // (the copy lives until the upload is done).
    std::vector<std::unique_ptr<std::vector<uint8_t>>> converted;
    const bool native = quant_act_ && IsKQuantType(stored.type) && stored.data != w.token_embd.data;
    const WeightView m = native ? stored : ConvertToComputeType(stored, &converted);
    // Compact: each row's own bytes only (a column slice's row_stride spans the whole row).
    const size_t row_bytes = GgmlRowBytes(m.type, m.cols);
    std::vector<uint8_t> host(row_bytes * static_cast<size_t>(m.rows));
    for (int64_t r = 0; r < m.rows; ++r) {
      std::memcpy(host.data() + r * row_bytes,
                  static_cast<const uint8_t*>(m.data) + r * m.row_stride, row_bytes);
    }
    SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer buf, DeviceBuffer::FromHost(host.data(), host.size()));
    weight_bytes_ += static_cast<int64_t>(host.size());
    max_matmul_cols_ = std::max(max_matmul_cols_, m.cols);
    WeightView v{m.type, buf.data(), m.rows, m.cols, row_bytes};
    d->buffers.push_back(std::move(buf));
    return v;
  };
  auto norm = [&](const float* v, int64_t n) -> absl::StatusOr<const float*> {
    SPECNODE_ASSIGN_OR_RETURN(DeviceBuffer buf,
                              DeviceBuffer::FromHost(v, static_cast<size_t>(n) * sizeof(float)));
    weight_bytes_ += n * static_cast<int64_t>(sizeof(float));
    const float* p = buf.as<float>();
    d->buffers.push_back(std::move(buf));
    return p;
  };
  SPECNODE_ASSIGN_OR_RETURN(d->view, MapWeightViews(w, matrix, norm));
  // The views live as long as their buffers: one owner for both.
  return std::shared_ptr<const LlamaWeights>(d, &d->view);
}

absl::Status CudaBackend::Ensure(DeviceBuffer& buf, size_t bytes) { return buf.Grow(bytes); }

absl::StatusOr<float*> CudaBackend::Buffer(int slot, int64_t floats) {
  if (slot < 0 || slot >= kMaxSlots || floats < 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("CudaBackend::Buffer(", slot, ", ", floats, ")"));
  }
  SPECNODE_RETURN_IF_ERROR(Ensure(buffers_[slot], static_cast<size_t>(floats) * sizeof(float)));
  return buffers_[slot].as<float>();
}

absl::Status CudaBackend::BeginPass(std::span<const int32_t> ids,
                                    std::span<const int32_t> positions) {
  if (ids.size() != positions.size()) {
    return absl::InvalidArgumentError("CudaBackend::BeginPass: ids and positions differ in length");
  }
  ForgetQ16();
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaSetDevice(device_));
  rows_ = static_cast<int64_t>(ids.size());
  // First in the step's tables, so that their offsets depend on the rows only (a recorded
  // pass bakes them in); the page pool's tables follow. A fresh start even if the previous
  // pass failed before its upload: stale tables would shift every offset.
  tables_.Restart();
  ids_ = tables_.Stage(rows_);
  positions_ = tables_.Stage(rows_);
  std::copy(ids.begin(), ids.end(), tables_.staged(ids_));
  std::copy(positions.begin(), positions.end(), tables_.staged(positions_));
  // The int16 activations of the pass's widest matmul, reserved here (outside any graph
  // capture) so that the matmuls never grow the scratch inside a recorded body.
  if (quant_act_ && max_matmul_cols_ > 0) {
    SPECNODE_RETURN_IF_ERROR(mm_->ReserveQuantActs(rows_, max_matmul_cols_));
  }
  return absl::OkStatus();
}

const cuda_internal::Q16Acts* CudaBackend::ProduceQ16(const float* y, int64_t values,
                                                      int64_t row_len) {
  q16_of_ = nullptr;
  if (!quant_act_ || row_len % 32 != 0 || values <= 0 || values % 32 != 0) return nullptr;
  // n x row_len values lay out as 1 x values (Q16ActsAt depends on the product only).
  if (!mm_->ReserveQuantActs(1, values).ok()) return nullptr;  // the matmul rounds x then
  q16_acts_ = cuda_internal::Q16ActsAt(const_cast<void*>(mm_->quant_acts()), 1, values);
  q16_of_ = y;
  q16_values_ = values;
  return &q16_acts_;
}

bool CudaBackend::TakeQ16(const float* x, int64_t values) {
  const bool ready = q16_of_ != nullptr && q16_of_ == x && q16_values_ == values;
  q16_of_ = nullptr;
  return ready;
}

absl::Status CudaBackend::EmbeddingRows(const WeightView& table, float* out) {
  ForgetQ16();
  SPECNODE_RETURN_IF_ERROR(UploadTables());
  return CudaEmbeddingRows(table, tables_.device(ids_), rows_, out, stream_);
}

absl::Status CudaBackend::RmsNorm(const float* x, const float* weight, int64_t n, int dim,
                                  float eps, float* y) {
  return CudaRmsNorm(x, weight, n, dim, eps, y, stream_, ProduceQ16(y, n * dim, dim));
}

absl::Status CudaBackend::AddRmsNorm(float* x, const float* h, const float* weight, int64_t n,
                                     int dim, float eps, float* y) {
  return CudaAddRmsNorm(x, h, weight, n, dim, eps, y, stream_, ProduceQ16(y, n * dim, dim));
}

absl::Status CudaBackend::RmsNormRows(const float* x, std::span<const int64_t> rows,
                                      const float* weight, int dim, float eps, float* y) {
  // One launch per run of consecutive rows (a decode batch or a verification pass is one);
  // output row r's int16 blocks at r's place in the scratch.
  const int64_t n = static_cast<int64_t>(rows.size());
  const cuda_internal::Q16Acts* all = ProduceQ16(y, n * dim, dim);
  for (int64_t r = 0; r < n;) {
    int64_t run = 1;
    while (r + run < n && rows[r + run] == rows[r] + run) ++run;
    cuda_internal::Q16Acts part{};
    if (all != nullptr) {
      part = {all->qs + r * dim, all->d + r * dim / 32, all->s + r * dim / 32};
    }
    SPECNODE_RETURN_IF_ERROR(CudaRmsNorm(x + rows[r] * dim, weight, run, dim, eps, y + r * dim,
                                         stream_, all != nullptr ? &part : nullptr));
    r += run;
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Add(float* y, const float* x, int64_t count) {
  ForgetQ16();
  return CudaAddInPlace(y, x, count, stream_);
}

// kQuantAct for the types it runs (the CPU's int16 activations), kStaged for F16 / BF16,
// kFused for F32 — or kFused for everything when turned off.
CudaMatMulAlgo CudaBackend::AlgoFor(const WeightView& w) const {
  const GgmlType type = w.type;
  if (!quant_act_) return CudaMatMulAlgo::kFused;
  if (cuda_internal::Q16Runs(type)) return CudaMatMulAlgo::kQuantAct;
  const bool plain16 = type == GgmlType::kF16 || type == GgmlType::kBF16;
  return plain16 && w.cols % 32 == 0 ? CudaMatMulAlgo::kStaged : CudaMatMulAlgo::kFused;
}

absl::Status CudaBackend::MatMul(const WeightView& w, const float* x, int64_t n, float* y) {
  const CudaMatMulAlgo algo = AlgoFor(w);
  const bool ready = TakeQ16(x, n * w.cols) && algo == CudaMatMulAlgo::kQuantAct;
  return CudaMatMul(mm_.get(), w, x, n, y, algo, ready);
}

absl::Status CudaBackend::MatMulShared(std::span<const WeightView> ws, const float* x, int64_t n,
                                       std::span<float* const> ys) {
  // One algorithm for the call: matrices of mixed types run one CudaMatMul each, each with
  // its own type's algorithm (x rounded by each kQuantAct call itself).
  const bool ready = !ws.empty() && TakeQ16(x, n * ws[0].cols);
  for (const WeightView& w : ws) {
    if (AlgoFor(w) != AlgoFor(ws[0])) {
      for (size_t i = 0; i < ws.size(); ++i) {
        SPECNODE_RETURN_IF_ERROR(CudaMatMul(mm_.get(), ws[i], x, n, ys[i], AlgoFor(ws[i])));
      }
      return absl::OkStatus();
    }
  }
  const CudaMatMulAlgo algo = AlgoFor(ws[0]);
  return CudaMatMulSharedInput(mm_.get(), ws, x, n, ys, algo,
                               ready && algo == CudaMatMulAlgo::kQuantAct);
}

absl::Status CudaBackend::RopePair(float* q, float* k, int64_t n, int n_heads, int n_kv_heads,
                                   int head_dim, int rope_dim, float base, RopeMode mode,
                                   const float* freq_factors) {
  ForgetQ16();
  if (n != rows_) {
    return absl::InvalidArgumentError("CudaBackend::RopePair: n is not the pass's row count");
  }
  // freq_factors: a device copy (UploadWeights), or null.
  SPECNODE_RETURN_IF_ERROR(UploadTables());
  return CudaRopePair(q, k, tables_.device(positions_), n, n_heads, n_kv_heads, head_dim, rope_dim,
                      base, mode == RopeMode::kNeox, freq_factors, stream_);
}

absl::Status CudaBackend::AddBias(float* y, const float* bias, int64_t n, int dim) {
  ForgetQ16();
  return CudaAddBias(y, bias, n, dim, stream_);
}

absl::Status CudaBackend::SwiGlu(const float* gate, const float* up, int64_t count, float* out) {
  // The down projection's input: blocks of 32 consecutive values stay inside its rows when
  // d_ff is a multiple of 32 (its matmul takes them only if n x cols == count).
  return CudaSwiGlu(gate, up, count, out, stream_, ProduceQ16(out, count, 32));
}

absl::Status CudaBackend::GeGlu(const float* gate, const float* up, int64_t count, float* out) {
  // As SwiGlu: the down projection's input.
  return CudaGeGlu(gate, up, count, out, stream_, ProduceQ16(out, count, 32));
}

absl::Status CudaBackend::Scale(float* x, int64_t count, float s) {
  ForgetQ16();
  return CudaScale(x, count, s, stream_);
}

absl::Status CudaBackend::AllReduce(PartialSumReducer* reducer, float* data, int64_t count) {
  ForgetQ16();
  if (reducer == nullptr) return absl::OkStatus();
  // The reducer runs on its own stream and returns when the sum is in place: the partial
  // sums must be complete first, and later kernels on stream_ start after it returned.
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return reducer->AllReduceSum(data, count);
}

absl::StatusOr<float*> CudaBackend::LogitsBuffer(int64_t floats, std::vector<float>* host) {
  SPECNODE_RETURN_IF_ERROR(Ensure(logits_, static_cast<size_t>(floats) * sizeof(float)));
  return logits_.as<float>();
}

absl::Status CudaBackend::FinishLogits(const float* logits, int64_t floats,
                                       std::vector<float>* host) {
  ForgetQ16();
  host->resize(static_cast<size_t>(floats));
  if (floats > 0) {
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(host->data(), logits, floats * sizeof(float),
                                                  cudaMemcpyDeviceToHost, stream_));
  }
  return Sync();
}

absl::Status CudaBackend::SelectHead(const float* logits, int64_t rows, int64_t vocab, int k) {
  if (rows <= 0 || k > kCudaTopKMax) return absl::OkStatus();
  ForgetQ16();
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(std::max(k, 1));
  SPECNODE_RETURN_IF_ERROR(Ensure(argmax_ids_, count * sizeof(int32_t)));
  if (k == 0) return CudaArgMaxRows(logits, rows, vocab, argmax_ids_.as<int32_t>(), stream_);
  SPECNODE_RETURN_IF_ERROR(Ensure(topk_values_, count * sizeof(float)));
  return CudaTopKRows(logits, rows, vocab, k, argmax_ids_.as<int32_t>(), topk_values_.as<float>(),
                      stream_);
}

absl::Status CudaBackend::FinishArgMax(const float* logits, int64_t rows, int64_t vocab,
                                       std::vector<float>* host, std::vector<int32_t>* ids,
                                       bool selected) {
  ForgetQ16();
  ids->resize(static_cast<size_t>(rows));
  if (rows > 0) {
    if (!selected) SPECNODE_RETURN_IF_ERROR(SelectHead(logits, rows, vocab, 0));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        ids->data(), argmax_ids_.data(), rows * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  }
  return Sync();
}

absl::Status CudaBackend::FinishTopK(const float* logits, int64_t rows, int64_t vocab, int k,
                                     std::vector<float>* host, std::vector<int32_t>* ids,
                                     std::vector<float>* values, bool selected) {
  if (k > kCudaTopKMax) {
    return Backend::FinishTopK(logits, rows, vocab, k, host, ids, values, selected);
  }
  ForgetQ16();
  const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(k);
  ids->resize(count);
  values->resize(count);
  if (rows > 0) {
    if (!selected) SPECNODE_RETURN_IF_ERROR(SelectHead(logits, rows, vocab, k));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
        ids->data(), argmax_ids_.data(), count * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(values->data(), topk_values_.data(),
                                                  count * sizeof(float), cudaMemcpyDeviceToHost,
                                                  stream_));
  }
  return Sync();
}

absl::Status CudaBackend::FinishDraws(const float* logits, int64_t rows, int64_t vocab,
                                      std::span<const sample::DrawParams> draws,
                                      std::vector<float>* host, std::vector<int32_t>* ids) {
  SPECNODE_RETURN_IF_ERROR(CheckDrawCount("FinishDraws", draws.size(), rows));
  ForgetQ16();
  ids->resize(static_cast<size_t>(rows));
  if (rows == 0) return Sync();
  const size_t bytes = draws.size_bytes();
  SPECNODE_RETURN_IF_ERROR(Ensure(draw_params_, bytes));
  SPECNODE_RETURN_IF_ERROR(Ensure(argmax_ids_, static_cast<size_t>(rows) * sizeof(int32_t)));
  SPECNODE_CUDA_RETURN_IF_ERROR(
      cudaMemcpyAsync(draw_params_.data(), draws.data(), bytes, cudaMemcpyHostToDevice, stream_));
  CudaDrawHead head;
  const bool nucleus = std::any_of(draws.begin(), draws.end(), [](const sample::DrawParams& d) {
    return d.inv_t != 0.0f && d.top_p < 1.0f;
  });
  if (nucleus) {  // top-p rows race the heads of every row, sorted first
    static_assert(sample::kNucleusHead <= kCudaTopKMax, "the top-k kernel sorts the head");
    head.k = static_cast<int>(std::min<int64_t>(sample::kNucleusHead, vocab));
    const size_t count = static_cast<size_t>(rows) * static_cast<size_t>(head.k);
    SPECNODE_RETURN_IF_ERROR(Ensure(draw_head_ids_, count * sizeof(int32_t)));
    SPECNODE_RETURN_IF_ERROR(Ensure(draw_head_values_, count * sizeof(float)));
    SPECNODE_RETURN_IF_ERROR(CudaTopKRows(logits, rows, vocab, head.k, draw_head_ids_.as<int32_t>(),
                                          draw_head_values_.as<float>(), stream_));
    head.ids = draw_head_ids_.as<int32_t>();
    head.values = draw_head_values_.as<float>();
  }
  SPECNODE_RETURN_IF_ERROR(CudaDrawRows(logits, rows, vocab, draw_params_.as<sample::DrawParams>(),
                                        head, argmax_ids_.as<int32_t>(), stream_));
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpyAsync(
      ids->data(), argmax_ids_.data(), rows * sizeof(int32_t), cudaMemcpyDeviceToHost, stream_));
  SPECNODE_RETURN_IF_ERROR(Sync());
  // A nucleus wider than the head (a flat distribution): that row's logits come to the host.
  for (int64_t r = 0; r < rows; ++r) {
    if ((*ids)[r] != -2) continue;
    host->resize(static_cast<size_t>(vocab));
    SPECNODE_CUDA_RETURN_IF_ERROR(cudaMemcpy(host->data(), logits + r * vocab,
                                             vocab * sizeof(float), cudaMemcpyDeviceToHost));
    DrawRows(host->data(), 1, vocab, &draws[r], &(*ids)[r]);
  }
  return absl::OkStatus();
}

absl::Status CudaBackend::Sync() {
  SPECNODE_CUDA_RETURN_IF_ERROR(cudaStreamSynchronize(stream_));
  return absl::OkStatus();
}

absl::Status CudaBackend::Record(int64_t rows, uint64_t signature,
                                 const std::function<absl::Status()>& body) {
  // The step's tables go first, outside any capture; their buffer is part of what the
  // launches bake in.
  SPECNODE_RETURN_IF_ERROR(UploadTables());
  // Passes of many rows (prefill chunks) are compute-bound and their sizes rarely repeat:
  // capturing them would cost more than their launches.
  constexpr int64_t kGraphMaxRows = 64;
  if (graphs_ == nullptr || rows > kGraphMaxRows) return body();
  // The backend's own buffers the body's launches bake in (the head's selection included).
  const void* const baked[] = {tables_.device_base(), mm_->quant_acts(), argmax_ids_.data(),
                               topk_values_.data()};
  uint64_t sig = signature;
  for (const void* p : baked) sig = MixSignature(sig, reinterpret_cast<uintptr_t>(p));
  return graphs_->Run(stream_, rows, sig, body);
}

}  // namespace specnode
