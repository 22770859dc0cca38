// ShardExecutor (what every target shard rank does with a StepPlan) on a tiny model at
// TP 2, the shards as threads over a LocalCommunicator: logits against one unsharded
// LocalModelRunner (tolerance as tests/tensor-parallel/tp_forward_test.cc), ops applied
// alike, fingerprints equal to the coordinator's table, and KV exhaustion on ONE shard
// failing the step on every shard with ResourceExhausted (no shard left in an all-reduce);
// the prefix cache's ops (MatchPrefix agreed on by every shard, PublishPrefix) and the
// events TP rank 0 reports.
#include "node/cluster/shard_executor.h"

#include <unistd.h>

#include <cmath>
#include <thread>

#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "runtime/model_runner.h"
#include "runtime/runner_factory.h"
#include "model/llama/llama_model.h"
#include "model/llama/tiny_model.h"
#include "tensor-parallel/local_communicator.h"

namespace specnode {
namespace {

constexpr int kTp = 2;

class ShardExecutorTest : public ::testing::Test {
 protected:
  void SetUp() override {
    path_ = ::testing::TempDir() + "/shard_exec_tiny_" + std::to_string(getpid()) + ".gguf";
    TinyModelOptions to;
    to.n_layers = 2;
    ASSERT_TRUE(WriteTinyModel(to, path_).ok());
    auto full = LlamaModel::Load(path_);
    ASSERT_TRUE(full.ok()) << full.status();
    full_ = std::move(full).value();
    pool_ = std::make_unique<ThreadPool>(1);
    ref_ = std::make_unique<LocalModelRunner>(full_->config(), full_->weights(), pool_.get(),
                                              Cache(*full_, int64_t{64} << 20));
    CommunicatorOptions co;
    co.timeout_s = 30;
    auto group = LocalCommunicatorGroup::Create(kTp, co);
    ASSERT_TRUE(group.ok()) << group.status();
    group_ = std::move(group).value();
  }
  void TearDown() override { unlink(path_.c_str()); }

  std::unique_ptr<KvCache> Cache(const LlamaModel& m, int64_t capacity) {
    KvOptions o;
    o.mode = KvMode::kFull;
    o.capacity_bytes = capacity;
    auto c = MakeKvCache(m.config(), m.weights().kv_heads_held(), o);
    EXPECT_TRUE(c.ok()) << c.status();
    return std::move(c).value();
  }

  // Shard r through the runner factory, as a shard rank builds it (its pass all-reducing
  // over the group), with KV capacity `capacity`.
  std::unique_ptr<ShardExecutor> Shard(int r, int64_t capacity, KvMode mode = KvMode::kFull) {
    while (static_cast<int>(reducers_.size()) <= r) reducers_.emplace_back();
    reducers_[r] = std::make_unique<CommunicatorReducer>(group_->Rank(r));
    RunnerOptions ro;
    ro.kv.mode = mode;
    ro.kv.capacity_bytes = capacity;
    ro.pool = shard_pools_[r].get();
    ro.reducer = reducers_[r].get();
    auto runner = MakeRunner(shard_models_[r]->config(), shard_models_[r]->weights(), ro);
    EXPECT_TRUE(runner.ok()) << runner.status();
    if (!runner.ok()) return nullptr;
    return std::make_unique<ShardExecutor>(shard_models_[r]->config(), std::move(runner).value(),
                                           group_->Rank(r));
  }

  // Builds the shards; shard r's KV capacity is capacity[r].
  void MakeShards(std::vector<int64_t> capacity, KvMode mode = KvMode::kFull) {
    for (int r = 0; r < kTp; ++r) {
      LoadOptions lo;
      lo.shard = ShardSpec{r, kTp};
      auto m = LlamaModel::Load(path_, lo);
      ASSERT_TRUE(m.ok()) << m.status();
      shard_models_.push_back(std::move(m).value());
      shard_pools_.push_back(std::make_unique<ThreadPool>(1));
      shards_.push_back(Shard(r, capacity[r], mode));
    }
  }

  // Every shard executes the plan on its own thread (as every rank does under mpirun).
  std::vector<StepReplyMessage> Run(const StepPlanMessage& plan) {
    std::vector<StepReplyMessage> replies(kTp);
    std::vector<std::thread> threads;
    for (int r = 0; r < kTp; ++r) {
      threads.emplace_back([&, r] { replies[r] = shards_[r]->Execute(plan); });
    }
    for (auto& t : threads) t.join();
    return replies;
  }

  std::string path_;
  std::unique_ptr<LlamaModel> full_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<LocalModelRunner> ref_;
  std::unique_ptr<LocalCommunicatorGroup> group_;
  std::vector<std::unique_ptr<LlamaModel>> shard_models_;
  std::vector<std::unique_ptr<ThreadPool>> shard_pools_;
  std::vector<std::unique_ptr<CommunicatorReducer>> reducers_;  // outlive shards_
  std::vector<std::unique_ptr<ShardExecutor>> shards_;
};

void ExpectClose(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_LE(std::abs(got[i] - want[i]), 1e-3 * std::max(1.0f, std::abs(want[i]))) << i;
  }
}

TEST_F(ShardExecutorTest, MatchesUnshardedForwardAndKeepsTablesInStep) {
  MakeShards({int64_t{64} << 20, int64_t{64} << 20});
  const int vocab = full_->config().vocab_size;
  std::vector<int32_t> a = {5, 17, 99, 3, 42, 7}, b = {11, 12};
  StepPlanMessage plan;
  plan.step = 1;
  plan.entries = {{1, false, a}, {2, true, b}};
  auto replies = Run(plan);
  std::vector<BatchEntry> batch = {{1, a, false}, {2, b, true}};
  std::vector<float> want;
  ASSERT_TRUE(ref_->Forward(batch, &want).ok());
  for (const StepReplyMessage& r : replies) ASSERT_TRUE(r.status().ok()) << r.status();
  EXPECT_EQ(replies[0].n_rows, 3);
  EXPECT_EQ(replies[0].vocab, vocab);
  ExpectClose(replies[0].logits, want);
  EXPECT_TRUE(replies[1].logits.empty());  // only TP rank 0 computes the head
  EXPECT_EQ(replies[1].n_rows, 0);
  const KvFingerprint f = FingerprintLengths({{1, 6}, {2, 2}});
  for (const StepReplyMessage& r : replies) {
    EXPECT_EQ(r.kv_hash, f.hash);
    EXPECT_EQ(r.kv_tokens, 8);
  }

  // Roll sequence 1 back to 4 tokens, drop 2, decode one token on 1.
  StepPlanMessage next;
  next.step = 2;
  next.ops = {StepOp::Truncate(1, 4), StepOp::Free(2)};
  std::vector<int32_t> t = {77};
  next.entries = {{1, false, t}};
  replies = Run(next);
  ASSERT_TRUE(ref_->Truncate(1, 4).ok());
  ref_->Free(2);
  std::vector<BatchEntry> b2 = {{1, t, false}};
  ASSERT_TRUE(ref_->Forward(b2, &want).ok());
  for (const StepReplyMessage& r : replies) ASSERT_TRUE(r.status().ok()) << r.status();
  ExpectClose(replies[0].logits, want);
  for (const StepReplyMessage& r : replies) {
    EXPECT_EQ(r.kv_hash, FingerprintLengths({{1, 5}}).hash);
    EXPECT_EQ(r.kv_tokens, 5);
    EXPECT_EQ(r.step, 2u);
  }
}

// Protocol v6: a draft tree's entry (parents) and the KeepRows op that keeps its drawn path
// give every shard the unsharded runner's logits and table, step after step.
TEST_F(ShardExecutorTest, DraftTreesAndKeptPathsMatchTheUnshardedRunner) {
  MakeShards({int64_t{64} << 20, int64_t{64} << 20});
  for (const auto& shard : shards_) EXPECT_TRUE(shard->model().TreePasses());
  const std::vector<int32_t> prompt = {5, 17, 99, 3}, tree = {42, 7, 8, 9};
  const std::vector<int32_t> parents = {-1, 0, 0, 1}, kept = {0, 1, 3}, next = {11};
  std::vector<float> want;
  StepPlanMessage p1;
  p1.step = 1;
  p1.entries = {{1, false, prompt}};
  for (const StepReplyMessage& r : Run(p1)) ASSERT_TRUE(r.status().ok()) << r.status();
  std::vector<BatchEntry> b1 = {{1, prompt, false}};
  ASSERT_TRUE(ref_->Forward(b1, &want).ok());
  // The tree: 42 at position 4, then 7 and 8 after it, 9 after 7.
  StepPlanMessage p2;
  p2.step = 2;
  p2.entries = {{1, true, tree, parents}};
  auto replies = Run(p2);
  std::vector<BatchEntry> b2 = {{1, tree, true, parents}};
  ASSERT_TRUE(ref_->Forward(b2, &want).ok());
  for (const StepReplyMessage& r : replies) ASSERT_TRUE(r.status().ok()) << r.status();
  EXPECT_EQ(replies[0].n_rows, 4);
  ExpectClose(replies[0].logits, want);
  // Keep the path 42 -> 7 -> 9 and decode one more token after it.
  StepPlanMessage p3;
  p3.step = 3;
  p3.ops = {StepOp::KeepRows(1, 4, kept)};
  p3.entries = {{1, false, next}};
  replies = Run(p3);
  ASSERT_TRUE(ref_->KeepRows(1, 4, kept).ok());
  std::vector<BatchEntry> b3 = {{1, next, false}};
  ASSERT_TRUE(ref_->Forward(b3, &want).ok());
  for (const StepReplyMessage& r : replies) {
    ASSERT_TRUE(r.status().ok()) << r.status();
    EXPECT_EQ(r.kv_hash, FingerprintLengths({{1, 8}}).hash);
  }
  ExpectClose(replies[0].logits, want);
  // A bad kept row list fails the step on the shards (the coordinator checks it first).
  StepPlanMessage bad;
  bad.step = 4;
  bad.ops = {StepOp::KeepRows(1, 6, std::vector<int32_t>{0, 5})};
  for (const StepReplyMessage& r : Run(bad)) EXPECT_FALSE(r.status().ok());
}

TEST_F(ShardExecutorTest, KvExhaustedOnOneShardFailsTheStepOnEveryShard) {
  // Shard 1 gets a cache too small for the long prompt; shard 0 has plenty.
  MakeShards({int64_t{64} << 20, int64_t{64} << 20});
  // Two pages of 8 tokens of this shard's one kv head: the smallest cache that builds.
  KvOptions small;
  small.mode = KvMode::kFull;
  int64_t cap = 1024;
  for (; cap < (int64_t{1} << 24); cap *= 2) {
    small.capacity_bytes = cap;
    if (MakeKvCache(shard_models_[1]->config(), shard_models_[1]->weights().kv_heads_held(), small)
            .ok()) {
      break;
    }
  }
  shards_[1] = Shard(1, cap);
  ASSERT_NE(shards_[1], nullptr);

  std::vector<int32_t> small_prompt = {1, 2, 3};
  StepPlanMessage ok_plan;
  ok_plan.step = 1;
  ok_plan.entries = {{7, false, small_prompt}};
  auto replies = Run(ok_plan);
  for (const StepReplyMessage& r : replies) ASSERT_TRUE(r.status().ok()) << r.status();

  std::vector<int32_t> long_prompt(200, 5);
  StepPlanMessage big;
  big.step = 2;
  big.entries = {{8, false, long_prompt}, {7, false, {4}}};
  replies = Run(big);  // must not hang
  EXPECT_EQ(replies[0].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(replies[1].status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_FALSE(replies[0].local_failure);
  EXPECT_TRUE(replies[1].local_failure);
  // Nothing changed: both shards still hold only sequence 7's 3 tokens.
  for (const StepReplyMessage& r : replies) {
    EXPECT_EQ(r.kv_hash, FingerprintLengths({{7, 3}}).hash);
    EXPECT_EQ(r.kv_tokens, 3);
  }
  // The group is still usable.
  StepPlanMessage again;
  again.step = 3;
  again.entries = {{7, false, {4}}};
  replies = Run(again);
  for (const StepReplyMessage& r : replies) {
    ASSERT_TRUE(r.status().ok()) << r.status();
    EXPECT_EQ(r.kv_tokens, 4);
  }
}

TEST_F(ShardExecutorTest, BadBatchIsInvalidArgumentOnEveryShard) {
  MakeShards({int64_t{64} << 20, int64_t{64} << 20});
  StepPlanMessage plan;
  plan.step = 1;
  plan.entries = {{1, false, {1, 2, 1 << 30}}};
  auto replies = Run(plan);
  for (const StepReplyMessage& r : replies) {
    EXPECT_EQ(r.status().code(), absl::StatusCode::kInvalidArgument) << r.status();
    EXPECT_EQ(r.kv_tokens, 0);
  }
}

std::vector<int32_t> Prompt(int n, int32_t first) {
  std::vector<int32_t> p(n);
  for (int i = 0; i < n; ++i) p[i] = (first + 7 * i) % 60 + 1;
  return p;
}

TEST_F(ShardExecutorTest, PrefixMatchReusesPublishedPagesOnEveryShard) {
  MakeShards({int64_t{64} << 20, int64_t{64} << 20});
  for (const auto& s : shards_) EXPECT_TRUE(s->prefix_cache());
  const std::vector<int32_t> a = Prompt(20, 3);
  StepPlanMessage prefill;
  prefill.step = 1;
  prefill.entries = {{1, false, a}};
  for (const StepReplyMessage& r : Run(prefill)) ASSERT_TRUE(r.status().ok()) << r.status();

  // Publishing registers the two whole 8-token pages; only TP rank 0 reports the event.
  StepPlanMessage publish;
  publish.step = 2;
  publish.ops = {StepOp::PublishPrefix(1, a)};
  auto replies = Run(publish);
  for (const StepReplyMessage& r : replies) ASSERT_TRUE(r.status().ok()) << r.status();
  ASSERT_EQ(replies[0].events.size(), 1u);
  const KvCacheEvent& stored = replies[0].events[0];
  EXPECT_EQ(stored.kind, KvCacheEvent::Kind::kBlockStored);
  EXPECT_EQ(stored.block_hashes.size(), 2u);
  EXPECT_FALSE(stored.parent_block_hash.has_value());
  EXPECT_EQ(stored.token_ids, std::vector<int32_t>(a.begin(), a.begin() + 16));
  EXPECT_EQ(stored.block_size, 8);
  EXPECT_EQ(stored.medium, "CPU");
  EXPECT_TRUE(replies[1].events.empty());
  EXPECT_EQ(replies[0].kv_cache_only_bytes, 0);  // sequence 1 still uses the pages

  // A second prompt sharing 16 tokens attaches them, then prefills only its own 4: its
  // logits equal an unsharded pass over the whole prompt.
  std::vector<int32_t> b(a.begin(), a.begin() + 16);
  for (int32_t t : {50, 51, 52, 53}) b.push_back(t);
  StepPlanMessage match;
  match.step = 3;
  match.ops = {StepOp::MatchPrefix(2, b)};
  match.entries = {{2, false, std::vector<int32_t>(b.begin() + 16, b.end())}};
  replies = Run(match);
  std::vector<BatchEntry> whole = {{2, b, false}};
  std::vector<float> want;
  ASSERT_TRUE(ref_->Forward(whole, &want).ok());
  for (const StepReplyMessage& r : replies) {
    ASSERT_TRUE(r.status().ok()) << r.status();
    EXPECT_EQ(r.matched, std::vector<int32_t>{16});
    EXPECT_EQ(r.kv_hash, FingerprintLengths({{1, 20}, {2, 20}}).hash);
  }
  ExpectClose(replies[0].logits, want);

  // Both sequences gone: the cached pages stay, held by the cache alone.
  StepPlanMessage done;
  done.step = 4;
  done.ops = {StepOp::Free(1), StepOp::Free(2)};
  for (const StepReplyMessage& r : Run(done)) {
    ASSERT_TRUE(r.status().ok()) << r.status();
    EXPECT_EQ(r.kv_tokens, 0);
    EXPECT_GT(r.kv_cache_only_bytes, 0);
  }
}

TEST_F(ShardExecutorTest, ShardsKeepTheShortestMatchWhenTheirCachesDiffer) {
  MakeShards({int64_t{64} << 20, int64_t{64} << 20});
  const std::vector<int32_t> a = Prompt(20, 5);
  StepPlanMessage prefill;
  prefill.step = 1;
  prefill.entries = {{1, false, a}};
  for (const StepReplyMessage& r : Run(prefill)) ASSERT_TRUE(r.status().ok()) << r.status();

  // Shard 0 alone caches both pages (as when shard 1 evicted them): nothing is shared.
  shards_[0]->model().PublishPrefix(1, a);
  StepPlanMessage match;
  match.step = 2;
  match.ops = {StepOp::MatchPrefix(2, a)};
  for (const StepReplyMessage& r : Run(match)) {
    ASSERT_TRUE(r.status().ok()) << r.status();
    EXPECT_EQ(r.matched, std::vector<int32_t>{0});
    EXPECT_EQ(r.kv_hash, FingerprintLengths({{1, 20}}).hash);
  }
  // Shard 1 caches the first page: both keep 8 positions.
  shards_[1]->model().PublishPrefix(1, std::vector<int32_t>(a.begin(), a.begin() + 8));
  match.step = 3;
  match.ops = {StepOp::MatchPrefix(3, a)};
  for (const StepReplyMessage& r : Run(match)) {
    ASSERT_TRUE(r.status().ok()) << r.status();
    EXPECT_EQ(r.matched, std::vector<int32_t>{8});
    EXPECT_EQ(r.kv_hash, FingerprintLengths({{1, 20}, {3, 8}}).hash);
  }
  // A sequence that already holds tokens matches nothing.
  match.step = 4;
  match.ops = {StepOp::MatchPrefix(1, a)};
  for (const StepReplyMessage& r : Run(match)) EXPECT_EQ(r.matched, std::vector<int32_t>{0});
}

TEST_F(ShardExecutorTest, DenseCacheHasNoPrefixCacheAndMatchesNothing) {
  MakeShards({int64_t{64} << 20, int64_t{64} << 20}, KvMode::kDense);
  for (const auto& s : shards_) EXPECT_FALSE(s->prefix_cache());
  const std::vector<int32_t> a = Prompt(20, 9);
  StepPlanMessage plan;
  plan.step = 1;
  plan.entries = {{1, false, a}};
  for (const StepReplyMessage& r : Run(plan)) ASSERT_TRUE(r.status().ok()) << r.status();
  plan.step = 2;
  plan.entries.clear();
  plan.ops = {StepOp::PublishPrefix(1, a), StepOp::MatchPrefix(2, a)};
  for (const StepReplyMessage& r : Run(plan)) {
    ASSERT_TRUE(r.status().ok()) << r.status();
    EXPECT_EQ(r.matched, std::vector<int32_t>{0});
    EXPECT_TRUE(r.events.empty());
    EXPECT_EQ(r.kv_cache_only_bytes, -1);
  }
}

}  // namespace
}  // namespace specnode
