// CpuBackend: the reference Backend (backend.h) — the CPU kernels of cpu_matmul.h and
// cpu_ops.h, split across a ThreadPool. What every other backend is tested against.
//
// Work splitting (none of it changes a result: every kernel is batch-invariant and
// row-independent): matmuls split output rows across the pool (cpu_matmul.h); RoPE splits
// tokens from 4 tokens on; SwiGLU splits values from 1024 on; norms, adds and embedding
// rows run on the calling thread. RoPE angles depend on the position only, so they are
// computed once per pass (per rope_dim and base) and reused by every layer.
//
// Matmuls round activations as `act` says (ActQuant, cpu_matmul.h). UploadWeights returns
// the host weights unchanged, except that where the kernels have a row-interleaved variant
// (UsesPackedWeights) every quantised matrix gets a packed copy (WeightView::packed; one
// more copy of those bytes in memory, made once, ~0.1 s for SmolLM2). Not thread-safe (Backend
// contract); the pool is borrowed and may be null (single thread).
#pragma once

#include <array>
#include <memory>
#include <string>
#include <vector>

#include "model/cpu/cpu_matmul.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/backend.h"
#include "model/llama/backend_caps.h"

namespace specnode {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(ThreadPool* pool, ActQuant act = ActQuant::kInt16);

  // The reference runs every feature of the graph, any head_dim, int8 activations too.
  static BackendCaps Caps();

  Device device() const override { return Device::Cpu(); }
  std::string Describe() const override;
  absl::StatusOr<std::shared_ptr<const LlamaWeights>> UploadWeights(
      std::shared_ptr<const LlamaWeights> weights) override;
  absl::StatusOr<float*> Buffer(int slot, int64_t floats) override;
  absl::Status BeginPass(std::span<const int32_t> ids, std::span<const int32_t> positions) override;
  absl::Status EmbeddingRows(const WeightView& table, float* out) override;
  absl::Status RmsNorm(const float* x, const float* weight, int64_t n, int dim, float eps,
                       float* y) override;
  absl::Status AddRmsNorm(float* x, const float* h, const float* weight, int64_t n, int dim,
                          float eps, float* y) override;
  absl::Status RmsNormRows(const float* x, std::span<const int64_t> rows, const float* weight,
                           int dim, float eps, float* y) override;
  absl::Status Add(float* y, const float* x, int64_t count) override;
  absl::Status MatMul(const WeightView& w, const float* x, int64_t n, float* y) override;
  absl::Status MatMulShared(std::span<const WeightView> ws, const float* x, int64_t n,
                            std::span<float* const> ys) override;
  absl::Status RopePair(float* q, float* k, int64_t n, int n_heads, int n_kv_heads, int head_dim,
                        int rope_dim, float base, RopeMode mode,
                        const float* freq_factors) override;
  absl::Status AddBias(float* y, const float* bias, int64_t n, int dim) override;
  absl::Status SwiGlu(const float* gate, const float* up, int64_t count, float* out) override;
  absl::Status GeGlu(const float* gate, const float* up, int64_t count, float* out) override;
  absl::Status Scale(float* x, int64_t count, float s) override;
  absl::Status AllReduce(PartialSumReducer* reducer, float* data, int64_t count) override;
  absl::StatusOr<float*> LogitsBuffer(int64_t floats, std::vector<float>* host) override;
  absl::Status FinishLogits(const float* logits, int64_t floats, std::vector<float>* host) override;
  absl::Status Sync() override { return absl::OkStatus(); }
  ThreadPool* host_threads() const override { return pool_; }

  ActQuant activations() const { return act_; }

  // UploadWeights without the Status (it cannot fail on the CPU): `weights` with every
  // matrix MatMul with `act` does not run as stored (RunsStorageType) converted to its
  // compute type, and packed copies where MatMul uses them (UsesPackedWeights); `weights`
  // itself when neither applies.
  // Every CpuBackend user passes its weights through this (or UploadWeights) once.
  static std::shared_ptr<const LlamaWeights> ForKernels(std::shared_ptr<const LlamaWeights> weights,
                                                        ActQuant act);

 private:
  ThreadPool* pool_;
  ActQuant act_;
  MatMulScratch scratch_;
  std::array<std::vector<float>, kMaxSlots> buffers_;
  std::vector<int32_t> ids_, positions_;
  // RoPE (cos, sin) tables of the pass's positions [n, rope_dim] (cpu_ops.h RopeAngles), for
  // the (rope_dim, base) each was computed with: two, as Gemma 3's local and global layers
  // alternate bases; refilled in turn when neither matches, dropped at BeginPass.
  struct RopeTable {
    std::vector<float> angles;
    int dim = -1;
    float base = 0.0f;
    const float* factors = nullptr;
  };
  std::array<RopeTable, 2> rope_tables_;
  int rope_next_ = 0;
};

}  // namespace specnode
