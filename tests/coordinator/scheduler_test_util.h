// The scheduler tests' fixture, shared by scheduler_test.cc and scheduler_stop_test.cc: a
// tiny 2-layer model, paged runners of a given KV capacity, a sink collecting each
// request's events, and the greedy reference of requests run alone.
#pragma once

#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
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
    auto cache = MakeKvCache(model_->config(), model_->weights().n_kv_heads_local, kv);
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
