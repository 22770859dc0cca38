// The one Llama graph (model/llama_forward.h) on the CUDA backend (cuda_backend.h) with the
// KV manager over the GPU page pool (cuda_page_pool.h), against the same graph on the CPU
// reference, on tiny models of every weight type, plus the invariances speculative decoding
// relies on, checked on the GPU alone (bit-exact), and the page pool's attention against the
// CPU pool's.
//
// Tolerance GPU vs CPU, per logit: |gpu - cpu| <= 2e-2 * (1 + max|cpu logit| of the row).
// The GPU keeps K/V in f16 (relative rounding 2^-11 per value), the CPU an f32 KV cache;
// both round activations into quantised matmuls to the same int16 blocks (kQuantAct) and
// differ there only in summation order (~1e-6); through 2 layers the f16 KV dominates, leaving
// differences of ~1e-3 of the logit range. Greedy choices must agree wherever the CPU's top-2 gap
// exceeds 0.05.
//
// Without a GPU every test here skips, except the argument checks, which run everywhere.
#include <unistd.h>

#include <algorithm>
#include <barrier>
#include <cmath>
#include <filesystem>
#include <memory>
#include <string>
#include <thread>
#include <tuple>
#include <vector>

#include "cuda/cuda_backend.h"
#include "cuda/cuda_embedding.h"
#include "cuda/cuda_page_pool.h"
#include "cuda/cuda_topk.h"
#include "cuda/tests/cuda_forward_util.h"
#include "cuda/tests/cuda_test_util.h"
#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "kvstore/cpu_page_pool.h"
#include "kvstore/kv_store.h"
#include "model/llama/dense_kv_cache.h"
#include "model/llama/cpu_forward.h"
#include "model/llama/llama_forward.h"
#include "model/llama/llama_model.h"
#include "model/llama/sampling.h"
#include "model/llama/tiny_model.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

using cuda_test::CudaTestWithParam;

using cuda_fwd::ExpectCloseRows;
using cuda_fwd::GpuPass;
using cuda_fwd::TinyModel;
using cuda_fwd::Tokens;

struct Pair {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<LlamaForward> cpu;
  std::unique_ptr<DenseKvCache> cpu_cache;
  std::unique_ptr<GpuPass> gpu;

  explicit Pair(const std::string& path, int64_t kv_bytes = int64_t{64} << 20,
                bool cuda_graphs = true, bool quant_act = true) {
    auto m = LlamaModel::Load(path);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(m).value();
    const LlamaConfig& c = model->config();
    pool = std::make_unique<ThreadPool>(2);
    cpu = std::make_unique<CpuLlamaForward>(c, model->weights(), pool.get());
    cpu_cache = std::make_unique<DenseKvCache>(c.n_layers, model->weights().n_kv_heads_local,
                                               c.head_dim, c.gqa_group(), c.context_length, 4096);
    // Small pages: sequences span several, tails are partial.
    auto g = GpuPass::Create(*model, kv_bytes, /*page_tokens=*/4, cuda_graphs, nullptr,
                             KvMode::kFull, quant_act);
    EXPECT_TRUE(g.ok()) << g.status();
    if (g.ok()) gpu = std::move(g).value();
  }
  std::vector<float> Cpu(std::vector<BatchEntry> batch) {
    std::vector<float> logits;
    const absl::Status s = cpu->Forward(batch, cpu_cache.get(), &logits);
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }
  std::vector<float> Gpu(std::vector<BatchEntry> batch) {
    std::vector<float> logits;
    const absl::Status s = gpu->Forward(batch, &logits);
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }
};

class CudaForwardTest : public CudaTestWithParam<GgmlType> {
 protected:
  std::string Path() {
    return TinyModel(GetParam(), std::string(GgmlTypeName(static_cast<uint32_t>(GetParam()))));
  }
};

TEST_P(CudaForwardTest, LogitsMatchTheCpuPass) {
  Pair p(Path());
  ASSERT_NE(p.gpu, nullptr);
  const int vocab = p.model->config().vocab_size;
  const auto prompt = Tokens(9, 1);
  ExpectCloseRows(p.Gpu({{1, prompt, true}}), p.Cpu({{1, prompt, true}}), vocab, "prefill");
  const auto more = Tokens(8, 40);
  for (size_t i = 0; i < more.size(); ++i) {
    const std::span<const int32_t> one(&more[i], 1);
    ExpectCloseRows(p.Gpu({{1, one, false}}), p.Cpu({{1, one, false}}), vocab,
                    "decode " + std::to_string(i));
  }
  EXPECT_EQ(p.gpu->cache().Length(1), static_cast<int32_t>(prompt.size() + more.size()));
}

// The kFused matmuls (f32 activations, CudaBackendOptions::quant_act = false) stay a
// working choice: the same comparison, prefill and a few decode steps.
TEST_P(CudaForwardTest, FusedMatmulOptionMatchesTheCpuPassToo) {
  Pair p(Path(), int64_t{64} << 20, /*cuda_graphs=*/true, /*quant_act=*/false);
  ASSERT_NE(p.gpu, nullptr);
  EXPECT_FALSE(p.gpu->backend->quant_act());
  const int vocab = p.model->config().vocab_size;
  const auto prompt = Tokens(9, 1);
  ExpectCloseRows(p.Gpu({{1, prompt, true}}), p.Cpu({{1, prompt, true}}), vocab, "prefill");
  const auto more = Tokens(3, 40);
  for (size_t i = 0; i < more.size(); ++i) {
    const std::span<const int32_t> one(&more[i], 1);
    ExpectCloseRows(p.Gpu({{1, one, false}}), p.Cpu({{1, one, false}}), vocab,
                    "decode " + std::to_string(i));
  }
}

// K + 1 tokens in one pass give bit-identical logits to one at a time, for every pass size.
TEST_P(CudaForwardTest, VerificationPassEqualsOneAtATime) {
  Pair p(Path());
  ASSERT_NE(p.gpu, nullptr);
  const int vocab = p.model->config().vocab_size;
  const auto prefix = Tokens(6, 7);
  const auto drafts = Tokens(9, 70);
  p.Gpu({{1, prefix, false}});
  std::vector<float> one_at_a_time;
  for (size_t i = 0; i < drafts.size(); ++i) {
    auto l = p.Gpu({{1, std::span<const int32_t>(drafts).subspan(i, 1), false}});
    one_at_a_time.insert(one_at_a_time.end(), l.begin(), l.end());
  }
  for (size_t n = 1; n <= drafts.size(); ++n) {
    ASSERT_TRUE(p.gpu->cache().Truncate(1, static_cast<int32_t>(prefix.size())).ok());
    auto pass = p.Gpu({{1, std::span<const int32_t>(drafts).subspan(0, n), true}});
    ASSERT_EQ(pass.size(), n * vocab);
    EXPECT_TRUE(std::equal(pass.begin(), pass.end(), one_at_a_time.begin())) << n << " tokens";
  }
}

// The device heads (ForwardArgMax, ForwardTopK: only ids and k values leave the GPU) give
// exactly what the host takes from the same pass's logits, for a prefill's last rows and a
// verification pass's every row, k small and past the kernel's maximum (the host's then).
TEST_P(CudaForwardTest, DeviceHeadsEqualTheHostHeadsOfTheSameLogits) {
  Pair a(Path()), b(Path());
  ASSERT_NE(a.gpu, nullptr);
  ASSERT_NE(b.gpu, nullptr);
  const int vocab = a.model->config().vocab_size;
  const auto p1 = Tokens(7, 5), p2 = Tokens(4, 8), drafts = Tokens(5, 40);
  const std::vector<std::vector<BatchEntry>> passes = {
      {{1, p1, false}, {2, p2, false}},
      {{1, drafts, true}, {2, std::span<const int32_t>(drafts).subspan(0, 1), false}}};
  for (const std::vector<BatchEntry>& batch : passes) {
    const std::vector<float> logits = a.Gpu(batch);
    const size_t rows = logits.size() / vocab;
    // Back to where a's cache is, for the next head on the same pass.
    auto Rewind = [&](int32_t len1, int32_t len2) {
      if (len1 == 0) {
        b.gpu->cache().Free(1);
        b.gpu->cache().Free(2);
      } else {
        ASSERT_TRUE(b.gpu->cache().Truncate(1, len1).ok());
        ASSERT_TRUE(b.gpu->cache().Truncate(2, len2).ok());
      }
    };
    for (int k : {-1, 0, 1, 40, std::min(vocab, kCudaTopKMax + 1)}) {
      const int32_t len1 = b.gpu->cache().Length(1), len2 = b.gpu->cache().Length(2);
      std::vector<int32_t> ids;
      std::vector<float> values;
      if (k < 0) {  // drawn heads: sampled and greedy rows alternate
        std::vector<sample::DrawParams> draws;
        for (size_t r = 0; r < rows; ++r) {
          draws.push_back(Sampler({r % 2 == 0 ? 0.8f : 0.0f, 0, 1.0f, 7}).DrawAt(10 + r));
        }
        std::vector<int32_t> want(rows);
        DrawRows(logits.data(), rows, vocab, draws.data(), want.data());
        const absl::Status drawn =
            b.gpu->forward->ForwardDrawn(batch, b.gpu->store.get(), draws, &ids);
        ASSERT_TRUE(drawn.ok()) << drawn;
        EXPECT_EQ(ids, want);
        Rewind(len1, len2);
        continue;
      }
      const absl::Status st =
          k == 0 ? b.gpu->forward->ForwardArgMax(batch, b.gpu->store.get(), &ids)
                 : b.gpu->forward->ForwardTopK(batch, b.gpu->store.get(), k, &ids, &values);
      ASSERT_TRUE(st.ok()) << st;
      const int per_row = std::max(k, 1);
      ASSERT_EQ(ids.size(), rows * per_row);
      std::vector<int32_t> want_ids(per_row);
      std::vector<float> want_values(per_row);
      for (size_t r = 0; r < rows; ++r) {
        const std::span<const float> row(logits.data() + r * vocab, vocab);
        TopK(row, per_row, want_ids.data(), want_values.data());
        EXPECT_EQ(std::vector<int32_t>(ids.begin() + r * per_row, ids.begin() + (r + 1) * per_row),
                  want_ids)
            << "k " << k << " row " << r;
        if (k > 0) {
          EXPECT_EQ(
              std::vector<float>(values.begin() + r * per_row, values.begin() + (r + 1) * per_row),
              want_values)
              << "k " << k << " row " << r;
        }
      }
      Rewind(len1, len2);
    }
    // Leave b one pass along, as a is.
    std::vector<float> unused;
    ASSERT_TRUE(b.gpu->Forward(batch, &unused).ok());
  }
}

TEST_P(CudaForwardTest, BatchInvariantAcrossSequences) {
  Pair p(Path());
  ASSERT_NE(p.gpu, nullptr);
  const int vocab = p.model->config().vocab_size;
  auto a = Tokens(7, 2), b = Tokens(3, 9), c = Tokens(11, 4);
  auto alone = p.Gpu({{5, a, true}});
  p.gpu->cache().Free(5);
  auto batched = p.Gpu({{1, b, true}, {5, a, true}, {9, c, false}});
  std::vector<float> slice(batched.begin() + b.size() * vocab,
                           batched.begin() + (b.size() + a.size()) * vocab);
  EXPECT_EQ(slice, alone);
  EXPECT_EQ(batched.size(), (b.size() + a.size() + 1) * vocab);
}

// A schedule like the engine's (prefill, batched decode across page boundaries, repeated
// verification passes with rollback, a sequence joining and leaving) gives bit-identical
// logits with CUDA graphs as eagerly, and the graphs are really used.
TEST_P(CudaForwardTest, GraphReplaysEqualEagerPasses) {
  Pair graphed(Path());
  Pair eager(Path(), int64_t{64} << 20, /*cuda_graphs=*/false);
  ASSERT_NE(graphed.gpu, nullptr);
  ASSERT_NE(eager.gpu, nullptr);
  ASSERT_NE(graphed.gpu->graphs(), nullptr);
  ASSERT_EQ(eager.gpu->graphs(), nullptr);
  int step = 0;
  auto both = [&](const std::vector<BatchEntry>& batch) {
    const std::vector<float> g = graphed.Gpu(batch);
    const std::vector<float> e = eager.Gpu(batch);
    EXPECT_EQ(g, e) << "step " << step;
    ++step;
  };
  const auto p1 = Tokens(7, 1), p2 = Tokens(5, 2), p3 = Tokens(3, 3);
  both({{1, p1, false}, {2, p2, false}});
  const auto next = Tokens(12, 30);
  for (size_t i = 0; i < next.size(); ++i) {  // n = 2 decode, crossing pages of 4 tokens
    const std::span<const int32_t> one(&next[i], 1);
    both({{1, one, false}, {2, one, false}});
  }
  const auto drafts = Tokens(4, 80);
  for (int round = 0; round < 3; ++round) {  // verification (n = 5) then rollback
    const int32_t len1 = graphed.gpu->cache().Length(1);
    both({{1, drafts, true}, {2, std::span<const int32_t>(&next[round], 1), false}});
    ASSERT_TRUE(graphed.gpu->cache().Truncate(1, len1 + 1 + round % 2).ok());
    ASSERT_TRUE(eager.gpu->cache().Truncate(1, len1 + 1 + round % 2).ok());
  }
  both({{3, p3, true}});  // a new sequence joins: more page-table rows
  for (size_t i = 0; i < 4; ++i) {
    const std::span<const int32_t> one(&next[i], 1);
    both({{1, one, false}, {2, one, false}, {3, one, false}});
  }
  graphed.gpu->cache().Free(2);
  eager.gpu->cache().Free(2);
  for (size_t i = 4; i < 8; ++i) {
    const std::span<const int32_t> one(&next[i], 1);
    both({{3, one, false}, {1, one, false}});
  }
  const CudaGraphCache& g = *graphed.gpu->graphs();
  EXPECT_FALSE(g.disabled()) << g.disabled_reason();
  EXPECT_GE(g.captures(), 3);  // n = 2, 5, 3 at least
  EXPECT_GE(g.replays(), 15);
}

// The head recorded with the pass: greedy and top-k decode steps replayed as graphs give the
// ids and values an eager pass gives (the selection kernels are in the graph; only the copy
// back follows it), switching head kinds between steps.
TEST_P(CudaForwardTest, GraphedHeadsEqualEagerHeads) {
  Pair graphed(Path());
  Pair eager(Path(), int64_t{64} << 20, /*cuda_graphs=*/false);
  ASSERT_NE(graphed.gpu, nullptr);
  ASSERT_NE(eager.gpu, nullptr);
  const auto prompt = Tokens(6, 4), next = Tokens(16, 60);
  graphed.Gpu({{1, prompt, false}});
  eager.Gpu({{1, prompt, false}});
  for (size_t i = 0; i < next.size(); ++i) {
    const std::vector<BatchEntry> step = {{1, std::span<const int32_t>(&next[i], 1), false}};
    const int k = i < 8 ? 0 : 5;  // arg max for 8 steps, then top-5
    std::vector<int32_t> gi, ei;
    std::vector<float> gv, ev;
    for (auto [p, ids, values] :
         {std::tuple{graphed.gpu.get(), &gi, &gv}, std::tuple{eager.gpu.get(), &ei, &ev}}) {
      const absl::Status st = k == 0
                                  ? p->forward->ForwardArgMax(step, p->store.get(), ids)
                                  : p->forward->ForwardTopK(step, p->store.get(), k, ids, values);
      ASSERT_TRUE(st.ok()) << st;
    }
    EXPECT_EQ(gi, ei) << "step " << i;
    EXPECT_EQ(gv, ev) << "step " << i;
  }
  const CudaGraphCache& g = *graphed.gpu->graphs();
  EXPECT_FALSE(g.disabled()) << g.disabled_reason();
  EXPECT_GE(g.captures(), 2);  // the arg max step and the top-5 step
  EXPECT_GE(g.replays(), 10);
}

TEST_P(CudaForwardTest, TruncateRollsBackLikeAFreshSequence) {
  Pair p(Path());
  ASSERT_NE(p.gpu, nullptr);
  auto prefix = Tokens(6, 3), wrong = Tokens(4, 50), right = Tokens(4, 60);
  p.Gpu({{1, prefix, false}});
  p.Gpu({{1, wrong, true}});
  ASSERT_EQ(p.gpu->cache().Length(1), 10);
  ASSERT_TRUE(p.gpu->cache().Truncate(1, 6).ok());
  auto after_rollback = p.Gpu({{1, right, true}});
  p.Gpu({{2, prefix, false}});
  auto fresh = p.Gpu({{2, right, true}});
  EXPECT_EQ(after_rollback, fresh);
}

// A pass the cache cannot hold fails with ResourceExhausted and changes no sequence; bad
// token ids fail before anything runs.
TEST_P(CudaForwardTest, FailedPassChangesNothing) {
  Pair probe(Path());
  ASSERT_NE(probe.gpu, nullptr);
  const int64_t page = probe.gpu->page_bytes();
  Pair p(Path(), 5 * page);  // 5 pages of 4 tokens
  ASSERT_NE(p.gpu, nullptr);
  const auto first = Tokens(10, 5);  // 3 pages
  p.Gpu({{1, first, false}});
  const int64_t free_before = p.gpu->free_pages();
  const auto big = Tokens(12, 8);  // 3 more pages for a new sequence: only 2 free
  std::vector<float> logits;
  const std::vector<BatchEntry> batch = {{1, std::span<const int32_t>(first).first(2), false},
                                         {2, big, false}};
  const absl::Status s = p.gpu->Forward(batch, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(p.gpu->cache().Length(1), 10);
  EXPECT_EQ(p.gpu->cache().Length(2), 0);
  EXPECT_EQ(p.gpu->free_pages(), free_before);
  const int32_t bad = 1 << 20;
  const absl::Status s2 = p.gpu->Forward({{{1, {&bad, 1}, false}}}, &logits);
  EXPECT_EQ(s2.code(), absl::StatusCode::kInvalidArgument) << s2;
  EXPECT_EQ(p.gpu->cache().Length(1), 10);
}

INSTANTIATE_TEST_SUITE_P(Types, CudaForwardTest,
                         ::testing::Values(GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_1,
                                           GgmlType::kF16, GgmlType::kBF16),
                         [](const auto& info) {
                           return std::string(GgmlTypeName(static_cast<uint32_t>(info.param)));
                         });

// K-quant files run natively under kQuantAct (rows of whole 256-value super-blocks; the
// embedding table alone is converted for its row lookup): logits against the CPU's own
// K-quant kernels, and a verification pass bit-identical to one token at a time.
class CudaKQuantForwardTest : public CudaTestWithParam<GgmlType> {
 protected:
  std::string Path() {
    TinyModelOptions o;
    o.n_layers = 2;
    o.d_model = 256;
    o.n_heads = 4;
    o.n_kv_heads = 2;
    o.d_ff = 512;
    o.tied_embeddings = false;  // the head runs natively too
    o.weight_type = GetParam();
    return TinyModel(o, "k" + std::string(GgmlTypeName(static_cast<uint32_t>(GetParam()))));
  }
};

TEST_P(CudaKQuantForwardTest, LogitsMatchTheCpuAndVerificationIsInvariant) {
  Pair p(Path());
  ASSERT_NE(p.gpu, nullptr);
  const int vocab = p.model->config().vocab_size;
  const auto prompt = Tokens(9, 1);
  ExpectCloseRows(p.Gpu({{1, prompt, true}}), p.Cpu({{1, prompt, true}}), vocab, "prefill");
  const auto drafts = Tokens(5, 40);
  std::vector<float> one_at_a_time;
  for (size_t i = 0; i < drafts.size(); ++i) {
    const std::span<const int32_t> one(&drafts[i], 1);
    auto g = p.Gpu({{1, one, false}});
    ExpectCloseRows(g, p.Cpu({{1, one, false}}), vocab, "decode " + std::to_string(i));
    one_at_a_time.insert(one_at_a_time.end(), g.begin(), g.end());
  }
  ASSERT_TRUE(p.gpu->cache().Truncate(1, static_cast<int32_t>(prompt.size())).ok());
  auto pass = p.Gpu({{1, drafts, true}});
  EXPECT_EQ(pass, one_at_a_time) << "a 5-token pass differs from 5 single steps";
}

INSTANTIATE_TEST_SUITE_P(KQuants, CudaKQuantForwardTest,
                         ::testing::Values(GgmlType::kQ4_K, GgmlType::kQ5_K, GgmlType::kQ6_K),
                         [](const auto& info) {
                           return std::string(GgmlTypeName(static_cast<uint32_t>(info.param)));
                         });

// Shards of one device's tensor-parallel group in lockstep on threads: AllReduceSum copies
// each shard's DEVICE partial sums to the host, adds them in rank order, and copies the sum
// back (what NCCL does across GPUs, here on the one GPU a test machine has).
class DeviceThreadReducer : public PartialSumReducer {
 public:
  DeviceThreadReducer(int rank, std::vector<std::vector<float>>* slots, std::barrier<>* barrier)
      : rank_(rank), slots_(slots), barrier_(barrier) {}
  absl::Status AllReduceSum(float* data, int64_t count) override {
    std::vector<float>& mine = (*slots_)[rank_];
    mine.resize(count);
    absl::Status s = SPECNODE_CUDA_STATUS(
        cudaMemcpy(mine.data(), data, count * sizeof(float), cudaMemcpyDeviceToHost));
    barrier_->arrive_and_wait();
    std::vector<float> sum(count);
    for (int64_t i = 0; i < count; ++i) {
      double acc = 0;
      for (const auto& slot : *slots_) acc += slot[i];
      sum[i] = static_cast<float>(acc);
    }
    barrier_->arrive_and_wait();
    if (!s.ok()) return s;
    return SPECNODE_CUDA_STATUS(
        cudaMemcpy(data, sum.data(), count * sizeof(float), cudaMemcpyHostToDevice));
  }

 private:
  int rank_;
  std::vector<std::vector<float>>* slots_;
  std::barrier<>* barrier_;
};

// A TP-2 GPU group (both shards on device 0) gives the whole model's logits (partial sums
// are added in another order: tolerance), the same on both shards.
TEST(CudaTensorParallelTest, ShardsMatchTheWholeModel) {
  SPECNODE_SKIP_WITHOUT_CUDA();
  TinyModelOptions o;
  o.n_layers = 2;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.d_model = 128;
  o.d_ff = 256;
  o.weight_type = GgmlType::kQ8_0;
  const std::string path = TinyModel(o, "tp");
  const auto toks = Tokens(9, 5);
  std::vector<float> whole;
  {
    auto model = LlamaModel::Load(path);
    ASSERT_TRUE(model.ok()) << model.status();
    auto f = GpuPass::Create(**model, int64_t{64} << 20, 16, /*cuda_graphs=*/true);
    ASSERT_TRUE(f.ok()) << f.status();
    const std::vector<BatchEntry> batch = {{1, toks, true}};
    SPECNODE_ASSERT_OK((*f)->Forward(batch, &whole));
  }
  const int T = 2;
  std::vector<std::vector<float>> slots(T), got(T);
  std::barrier<> barrier(T);
  std::vector<absl::Status> status(T);
  std::vector<std::thread> threads;
  for (int r = 0; r < T; ++r) {
    threads.emplace_back([&, r] {
      DeviceThreadReducer reducer(r, &slots, &barrier);
      LoadOptions lo;
      lo.shard = ShardSpec{r, T};
      auto model = LlamaModel::Load(path, lo);
      if (!model.ok()) {
        status[r] = model.status();
        return;
      }
      auto f = GpuPass::Create(**model, int64_t{64} << 20, 16, /*cuda_graphs=*/false, &reducer);
      if (!f.ok()) {
        status[r] = f.status();
        return;
      }
      const std::vector<BatchEntry> batch = {{1, toks, true}};
      status[r] = (*f)->Forward(batch, &got[r]);
    });
  }
  for (auto& t : threads) t.join();
  for (int r = 0; r < T; ++r) ASSERT_TRUE(status[r].ok()) << "shard " << r << ": " << status[r];
  ASSERT_EQ(got[0].size(), whole.size());
  EXPECT_EQ(got[0], got[1]);
  for (size_t i = 0; i < whole.size(); ++i) {
    ASSERT_NEAR(got[0][i], whole[i], 1e-3 * (1 + std::abs(whole[i]))) << i;
  }
}

// Argument checks happen before any CUDA call: same errors with or without a GPU.
TEST(CudaEmbeddingArgsTest, BadArgumentsAreInvalidArgument) {
  const WeightView odd{GgmlType::kQ8_0, nullptr, 4, 40, 0};
  EXPECT_EQ(CudaEmbeddingRows(odd, nullptr, 1, nullptr).code(), absl::StatusCode::kInvalidArgument);
  const WeightView f32{GgmlType::kF32, nullptr, 4, 40, 160};
  EXPECT_EQ(CudaEmbeddingRows(f32, nullptr, 1, nullptr).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(CudaEmbeddingRows(f32, nullptr, 0, nullptr).ok());
}

// The one graph on the GPU in every KV mode against the CPU pass over the CPU store in the
// same mode (same window, demotion boundary and rotation): logits within the GPU-vs-CPU
// tolerance (ExpectCloseRows), greedy choices equal where the CPU's top-2 gap exceeds 0.05.
// Both encode the same rows the same way; what differs is the activations going in.
class CudaForwardKvModeTest : public CudaTestWithParam<KvMode> {};

TEST_P(CudaForwardKvModeTest, LogitsMatchTheCpuPassInTheSameMode) {
  const KvMode mode = GetParam();
  const std::string path =
      TinyModel(GgmlType::kQ4_1, std::string("kv") + std::string(KvModeName(mode)));
  auto m = LlamaModel::Load(path);
  ASSERT_TRUE(m.ok()) << m.status();
  const LlamaConfig& c = (*m)->config();
  auto gpu = GpuPass::Create(**m, int64_t{64} << 20, 4, /*cuda_graphs=*/true, nullptr, mode);
  ASSERT_TRUE(gpu.ok()) << gpu.status();
  KvStoreConfig kc = (*gpu)->store->config();
  auto cpu_store = MakeHostKvStore(kc);
  ASSERT_TRUE(cpu_store.ok()) << cpu_store.status();
  ThreadPool threads(2);
  CpuLlamaForward cpu(c, (*m)->weights(), &threads);
  const int vocab = c.vocab_size;
  const auto prompt = Tokens(8, 3);  // a multiple of demote_every (PassBoundary)
  std::vector<float> g, h;
  const std::vector<BatchEntry> first = {{1, prompt, true}};
  ASSERT_TRUE((*gpu)->Forward(first, &g).ok());
  ASSERT_TRUE(cpu.Forward(first, cpu_store->get(), &h).ok());
  ExpectCloseRows(g, h, vocab, "prefill");
  const auto more = Tokens(24, 50);
  for (size_t i = 0; i < more.size(); ++i) {
    const std::span<const int32_t> one(&more[i], 1);
    const std::vector<BatchEntry> step = {{1, one, true}};
    ASSERT_TRUE((*gpu)->Forward(step, &g).ok());
    ASSERT_TRUE(cpu.Forward(step, cpu_store->get(), &h).ok());
    ExpectCloseRows(g, h, vocab, std::string(KvModeName(mode)) + " decode " + std::to_string(i));
  }
  const KvUsage u = (*gpu)->store->Usage();
  if (mode == KvMode::kMixed) {
    EXPECT_GT(u.tokens[1] + u.tokens[2], 0) << "nothing demoted";
  }
}

INSTANTIATE_TEST_SUITE_P(KvModes, CudaForwardKvModeTest,
                         ::testing::Values(KvMode::kFull, KvMode::kInt8, KvMode::kInt4,
                                           KvMode::kInt2, KvMode::kMixed),
                         [](const auto& info) { return std::string(KvModeName(info.param)); });

TEST(CudaBackendCreateTest, NoDeviceOrBadDeviceIsAnError) {
  CudaBackendOptions o;
  if (!cuda_test::CudaUnavailableReason().empty()) {
    auto b = CudaBackend::Create(o);
    EXPECT_EQ(b.status().code(), absl::StatusCode::kUnavailable) << b.status();
    return;
  }
  o.device = 99;
  auto b = CudaBackend::Create(o);
  EXPECT_EQ(b.status().code(), absl::StatusCode::kInvalidArgument) << b.status();
}

}  // namespace
}  // namespace specnode
