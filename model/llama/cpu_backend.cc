#include "model/llama/cpu_backend.h"

#include <cassert>

#include "absl/strings/str_cat.h"
#include "model/cpu/cpu_features.h"
#include "model/cpu/cpu_ops.h"

namespace specnode {
namespace {

// Elementwise work is split across the pool from this many values on (a hand-off costs about
// as much as ~1000 exp evaluations).
constexpr int64_t kMinParallelElementwise = 1024;
// RoPE is split across the pool from this many tokens on.
constexpr int64_t kMinParallelRopeTokens = 4;

}  // namespace

BackendCaps CpuBackend::Caps() {
  BackendCaps c;
  c.features = AllGraphFeatures();
  c.int8_activations = true;
  return c;
}

CpuBackend::CpuBackend(ThreadPool* pool, ActQuant act) : pool_(pool), act_(act) {}

std::string CpuBackend::Describe() const {
  // Whether Q4_K / Q5_K / Q6_K matrices run as stored or converted (RunsStorageType): the
  // same answer for the three types.
  const char* k_quants = RunsStorageType(GgmlType::kQ4_K, act_) ? "native" : "converted";
  // The same for Q5_0 / Q5_1.
  const char* q5 = RunsStorageType(GgmlType::kQ5_0, act_) ? "native" : "converted";
  return absl::StrCat("cpu (", CpuKernelName(), " kernels, ", ActQuantName(act_),
                      " activations, K-quants ", k_quants, ", Q5 ", q5, ", ",
                      pool_ == nullptr ? 1 : pool_->n_threads(), " threads)");
}

namespace {

// Weights with converted and row-interleaved copies beside the originals (which stay alive:
// embedding lookups, norms and any unpacked matrix still point into them).
struct PackedWeights {
  std::shared_ptr<const LlamaWeights> original;
  LlamaWeights view;
  std::vector<std::vector<uint8_t>> copies;  // moving a vector keeps its buffer
  std::vector<std::unique_ptr<std::vector<uint8_t>>> converted;
};

}  // namespace

absl::StatusOr<std::shared_ptr<const LlamaWeights>> CpuBackend::UploadWeights(
    std::shared_ptr<const LlamaWeights> weights) {
  return ForKernels(std::move(weights), act_);
}

std::shared_ptr<const LlamaWeights> CpuBackend::ForKernels(
    std::shared_ptr<const LlamaWeights> weights, ActQuant act) {
  const bool pack = UsesPackedWeights(act);
  auto p = std::make_shared<PackedWeights>();
  p->original = weights;
  auto matrix = [&](const WeightView& m) -> absl::StatusOr<WeightView> {
    // Storage types these kernels do not run (K-quants and Q5_0 / Q5_1 on tables without
    // x8 kernels for them, or with SPECNODE_REPACK=0 / SPECNODE_KQUANT_NATIVE=0 /
    // SPECNODE_Q5_NATIVE=0) become their 32-value compute type first.
    WeightView v = RunsStorageType(m.type, act) ? m : ConvertToComputeType(m, &p->converted);
    if (!pack) return v;
    std::vector<uint8_t> copy = PackWeights(v);
    if (!copy.empty()) {
      v.packed = copy.data();
      p->copies.push_back(std::move(copy));
    }
    return v;
  };
  auto norm = [](const float* v, int64_t) -> absl::StatusOr<const float*> { return v; };
  absl::StatusOr<LlamaWeights> view = MapWeightViews(*weights, matrix, norm);
  assert(view.ok() && "the callbacks above never fail");
  // Nothing packed or converted: the weights serve as they are (the view costs nothing).
  if (p->copies.empty() && p->converted.empty()) return weights;
  p->view = *std::move(view);
  return std::shared_ptr<const LlamaWeights>(p, &p->view);
}

absl::StatusOr<float*> CpuBackend::Buffer(int slot, int64_t floats) {
  if (slot < 0 || slot >= kMaxSlots || floats < 0) {
    return absl::InvalidArgumentError(absl::StrCat("CpuBackend::Buffer(", slot, ", ", floats, ")"));
  }
  std::vector<float>& b = buffers_[slot];
  if (static_cast<int64_t>(b.size()) < floats) b.resize(floats);
  return b.data();
}

absl::Status CpuBackend::BeginPass(std::span<const int32_t> ids,
                                   std::span<const int32_t> positions) {
  if (ids.size() != positions.size()) {
    return absl::InvalidArgumentError("CpuBackend::BeginPass: ids and positions differ in length");
  }
  ids_.assign(ids.begin(), ids.end());
  positions_.assign(positions.begin(), positions.end());
  for (RopeTable& t : rope_tables_) t.dim = -1;  // the angles are the new positions'
  return absl::OkStatus();
}

absl::Status CpuBackend::EmbeddingRows(const WeightView& table, float* out) {
  for (size_t r = 0; r < ids_.size(); ++r) {
    EmbeddingRow(table, ids_[r], out + r * table.cols);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNorm(const float* x, const float* weight, int64_t n, int dim, float eps,
                                 float* y) {
  specnode::RmsNorm(x, weight, n, dim, eps, y);
  return absl::OkStatus();
}

absl::Status CpuBackend::AddRmsNorm(float* x, const float* h, const float* weight, int64_t n,
                                    int dim, float eps, float* y) {
  AddInPlace(x, h, n * dim);
  specnode::RmsNorm(x, weight, n, dim, eps, y);
  return absl::OkStatus();
}

absl::Status CpuBackend::RmsNormRows(const float* x, std::span<const int64_t> rows,
                                     const float* weight, int dim, float eps, float* y) {
  for (size_t r = 0; r < rows.size(); ++r) {
    specnode::RmsNorm(x + rows[r] * dim, weight, 1, dim, eps, y + r * dim);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Add(float* y, const float* x, int64_t count) {
  AddInPlace(y, x, count);
  return absl::OkStatus();
}

absl::Status CpuBackend::MatMul(const WeightView& w, const float* x, int64_t n, float* y) {
  specnode::MatMul(w, x, n, y, pool_, &scratch_, act_);
  return absl::OkStatus();
}

absl::Status CpuBackend::MatMulShared(std::span<const WeightView> ws, const float* x, int64_t n,
                                      std::span<float* const> ys) {
  specnode::MatMulShared(ws, x, n, ys, pool_, &scratch_, act_);
  return absl::OkStatus();
}

absl::Status CpuBackend::RopePair(float* q, float* k, int64_t n, int n_heads, int n_kv_heads,
                                  int head_dim, int rope_dim, float base, RopeMode mode,
                                  const float* freq_factors) {
  if (n != static_cast<int64_t>(positions_.size())) {
    return absl::InvalidArgumentError("CpuBackend::RopePair: n is not the pass's row count");
  }
  RopeTable* table = nullptr;
  for (RopeTable& t : rope_tables_) {
    if (t.dim == rope_dim && t.base == base && t.factors == freq_factors) table = &t;
  }
  if (table == nullptr) {
    table = &rope_tables_[rope_next_];
    rope_next_ = 1 - rope_next_;
    table->angles.resize(static_cast<size_t>(n) * rope_dim);
    RopeAngles(positions_.data(), n, rope_dim, base, table->angles.data(), freq_factors);
    table->dim = rope_dim;
    table->base = base;
    table->factors = freq_factors;
  }
  const float* angles = table->angles.data();
  const int rd = rope_dim;
  const int64_t q_row = static_cast<int64_t>(n_heads) * head_dim;
  const int64_t k_row = static_cast<int64_t>(n_kv_heads) * head_dim;
  const bool neox = mode == RopeMode::kNeox;
  auto rope = [&](int64_t t0, int64_t t1, int) {
    RopeApply(q + t0 * q_row, angles + t0 * rd, t1 - t0, n_heads, head_dim, rd, neox);
    RopeApply(k + t0 * k_row, angles + t0 * rd, t1 - t0, n_kv_heads, head_dim, rd, neox);
  };
  // Verification passes and prefill split their tokens across the pool.
  if (pool_ != nullptr && n >= kMinParallelRopeTokens) {
    pool_->ParallelFor(n, 1, rope);
  } else {
    rope(0, n, 0);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::AddBias(float* y, const float* bias, int64_t n, int dim) {
  for (int64_t r = 0; r < n; ++r) AddInPlace(y + r * dim, bias, dim);
  return absl::OkStatus();
}

absl::Status CpuBackend::SwiGlu(const float* gate, const float* up, int64_t count, float* out) {
  // Elementwise, so split across the pool: serial, SwiGLU's exp would leave the workers
  // idle for ~3% of a verification step.
  auto swiglu = [&](int64_t b, int64_t e, int) {
    specnode::SwiGlu(gate + b, up + b, e - b, out + b);
  };
  if (pool_ != nullptr && count >= kMinParallelElementwise) {
    pool_->ParallelFor(count, 64, swiglu);
  } else {
    swiglu(0, count, 0);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::GeGlu(const float* gate, const float* up, int64_t count, float* out) {
  auto geglu = [&](int64_t b, int64_t e, int) {
    specnode::GeGlu(gate + b, up + b, e - b, out + b);
  };
  if (pool_ != nullptr && count >= kMinParallelElementwise) {
    pool_->ParallelFor(count, 64, geglu);
  } else {
    geglu(0, count, 0);
  }
  return absl::OkStatus();
}

absl::Status CpuBackend::Scale(float* x, int64_t count, float s) {
  ScaleInPlace(x, count, s);
  return absl::OkStatus();
}

absl::Status CpuBackend::AllReduce(PartialSumReducer* reducer, float* data, int64_t count) {
  if (reducer == nullptr) return absl::OkStatus();
  return reducer->AllReduceSum(data, count);
}

absl::StatusOr<float*> CpuBackend::LogitsBuffer(int64_t floats, std::vector<float>* host) {
  host->resize(static_cast<size_t>(floats));
  return host->data();
}

absl::Status CpuBackend::FinishLogits(const float* logits, int64_t floats,
                                      std::vector<float>* host) {
  if (logits != host->data() || static_cast<int64_t>(host->size()) != floats) {
    return absl::InvalidArgumentError("CpuBackend::FinishLogits: not the LogitsBuffer of *host");
  }
  return absl::OkStatus();
}

}  // namespace specnode
