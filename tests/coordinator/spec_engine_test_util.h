// The speculative engine's test fixture, shared by spec_engine_test.cc and
// spec_engine_determinism_test.cc: a tiny 3-layer Q8_0 target and three perturbed drafts
// written once per suite, runners per KV mode (plus "mixed-tight"), named drafters, and
// Run(), which steps a set of requests to completion together.
#pragma once

#include <unistd.h>

#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "coordinator/model_drafter.h"
#include "coordinator/ngram_drafter.h"
#include "coordinator/recycling_drafter.h"
#include "coordinator/spec_engine.h"
#include "coordinator/suffix_drafter.h"
#include "gtest/gtest.h"
#include "kvstore/kv_cache_factory.h"
#include "model/llama/llama_model.h"
#include "model/llama/tiny_model.h"

namespace specnode::spec_engine_test {

inline std::string TempPath(const std::string& name) {
  return (std::filesystem::temp_directory_path() /
          ("specnode_spec_" + std::to_string(getpid()) + "_" + name + ".gguf"))
      .string();
}

inline TinyModelOptions TargetOptions() {
  TinyModelOptions o;
  o.n_layers = 3;
  o.weight_type = GgmlType::kQ8_0;
  o.seed = 21;
  return o;
}

class SpecEngineTest : public testing::Test {
 protected:
  static void SetUpTestSuite() {
    target_path_ = new std::string(TempPath("target"));
    ASSERT_TRUE(WriteTinyModel(TargetOptions(), *target_path_).ok());
    for (float perturb : {0.05f, 0.3f, 1.0f}) {
      TinyModelOptions o = TargetOptions();
      o.perturb = perturb;
      const std::string path = TempPath("draft" + std::to_string(static_cast<int>(perturb * 100)));
      ASSERT_TRUE(WriteTinyModel(o, path).ok());
      draft_paths_.push_back(path);
    }
  }
  static void TearDownTestSuite() {
    std::filesystem::remove(*target_path_);
    for (const auto& p : draft_paths_) std::filesystem::remove(p);
    delete target_path_;
    draft_paths_.clear();
  }

  void SetUp() override {
    auto m = LlamaModel::Load(*target_path_);
    ASSERT_TRUE(m.ok()) << m.status();
    target_ = std::move(m).value();
    pool_ = std::make_unique<ThreadPool>(2);
  }

  // A KV mode by name; "mixed-tight" is mixed with a window, boundary and sampling small
  // enough that the tiny prompts demote tokens (both classes) many times per generation.
  static KvOptions KvFor(const std::string& kv_mode) {
    KvOptions kv;
    if (kv_mode == "mixed-tight") {
      kv.mode = KvMode::kMixed;
      kv.window_tokens = 8;
      kv.demote_every = 8;
      kv.sink_tokens = 2;
      kv.mass_sample_every = 2;
      kv.critical_threshold = 1.5f;
      return kv;
    }
    kv.mode = ParseKvMode(kv_mode).value();
    return kv;
  }

  std::unique_ptr<LocalModelRunner> MakeRunner(const std::string& kv_mode) {
    const KvOptions kv = KvFor(kv_mode);
    auto cache = MakeKvCache(target_->config(), target_->weights().kv_heads_held(), kv);
    EXPECT_TRUE(cache.ok()) << cache.status();
    return std::make_unique<LocalModelRunner>(target_->config(), target_->weights(), pool_.get(),
                                              std::move(cache).value());
  }

  // Named drafters: "draft5", "draft30", "draft100" (perturbed copies), "self1", "self2",
  // "ngram", "suffix", "recycle".
  std::unique_ptr<Drafter> MakeDrafter(const std::string& name, const std::string& kv_mode) {
    const KvOptions kv = KvFor(kv_mode);
    if (name == "ngram") {
      NgramDrafterOptions o;
      o.min_n = 1;
      return std::move(NgramDrafter::Create(o)).value();
    }
    if (name == "suffix") {
      SuffixDrafterOptions o;
      o.min_n = 1;
      return std::move(SuffixDrafter::Create(o)).value();
    }
    if (name == "recycle") return std::move(RecyclingDrafter::Create({})).value();
    if (name.rfind("self", 0) == 0) {
      auto d = ModelDrafter::SelfDraft(*target_, std::stoi(name.substr(4)), pool_.get(), kv);
      EXPECT_TRUE(d.ok()) << d.status();
      return std::move(d).value();
    }
    const std::map<std::string, int> index = {{"draft5", 0}, {"draft30", 1}, {"draft100", 2}};
    auto d = ModelDrafter::Load(draft_paths_[index.at(name)], *target_, pool_.get(), kv);
    EXPECT_TRUE(d.ok()) << d.status();
    return std::move(d).value();
  }

  // Runs requests to completion, all sequences stepping together; returns generated tokens.
  std::vector<std::vector<int32_t>> Run(SpeculativeEngine& engine,
                                        const std::vector<SpecRequest>& requests,
                                        ModelRunner* runner = nullptr) {
    std::vector<SeqId> live;
    std::map<SeqId, std::vector<int32_t>> generated;
    for (const SpecRequest& r : requests) {
      EXPECT_TRUE(engine.Start(r).ok());
      live.push_back(r.id);
    }
    std::vector<SeqStepResult> results;
    for (int guard = 0; !live.empty() && guard < 10000; ++guard) {
      absl::Status st = engine.Step(live, &results);
      EXPECT_TRUE(st.ok()) << st;
      if (!st.ok()) break;
      std::vector<SeqId> next;
      for (const SeqStepResult& r : results) {
        auto& g = generated[r.id];
        g.insert(g.end(), r.tokens.begin(), r.tokens.end());
        if (runner != nullptr && !engine.Prefilling(r.id) && r.finish == FinishReason::kNone) {
          // Decode invariant: the target caches every committed token but the last.
          EXPECT_EQ(runner->Length(r.id), static_cast<int32_t>(engine.Tokens(r.id).size()) - 1);
        }
        if (r.finish == FinishReason::kNone) {
          next.push_back(r.id);
        } else {
          engine.Finish(r.id);
        }
      }
      live = next;
    }
    std::vector<std::vector<int32_t>> out;
    for (const SpecRequest& r : requests) out.push_back(generated[r.id]);
    return out;
  }

  static std::vector<SpecRequest> Prompts(float temperature, int max_new, uint64_t seed = 0) {
    const std::vector<std::vector<int32_t>> prompts = {
        {72, 101, 108, 108, 111},
        {1, 2, 3, 4, 5, 6, 7, 8, 1, 2, 3, 4},
        {200, 17, 17, 300, 42, 99, 120, 121, 122, 123, 124, 125, 126, 127, 128, 129}};
    std::vector<SpecRequest> out;
    for (size_t i = 0; i < prompts.size(); ++i) {
      SpecRequest r;
      r.id = static_cast<SeqId>(i + 1);
      r.prompt = prompts[i];
      r.sampling.temperature = temperature;
      r.sampling.seed = seed + i;
      r.max_new_tokens = max_new;
      r.ignore_stop = true;
      out.push_back(r);
    }
    return out;
  }

  inline static std::string* target_path_ = nullptr;
  inline static std::vector<std::string> draft_paths_;
  std::unique_ptr<LlamaModel> target_;
  std::unique_ptr<ThreadPool> pool_;
};

inline std::unique_ptr<SpecController> NewController() {
  return std::move(SpecController::Create({})).value();
}

}  // namespace specnode::spec_engine_test
