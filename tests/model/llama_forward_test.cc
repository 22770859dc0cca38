// Forward-pass properties on tiny models: batch invariance, incremental == one-pass, a
// verification pass == one token at a time, rollback, errors that leave the cache untouched,
// and tensor-parallel shards summing to the unsharded result.
#include "model/llama/cpu_forward.h"
#include "model/llama/llama_forward.h"

#include <unistd.h>
#include <algorithm>
#include <barrier>
#include <cmath>

#include <filesystem>
#include <fstream>
#include <limits>
#include <memory>
#include <thread>
#include <tuple>
#include <vector>

#include "gtest/gtest.h"
#include "model/cpu/cpu_features.h"
#include "model/gguf/gguf_reader.h"
#include "model/llama/dense_kv_cache.h"
#include "model/llama/llama_model.h"
#include "model/llama/sampling.h"
#include "model/llama/tiny_model.h"
#include "tests/support/temp_file.h"

namespace specnode {
namespace {

std::string WriteModel(const TinyModelOptions& o, const std::string& name) {
  const std::string path = testing_support::TempFilePath("fwd_" + name);
  EXPECT_TRUE(WriteTinyModel(o, path).ok());
  return path;
}

struct Harness {
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<LlamaForward> fwd;
  std::unique_ptr<DenseKvCache> cache;

  Harness(const std::string& path, int threads, int64_t kv_tokens = 4096, ShardSpec shard = {},
          PartialSumReducer* reducer = nullptr, ActQuant act = ActQuant::kInt16) {
    LoadOptions lo;
    lo.shard = shard;
    lo.activations = act;
    auto m = LlamaModel::Load(path, lo);
    EXPECT_TRUE(m.ok()) << m.status();
    model = std::move(m).value();
    const LlamaConfig& c = model->config();
    pool = std::make_unique<ThreadPool>(threads);
    fwd = std::make_unique<CpuLlamaForward>(c, model->weights(), pool.get(), reducer);
    cache = std::make_unique<DenseKvCache>(c.n_layers, model->weights().n_kv_heads_local,
                                           c.head_dim, model->weights().kv_heads_held().gqa_group,
                                           c.context_length, kv_tokens);
  }

  std::vector<float> Run(std::vector<BatchEntry> batch) {
    std::vector<float> logits;
    absl::Status s = fwd->Forward(batch, cache.get(), &logits);
    EXPECT_TRUE(s.ok()) << s;
    return logits;
  }
};

std::vector<int32_t> Tokens(int n, int offset) {
  std::vector<int32_t> t(n);
  for (int i = 0; i < n; ++i) t[i] = (i * 37 + offset) % 250 + 3;
  return t;
}

// Every weight type, in both activation modes (int8 changes quantised types only): the
// invariances speculative decoding relies on hold in each.
class ForwardTest : public ::testing::TestWithParam<std::tuple<GgmlType, ActQuant>> {
 protected:
  std::string Path() {
    TinyModelOptions o;
    o.n_layers = 2;
    o.weight_type = std::get<0>(GetParam());
    return WriteModel(o, std::string(GgmlTypeName(static_cast<uint32_t>(o.weight_type))));
  }
  Harness Make(const std::string& path, int threads) {
    return Harness(path, threads, 4096, {}, nullptr, std::get<1>(GetParam()));
  }
};

TEST_P(ForwardTest, IncrementalDecodeEqualsOnePassBitExact) {
  Harness h = Make(Path(), 2);
  const int vocab = h.model->config().vocab_size;
  auto toks = Tokens(12, 1);
  auto all = h.Run({{1, toks, true}});
  ASSERT_EQ(all.size(), toks.size() * vocab);
  // Same tokens: a 5-token prefill then one at a time.
  std::vector<float> inc;
  auto first = h.Run({{2, std::span<const int32_t>(toks).subspan(0, 5), true}});
  inc.insert(inc.end(), first.begin(), first.end());
  for (size_t i = 5; i < toks.size(); ++i) {
    auto l = h.Run({{2, std::span<const int32_t>(toks).subspan(i, 1), false}});
    inc.insert(inc.end(), l.begin(), l.end());
  }
  EXPECT_EQ(inc, all);
}

// A speculative verification pass: K + 1 tokens after a prefix, logits for each, must equal
// decoding the same tokens one at a time, bit for bit, for every pass size up to 9 (every
// token-tile size of the matmul kernels, and two tiles at 9).
TEST_P(ForwardTest, VerificationPassEqualsOneAtATime) {
  Harness h = Make(Path(), 2);
  const auto prefix = Tokens(6, 7);
  const auto drafts = Tokens(9, 70);
  h.Run({{1, prefix, false}});
  std::vector<float> one_at_a_time;
  for (size_t i = 0; i < drafts.size(); ++i) {
    auto l = h.Run({{1, std::span<const int32_t>(drafts).subspan(i, 1), false}});
    one_at_a_time.insert(one_at_a_time.end(), l.begin(), l.end());
  }
  const int vocab = h.model->config().vocab_size;
  for (size_t n = 1; n <= drafts.size(); ++n) {
    ASSERT_TRUE(h.cache->Truncate(1, static_cast<int32_t>(prefix.size())).ok());
    auto pass = h.Run({{1, std::span<const int32_t>(drafts).subspan(0, n), true}});
    ASSERT_EQ(pass.size(), n * vocab);
    EXPECT_TRUE(std::equal(pass.begin(), pass.end(), one_at_a_time.begin())) << n << " tokens";
  }
}

TEST_P(ForwardTest, BatchInvariantAcrossSequencesAndThreads) {
  const std::string path = Path();
  Harness h1 = Make(path, 1), h2 = Make(path, 2);
  auto a = Tokens(7, 2), b = Tokens(3, 9), c = Tokens(11, 4);
  auto alone = h1.Run({{5, a, true}});
  auto batched = h2.Run({{1, b, true}, {5, a, true}, {9, c, false}});
  const int vocab = h1.model->config().vocab_size;
  std::vector<float> slice(batched.begin() + b.size() * vocab,
                           batched.begin() + (b.size() + a.size()) * vocab);
  EXPECT_EQ(slice, alone);
  EXPECT_EQ(batched.size(), (b.size() + a.size() + 1) * vocab);
}

// The greedy head (ForwardArgMax: a device keeps the logits and returns ids) gives each
// logits row's ArgMax, for a prefill's last row and a verification pass's every row, and
// leaves the cache as Forward does.
TEST_P(ForwardTest, ArgMaxHeadIsTheLogitsArgMax) {
  const std::string path = Path();
  Harness a = Make(path, 2), b = Make(path, 2);
  const int vocab = a.model->config().vocab_size;
  const auto p1 = Tokens(7, 5), p2 = Tokens(4, 8), drafts = Tokens(5, 40);
  for (const std::vector<BatchEntry>& batch :
       {std::vector<BatchEntry>{{1, p1, false}, {2, p2, false}},
        std::vector<BatchEntry>{{1, drafts, true}, {2, std::span(drafts).subspan(0, 1), false}}}) {
    const std::vector<float> logits = a.Run(batch);
    std::vector<int32_t> ids;
    const absl::Status st = b.fwd->ForwardArgMax(batch, b.cache.get(), &ids);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(ids.size() * vocab, logits.size());
    for (size_t r = 0; r < ids.size(); ++r) {
      EXPECT_EQ(ids[r], ArgMax(std::span<const float>(logits).subspan(r * vocab, vocab))) << r;
    }
    EXPECT_EQ(b.cache->Length(1), a.cache->Length(1));
    EXPECT_EQ(b.cache->Length(2), a.cache->Length(2));
  }
}

// The top-k head (ForwardTopK: what a top-k sampler draws from) gives each logits row's
// TopK, ids and values, and leaves the cache as Forward does; k outside (0, vocab] is refused.
TEST_P(ForwardTest, TopKHeadIsTheLogitsTopK) {
  const std::string path = Path();
  Harness a = Make(path, 2), b = Make(path, 2);
  const int vocab = a.model->config().vocab_size;
  const auto p1 = Tokens(7, 5), p2 = Tokens(4, 8), drafts = Tokens(5, 40);
  int k = 1;
  for (const std::vector<BatchEntry>& batch :
       {std::vector<BatchEntry>{{1, p1, false}, {2, p2, false}},
        std::vector<BatchEntry>{{1, drafts, true}, {2, std::span(drafts).subspan(0, 1), false}}}) {
    k += 6;
    const std::vector<float> logits = a.Run(batch);
    std::vector<int32_t> ids;
    std::vector<float> values;
    const absl::Status st = b.fwd->ForwardTopK(batch, b.cache.get(), k, &ids, &values);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(ids.size() / k * vocab, logits.size());
    ASSERT_EQ(values.size(), ids.size());
    std::vector<int32_t> want_ids(k);
    std::vector<float> want_values(k);
    for (size_t r = 0; r < ids.size() / k; ++r) {
      TopK(std::span<const float>(logits).subspan(r * vocab, vocab), k, want_ids.data(),
           want_values.data());
      EXPECT_EQ(std::vector<int32_t>(ids.begin() + r * k, ids.begin() + r * k + k), want_ids);
      EXPECT_EQ(std::vector<float>(values.begin() + r * k, values.begin() + r * k + k),
                want_values);
    }
    EXPECT_EQ(b.cache->Length(1), a.cache->Length(1));
    EXPECT_EQ(b.cache->Length(2), a.cache->Length(2));
  }
  std::vector<int32_t> ids;
  std::vector<float> values;
  const std::vector<BatchEntry> one = {{3, p1, false}};
  EXPECT_EQ(b.fwd->ForwardTopK(one, b.cache.get(), 0, &ids, &values).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.fwd->ForwardTopK(one, b.cache.get(), vocab + 1, &ids, &values).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.cache->Length(3), 0);
}

// A drawn head gives each row the token its sampler draws from Forward's row (greedy and
// sampled rows mixed), and refuses a draw count that is not the row count before anything
// runs.
TEST_P(ForwardTest, DrawnHeadIsWhatSampleDrawsFromTheRows) {
  const std::string path = Path();
  Harness a = Make(path, 2), b = Make(path, 2);
  const int vocab = a.model->config().vocab_size;
  const auto p1 = Tokens(7, 5), p2 = Tokens(4, 8), drafts = Tokens(5, 40);
  for (const std::vector<BatchEntry>& batch :
       {std::vector<BatchEntry>{{1, p1, false}, {2, p2, false}},
        std::vector<BatchEntry>{{1, drafts, true}, {2, std::span(drafts).subspan(0, 1), false}}}) {
    const std::vector<float> logits = a.Run(batch);
    const size_t rows = logits.size() / vocab;
    std::vector<Sampler> samplers;
    std::vector<sample::DrawParams> draws;
    for (size_t r = 0; r < rows; ++r) {
      samplers.emplace_back(SamplingParams{r % 3 == 1 ? 0.0f : 1.1f, 0, 1.0f, 40 + r});
      draws.push_back(samplers.back().DrawAt(20 + r));
    }
    std::vector<int32_t> ids;
    const absl::Status st = b.fwd->ForwardDrawn(batch, b.cache.get(), draws, &ids);
    ASSERT_TRUE(st.ok()) << st;
    ASSERT_EQ(ids.size(), rows);
    for (size_t r = 0; r < rows; ++r) {
      EXPECT_EQ(ids[r], samplers[r].Sample(std::span<const float>(logits).subspan(r * vocab, vocab),
                                           20 + r))
          << "row " << r;
    }
    EXPECT_EQ(b.cache->Length(1), a.cache->Length(1));
  }
  std::vector<int32_t> ids;
  const std::vector<BatchEntry> one = {{3, p1, false}};
  const sample::DrawParams two[2] = {};
  EXPECT_EQ(b.fwd->ForwardDrawn(one, b.cache.get(), two, &ids).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(b.cache->Length(3), 0);
}

TEST_P(ForwardTest, TruncateRollsBackLikeAFreshSequence) {
  Harness h = Make(Path(), 2);
  auto prefix = Tokens(6, 3), wrong = Tokens(4, 50), right = Tokens(4, 60);
  h.Run({{1, prefix, false}});
  h.Run({{1, wrong, true}});
  ASSERT_EQ(h.cache->Length(1), 10);
  ASSERT_TRUE(h.cache->Truncate(1, 6).ok());
  auto after_rollback = h.Run({{1, right, true}});
  h.Run({{2, prefix, false}});
  auto fresh = h.Run({{2, right, true}});
  EXPECT_EQ(after_rollback, fresh);
}

INSTANTIATE_TEST_SUITE_P(
    Types, ForwardTest,
    ::testing::Combine(::testing::Values(GgmlType::kF32, GgmlType::kQ8_0, GgmlType::kQ4_1),
                       ::testing::Values(ActQuant::kInt16, ActQuant::kInt8)),
    [](const auto& info) {
      return std::string(GgmlTypeName(static_cast<uint32_t>(std::get<0>(info.param)))) +
             (std::get<1>(info.param) == ActQuant::kInt8 ? "_int8" : "_int16");
    });

// Int8 activations are a different rounding, not a different model: a Q4_1 model's
// logits stay close to the int16 ones (a few percent of their spread), and differ (the mode
// is really applied).
TEST(Forward, Int8ActivationsStayCloseToInt16) {
  if (std::string(ActQuantName(ActQuant::kInt8)) != "int8") {
    GTEST_SKIP() << "the " << CpuKernelName() << " kernels have no int8 path (int8 runs int16)";
  }
  TinyModelOptions o;
  o.n_layers = 2;
  o.weight_type = GgmlType::kQ4_1;
  const std::string path = WriteModel(o, "int8_close");
  Harness h16(path, 2), h8(path, 2, 4096, {}, nullptr, ActQuant::kInt8);
  const auto toks = Tokens(10, 5);
  const auto a = h16.Run({{1, toks, true}});
  const auto b = h8.Run({{1, toks, true}});
  ASSERT_EQ(a.size(), b.size());
  double diff2 = 0.0, spread2 = 0.0, mean = 0.0;
  for (float v : a) mean += v;
  mean /= static_cast<double>(a.size());
  for (size_t i = 0; i < a.size(); ++i) {
    diff2 += (a[i] - b[i]) * static_cast<double>(a[i] - b[i]);
    spread2 += (a[i] - mean) * (a[i] - mean);
  }
  EXPECT_GT(diff2, 0.0) << "int8 mode computed exactly the int16 logits";
  EXPECT_LT(std::sqrt(diff2 / spread2), 0.05);
}

// A model whose weights overflow (here: a NaN in a norm vector) gets a clear error from the
// pass, not text sampled from garbage, and no sequence changes; through the quantised
// matmuls (int16 and int8 activations: the NaN rows' scales become NaN instead of
// integer-rounding NaN) and the float ones alike (issue 16, item 13).
TEST(Forward, NonFiniteLogitsAreADataLossErrorAndChangeNothing) {
  for (GgmlType type : {GgmlType::kQ4_1, GgmlType::kF32}) {
    for (ActQuant act : {ActQuant::kInt16, ActQuant::kInt8}) {
      TinyModelOptions o;
      o.n_layers = 2;
      o.weight_type = type;
      const std::string path = WriteModel(o, "nan");
      {
        auto file = GgufFile::Open(path);
        ASSERT_TRUE(file.ok()) << file.status();
        const GgufTensorInfo* t = (*file)->FindTensor("blk.1.ffn_norm.weight");
        ASSERT_NE(t, nullptr);
        ASSERT_EQ(t->type, GgmlType::kF32);
        const uint64_t offset = t->offset;
        file->reset();
        std::fstream f(path, std::ios::in | std::ios::out | std::ios::binary);
        const float nan = std::numeric_limits<float>::quiet_NaN();
        f.seekp(static_cast<std::streamoff>(offset + 4 * sizeof(float)));
        f.write(reinterpret_cast<const char*>(&nan), sizeof(nan));
      }
      Harness h(path, 2, 4096, {}, nullptr, act);
      const auto toks = Tokens(5, 3);
      std::vector<float> logits;
      const std::vector<BatchEntry> batch = {{1, toks, false}};
      absl::Status s = h.fwd->Forward(batch, h.cache.get(), &logits);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_NE(s.message().find("non-finite logits"), std::string_view::npos) << s;
      EXPECT_EQ(h.cache->Length(1), 0);
      // The greedy head says the same (its arg max sees the NaN: -1, not a token).
      std::vector<int32_t> ids;
      s = h.fwd->ForwardArgMax(batch, h.cache.get(), &ids);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_EQ(h.cache->Length(1), 0);
      std::vector<float> values;  // and the top-k head
      s = h.fwd->ForwardTopK(batch, h.cache.get(), 3, &ids, &values);
      EXPECT_EQ(s.code(), absl::StatusCode::kDataLoss) << s;
      EXPECT_EQ(h.cache->Length(1), 0);
    }
  }
}

TEST(Forward, AllFiniteSeesEveryNanAndInf) {
  std::vector<float> v(37, 1.5f);
  EXPECT_TRUE(AllFinite(v.data(), static_cast<int64_t>(v.size())));
  for (size_t i : {size_t{0}, size_t{7}, size_t{8}, size_t{36}}) {
    for (float bad :
         {std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
          -std::numeric_limits<float>::infinity()}) {
      std::vector<float> w = v;
      w[i] = bad;
      EXPECT_FALSE(AllFinite(w.data(), static_cast<int64_t>(w.size()))) << i << " " << bad;
    }
  }
  std::vector<float> huge(16, 3e38f);  // large but finite: no overflow to a false alarm
  EXPECT_TRUE(AllFinite(huge.data(), 16));
}

TEST(Forward, RejectsBadTokensWithoutTouchingTheCache) {
  TinyModelOptions o;
  Harness h(WriteModel(o, "bad"), 1);
  std::vector<float> logits;
  std::vector<int32_t> bad = {1, 2, 100000};
  BatchEntry e{1, bad, false};
  absl::Status s = h.fwd->Forward({&e, 1}, h.cache.get(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(s.message().find("100000"), std::string::npos);
  EXPECT_EQ(h.cache->Length(1), 0);
  std::vector<int32_t> neg = {-1};
  e.tokens = neg;
  EXPECT_FALSE(h.fwd->Forward({&e, 1}, h.cache.get(), &logits).ok());
  std::vector<int32_t> ok = {1};
  BatchEntry twice[2] = {{3, ok, false}, {3, ok, false}};
  EXPECT_FALSE(h.fwd->Forward(twice, h.cache.get(), &logits).ok());
}

TEST(Forward, CacheFullIsResourceExhaustedAndChangesNothing) {
  TinyModelOptions o;
  Harness h(WriteModel(o, "full"), 1, /*kv_tokens=*/16);
  auto a = Tokens(10, 1), b = Tokens(10, 2);
  h.Run({{1, a, false}});
  std::vector<float> logits;
  BatchEntry batch[2] = {{1, std::span<const int32_t>(b).subspan(0, 2), false}, {2, b, false}};
  absl::Status s = h.fwd->Forward(batch, h.cache.get(), &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kResourceExhausted) << s;
  EXPECT_EQ(h.cache->Length(1), 10);
  EXPECT_EQ(h.cache->Length(2), 0);
  // Sequence 1 still continues correctly afterwards.
  auto cont = h.Run({{1, std::span<const int32_t>(b).subspan(0, 2), true}});
  Harness ref(WriteModel(o, "full_ref"), 1);
  ref.Run({{1, a, false}});
  EXPECT_EQ(cont, ref.Run({{1, std::span<const int32_t>(b).subspan(0, 2), true}}));
}

TEST(Forward, ContextLengthIsEnforced) {
  TinyModelOptions o;
  o.context_length = 8;
  Harness h(WriteModel(o, "ctx"), 1);
  std::vector<float> logits;
  auto t = Tokens(9, 1);
  BatchEntry e{1, t, false};
  EXPECT_EQ(h.fwd->Forward({&e, 1}, h.cache.get(), &logits).code(),
            absl::StatusCode::kInvalidArgument);
}

// Runs T shards in lockstep on threads; AllReduceSum sums through shared buffers.
class ThreadReducer : public PartialSumReducer {
 public:
  ThreadReducer(int rank, std::vector<std::vector<float>>* slots, std::barrier<>* barrier)
      : rank_(rank), slots_(slots), barrier_(barrier) {}
  absl::Status AllReduceSum(float* data, int64_t count) override {
    (*slots_)[rank_].assign(data, data + count);
    barrier_->arrive_and_wait();
    for (int64_t i = 0; i < count; ++i) {
      double s = 0;
      for (const auto& slot : *slots_) s += slot[i];
      data[i] = static_cast<float>(s);
    }
    barrier_->arrive_and_wait();
    return absl::OkStatus();
  }

 private:
  int rank_;
  std::vector<std::vector<float>>* slots_;
  std::barrier<>* barrier_;
};

TEST(Forward, TensorParallelShardsMatchSingleShard) {
  TinyModelOptions o;
  o.n_heads = 4;
  o.n_kv_heads = 2;
  o.d_model = 128;
  o.d_ff = 256;
  const std::string path = WriteModel(o, "tp");
  auto toks = Tokens(9, 5);
  Harness single(path, 1);
  auto expected = single.Run({{1, toks, true}});
  const int T = 2;
  std::vector<std::vector<float>> slots(T);
  std::barrier<> barrier(T);
  std::vector<std::vector<float>> got(T);
  std::vector<std::thread> threads;
  for (int r = 0; r < T; ++r) {
    threads.emplace_back([&, r] {
      ThreadReducer reducer(r, &slots, &barrier);
      Harness h(path, 1, 4096, ShardSpec{r, T}, &reducer);
      got[r] = h.Run({{1, toks, true}});
    });
  }
  for (auto& t : threads) t.join();
  ASSERT_EQ(got[0].size(), expected.size());
  EXPECT_EQ(got[0], got[1]);
  // Partial sums are added in a different order than the unsharded matmul: tolerance.
  for (size_t i = 0; i < expected.size(); ++i) {
    EXPECT_NEAR(got[0][i], expected[i], 1e-3 * (1 + std::abs(expected[i]))) << i;
  }
}

}  // namespace
}  // namespace specnode
