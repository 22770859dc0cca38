// The scheduler tests' fixture, shared by scheduler_test.cc, scheduler_stop_test.cc,
// scheduler_stuck_test.cc and tests/serve/frontend_stuck_test.cc: a tiny 2-layer model,
// paged runners of a given KV capacity, a runner that holds a forward until released, a
// sink collecting each request's events, and the greedy reference of requests run alone.
#pragma once

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "coordinator/scheduler.h"
#include "coordinator/spec_engine.h"
#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/llama_model.h"
#include "model/llama/tiny_model.h"
#include "runtime/model_runner.h"

namespace specnode::scheduler_test {

// Collects events per handle; waits for terminal ones.
class Collector {
 public:
  void operator()(GenerationEvent ev) {
    std::lock_guard lock(mu_);
    auto& r = by_handle_[ev.handle];
    if (r.terminal) r.after_terminal++;
    if (ev.kind == GenerationEvent::Kind::kTokens) {
      EXPECT_EQ(ev.index, static_cast<int32_t>(r.tokens.size()));
      r.tokens.insert(r.tokens.end(), ev.token_ids.begin(), ev.token_ids.end());
      r.text += ev.text;
    } else {
      r.terminal++;
      r.last = ev;
      cv_.notify_all();
    }
  }
  struct Record {
    std::vector<int32_t> tokens;
    std::string text;
    int terminal = 0, after_terminal = 0;
    GenerationEvent last;
  };
  Record Wait(uint64_t handle) {
    std::unique_lock lock(mu_);
    EXPECT_TRUE(cv_.wait_for(lock, std::chrono::seconds(60),
                             [&] { return by_handle_[handle].terminal > 0; }));
    return by_handle_[handle];
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<uint64_t, Record> by_handle_;
};

// Delegates to a local runner; Forward number `hold_at` blocks until Release(), so a test
// can act while the scheduler is known to be mid-request.
class GatedRunner final : public ModelRunner {
 public:
  GatedRunner(std::unique_ptr<LocalModelRunner> inner, int hold_at)
      : inner_(std::move(inner)), hold_at_(hold_at) {}
  void WaitHeld() {
    std::unique_lock lock(mu_);
    ASSERT_TRUE(cv_.wait_for(lock, std::chrono::seconds(30), [&] { return held_; }));
  }
  void Release() {
    std::lock_guard lock(mu_);
    released_ = true;
    cv_.notify_all();
  }
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t max_positions() const override { return inner_->max_positions(); }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override {
    if (++forwards_ == hold_at_) {
      std::unique_lock lock(mu_);
      held_ = true;
      cv_.notify_all();
      cv_.wait(lock, [&] { return released_; });
    }
    return inner_->Forward(batch, logits);
  }
  int32_t Length(SeqId seq) const override { return inner_->Length(seq); }
  absl::Status Truncate(SeqId seq, int32_t n) override { return inner_->Truncate(seq, n); }
  void Free(SeqId seq) override { inner_->Free(seq); }
  std::optional<KvRoom> Room(int64_t tokens) const override { return inner_->Room(tokens); }
  absl::Status SwapOut(SeqId seq) override { return inner_->SwapOut(seq); }
  absl::Status SwapIn(SeqId seq) override { return inner_->SwapIn(seq); }
  const LocalModelRunner& inner() const { return *inner_; }

 private:
  std::unique_ptr<LocalModelRunner> inner_;
  const int hold_at_;
  int forwards_ = 0;
  std::mutex mu_;
  std::condition_variable cv_;
  bool held_ = false, released_ = false;
};
class SchedulerTest : public testing::Test {
 protected:
  void SetUp() override {
    path_ = (std::filesystem::temp_directory_path() /
             ("specnode_sched_" + std::to_string(getpid()) + ".gguf"))
                .string();
    TinyModelOptions o;
    o.n_layers = 2;
    o.seed = 5;
    ASSERT_TRUE(WriteTinyModel(o, path_).ok());
    model_ = std::move(LlamaModel::Load(path_)).value();
    pool_ = std::make_unique<ThreadPool>(2);
  }
  void TearDown() override { std::filesystem::remove(path_); }

  std::unique_ptr<LocalModelRunner> Runner(int64_t capacity_bytes,
                                           int64_t host_capacity_bytes = int64_t{64} << 20) {
    KvOptions kv;
    kv.mode = KvMode::kFull;
    kv.capacity_bytes = capacity_bytes;
    kv.host_capacity_bytes = host_capacity_bytes;
    kv.page_tokens = 8;
    auto cache = MakeKvCache(model_->config(), model_->weights().kv_heads_held(), kv);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return std::make_unique<LocalModelRunner>(model_->config(), model_->weights(), pool_.get(),
                                              std::move(cache).value());
  }

  static GenerationRequest Request(int i, int max_tokens) {
    GenerationRequest g;
    g.prompt = {static_cast<int32_t>(65 + i), 66, 67, static_cast<int32_t>(100 + 7 * i), 68};
    g.max_tokens = max_tokens;
    g.sampling.temperature = 0;
    return g;
  }

  // Greedy tokens of each request run alone on a roomy cache.
  std::vector<std::vector<int32_t>> Reference(int n, int max_tokens) {
    auto runner = Runner(64 << 20);
    SpeculativeEngine engine(runner.get(), {}, {});
    std::vector<std::vector<int32_t>> out;
    for (int i = 0; i < n; ++i) {
      SpecRequest r;
      r.id = i;
      r.prompt = Request(i, max_tokens).prompt;
      r.max_new_tokens = max_tokens;
      EXPECT_TRUE(engine.Start(r).ok());
      std::vector<int32_t> tokens;
      std::vector<SeqStepResult> res;
      const SeqId ids[] = {i};
      do {
        EXPECT_TRUE(engine.Step(ids, &res).ok());
        tokens.insert(tokens.end(), res[0].tokens.begin(), res[0].tokens.end());
      } while (res[0].finish == FinishReason::kNone);
      engine.Finish(i);
      out.push_back(tokens);
    }
    return out;
  }

  std::string path_;
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<ThreadPool> pool_;
};

// Under KV pressure every request completes with the tokens it gets alone, whether
// preemption swaps KV to the host tier (kept work) or frees it for recompute (no host
// tier); KV-aware admission holds requests back instead of admitting all 8 at once.

}  // namespace specnode::scheduler_test
