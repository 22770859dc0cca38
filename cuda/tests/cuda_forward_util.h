// Shared by the GPU forward tests (cuda_forward_test.cc, cuda_arch_test.cc): tiny model
// files, token runs, the graph on one GPU over its page pool (GpuPass) and the GPU-vs-CPU
// logits tolerance (ExpectCloseRows, explained at the top of cuda_forward_test.cc).
#pragma once

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_page_pool.h"
#include "gtest/gtest.h"
#include "kvstore/kv_store.h"
#include "model/llama/llama_forward.h"
#include "model/llama/llama_model.h"
#include "model/llama/sampling.h"
#include "model/llama/tiny_model.h"
#include "model/status_macros.h"

namespace specnode::cuda_fwd {

inline std::string TinyModel(const TinyModelOptions& o, const std::string& tag) {
  const std::string path = (std::filesystem::temp_directory_path() /
                            ("specnode_cudafwd_" + std::to_string(getpid()) + "_" + tag + ".gguf"))
                               .string();
  EXPECT_TRUE(WriteTinyModel(o, path).ok());
  return path;
}

inline std::string TinyModel(GgmlType type, const std::string& tag) {
  TinyModelOptions o;
  o.n_layers = 2;
  o.weight_type = type;
  return TinyModel(o, tag);
}

inline std::vector<int32_t> Tokens(int n, int offset) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + offset) % 250 + 3;
  return t;
}

// The graph on one GPU: backend, device weights, the pass and its KV store (f16 pages).
struct GpuPass {
  std::unique_ptr<CudaBackend> backend;
  std::unique_ptr<LlamaForward> forward;
  std::unique_ptr<KvStore> store;

  static absl::StatusOr<std::unique_ptr<GpuPass>> Create(const LlamaModel& m, int64_t kv_bytes,
                                                         int page_tokens, bool cuda_graphs,
                                                         PartialSumReducer* reducer = nullptr,
                                                         KvMode mode = KvMode::kFull,
                                                         bool quant_act = true) {
    auto g = std::make_unique<GpuPass>();
    CudaBackendOptions bo;
    bo.cuda_graphs = cuda_graphs;
    bo.quant_act = quant_act;
    SPECNODE_ASSIGN_OR_RETURN(g->backend, CudaBackend::Create(bo));
    SPECNODE_ASSIGN_OR_RETURN(std::shared_ptr<const LlamaWeights> w,
                              g->backend->UploadWeights(std::shared_ptr<const LlamaWeights>(
                                  &m.weights(), [](const LlamaWeights*) {})));
    const LlamaConfig& c = m.config();
    KvStoreConfig kc;
    kc.mode = mode;
    kc.window_tokens = 8;  // mixed: tokens are demoted within the tests' short sequences
    kc.sink_tokens = 2;
    kc.demote_every = 4;
    kc.n_layers = c.n_layers;
    kc.n_kv_heads = m.weights().n_kv_heads_local;
    kc.head_dim = c.head_dim;
    kc.gqa_group = m.weights().kv_heads_held().gqa_group;
    kc.max_seq_len = c.context_length;
    kc.page_tokens = page_tokens;
    kc.capacity_bytes = kv_bytes;
    const KvPoolGeometry geo{kc.n_layers, kc.n_kv_heads, kc.head_dim, kc.gqa_group, page_tokens};
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<CudaPagePool> pool,
                              CudaPagePool::Create(g->backend.get(), geo, kv_bytes, kc.rotate));
    SPECNODE_ASSIGN_OR_RETURN(g->store, KvStore::Create(kc, std::move(pool)));
    g->forward = std::make_unique<LlamaForward>(c, std::move(w), g->backend.get(), reducer);
    return g;
  }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) {
    return forward->Forward(batch, store.get(), logits);
  }
  KvStore& cache() { return *store; }
  const CudaGraphCache* graphs() const { return backend->graphs(); }
  int64_t page_bytes() const { return store->pool().PageBytes(KvPrecision::kFull); }
  int64_t free_pages() const { return store->pool().MaxPages() - store->Usage().pages; }
};

inline void ExpectCloseRows(const std::vector<float>& gpu, const std::vector<float>& cpu, int vocab,
                            const std::string& what) {
  ASSERT_EQ(gpu.size(), cpu.size()) << what;
  for (size_t r = 0; r * vocab < cpu.size(); ++r) {
    const float* c = cpu.data() + r * vocab;
    const float* g = gpu.data() + r * vocab;
    float big = 0.0f;
    for (int i = 0; i < vocab; ++i) big = std::max(big, std::fabs(c[i]));
    const double tol = 2e-2 * (1.0 + big);
    int bad = 0;
    for (int i = 0; i < vocab && bad < 3; ++i) {
      if (!(std::fabs(g[i] - c[i]) <= tol)) {
        ADD_FAILURE() << what << " row " << r << " id " << i << ": gpu " << g[i] << " cpu " << c[i];
        ++bad;
      }
    }
    std::vector<float> sorted(c, c + vocab);
    std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
    if (sorted[0] - sorted[1] > 0.05f) {
      EXPECT_EQ(ArgMax({g, static_cast<size_t>(vocab)}), ArgMax({c, static_cast<size_t>(vocab)}))
          << what << " row " << r;
    }
  }
}

}  // namespace specnode::cuda_fwd
