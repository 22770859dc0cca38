// The heads a pass asks its target for (spec_engine.h Pass): arg maxes for greedy passes,
// each row's k largest logits for top-k samplers, each row's draw for samplers without
// top-k, whole rows otherwise — and the same tokens whichever it asks for.
#include <algorithm>
#include <functional>
#include <memory>
#include <vector>

#include "coordinator/spec_engine.h"
#include "gtest/gtest.h"
#include "tests/coordinator/spec_engine_test_util.h"

namespace specnode {
namespace {

using spec_engine_test::NewController;
using spec_engine_test::SpecEngineTest;

// Counts the two heads a target can be asked for (logits, or each row's arg max).
class HeadCountingRunner final : public ModelRunner {
 public:
  explicit HeadCountingRunner(ModelRunner* inner) : inner_(inner) {}
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t max_positions() const override { return inner_->max_positions(); }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override {
    ++logits_passes;
    return inner_->Forward(batch, logits);
  }
  absl::Status ForwardArgMax(std::span<const BatchEntry> batch,
                             std::vector<int32_t>* ids) override {
    ++argmax_passes;
    return inner_->ForwardArgMax(batch, ids);
  }
  absl::Status ForwardTopK(std::span<const BatchEntry> batch, int k, std::vector<int32_t>* ids,
                           std::vector<float>* values) override {
    ++topk_passes;
    max_k = std::max(max_k, k);
    return inner_->ForwardTopK(batch, k, ids, values);
  }
  absl::Status ForwardDrawn(std::span<const BatchEntry> batch,
                            std::span<const sample::DrawParams> draws,
                            std::vector<int32_t>* ids) override {
    ++drawn_passes;
    return inner_->ForwardDrawn(batch, draws, ids);
  }
  int32_t Length(SeqId seq) const override { return inner_->Length(seq); }
  absl::Status Truncate(SeqId seq, int32_t n) override { return inner_->Truncate(seq, n); }
  void Free(SeqId seq) override { inner_->Free(seq); }
  int logits_passes = 0, argmax_passes = 0, topk_passes = 0, max_k = 0, drawn_passes = 0;

 private:
  ModelRunner* inner_;
};

// How often a target was asked for each head.
struct HeadCounts {
  int logits_passes = 0, argmax_passes = 0, topk_passes = 0, max_k = 0, drawn_passes = 0;
};

class SpecEngineHeadTest : public SpecEngineTest {
 protected:
  // `requests` through a fresh engine whose target counts its heads into *counts: target-only
  // or speculating with the "draft30" model drafter, under `rule`.
  // `requests` and one more sequence (id 999, seed 9, temperature 0.8) whose sampling
  // `change` edits: a mate that changes which head the passes ask for.
  static std::vector<SpecRequest> WithMate(std::vector<SpecRequest> requests,
                                           const std::function<void(SamplingParams&)>& change) {
    requests.push_back(Prompts(0.8f, 24, 9)[0]);
    requests.back().id = 999;
    change(requests.back().sampling);
    return requests;
  }

  std::vector<std::vector<int32_t>> RunCountingHeads(const std::vector<SpecRequest>& requests,
                                                     AcceptanceRule rule, bool speculate,
                                                     HeadCounts* counts) {
    auto inner = MakeRunner("full");
    HeadCountingRunner runner(inner.get());
    auto drafter = MakeDrafter("draft30", "full");
    auto controller = NewController();
    std::vector<DraftGroup> groups;
    if (speculate) groups.push_back({drafter.get(), controller.get()});
    SpecEngineOptions options;
    options.acceptance = rule;
    SpeculativeEngine engine(&runner, std::move(groups), options);
    auto got = Run(engine, requests, inner.get());
    *counts = {runner.logits_passes, runner.argmax_passes, runner.topk_passes, runner.max_k,
               runner.drawn_passes};
    return got;
  }
};

// A pass whose sequences all decode greedily asks the target for arg maxes only (a GPU
// target then keeps the logits on the device), with the same tokens, speculating or not;
// one sampled sequence in the pass (top-p or not) makes it ask for its draws, a top-p one
// beside a top-k one for logits.
TEST_F(SpecEngineTest, GreedyPassesTakeArgMaxesNotLogits) {
  auto plain_runner = MakeRunner("full");
  SpeculativeEngine plain(plain_runner.get(), {}, {});
  const auto expected = Run(plain, Prompts(0.0f, 24));
  for (bool speculate : {false, true}) {
    auto inner = MakeRunner("full");
    HeadCountingRunner runner(inner.get());
    auto drafter = MakeDrafter("ngram", "full");
    auto controller = NewController();
    std::vector<DraftGroup> groups;
    if (speculate) groups.push_back({drafter.get(), controller.get()});
    SpeculativeEngine engine(&runner, std::move(groups), {});
    EXPECT_EQ(Run(engine, Prompts(0.0f, 24), inner.get()), expected) << speculate;
    EXPECT_GT(runner.argmax_passes, 0);
    EXPECT_EQ(runner.logits_passes, 0) << speculate;
  }
  auto inner = MakeRunner("full");
  HeadCountingRunner runner(inner.get());
  SpeculativeEngine engine(&runner, {}, {});
  std::vector<SpecRequest> mixed = Prompts(0.0f, 8);
  mixed[1].sampling.temperature = 0.7f;
  Run(engine, mixed, inner.get());
  EXPECT_GT(runner.drawn_passes, 0);
  EXPECT_EQ(runner.logits_passes, 0);
  mixed[1].sampling.top_p = 0.9f;
  mixed[1].id = 50;
  Run(engine, mixed, inner.get());
  EXPECT_EQ(runner.logits_passes, 0);
  mixed[2].sampling = {0.7f, 5, 1.0f, 3};
  mixed[1].id = 51;
  mixed[2].id = 52;
  Run(engine, mixed, inner.get());
  EXPECT_GT(runner.logits_passes, 0);
}

// Sampled passes whose samplers have no top-k (temperature alone, the OpenAI API's default,
// or with top-p; greedy mates) ask for each row's draw, one id a row: under the match rule
// speculating or not, and under the ratio rule without drafts. The text equals the rows
// path's (a top-k mate beside them forces whole rows and changes nothing for the others).
// Sampled verification under the ratio rule needs distributions, so it ships the rows.
TEST_F(SpecEngineHeadTest, SampledPassesWithoutTopKTakeEachRowsDrawNotTheRows) {
  std::vector<SpecRequest> requests = Prompts(0.9f, 24, 5);
  requests[1].sampling.temperature = 0.0f;
  requests[2].sampling.top_p = 0.8f;
  requests[3].sampling.top_p = 0.95f;
  const std::vector<SpecRequest> with_mate =
      WithMate(requests, [](SamplingParams& p) { p.top_k = 5; });
  auto base_inner = MakeRunner("full");
  HeadCountingRunner base_runner(base_inner.get());
  SpeculativeEngine base(&base_runner, {}, {});
  std::vector<std::vector<int32_t>> expected = Run(base, with_mate, base_inner.get());
  expected.pop_back();
  EXPECT_EQ(base_runner.drawn_passes, 0);
  EXPECT_GT(base_runner.logits_passes, 0);
  for (AcceptanceRule rule : {AcceptanceRule::kMatch, AcceptanceRule::kRatio}) {
    for (bool speculate : {false, true}) {
      HeadCounts runner;
      const auto got = RunCountingHeads(requests, rule, speculate, &runner);
      const bool ratio_verifies = rule == AcceptanceRule::kRatio && speculate;
      if (!ratio_verifies) {
        EXPECT_EQ(got, expected) << speculate;
        EXPECT_EQ(runner.logits_passes, 0) << speculate;
      } else {
        EXPECT_GT(runner.logits_passes, 0);
      }
      EXPECT_GT(runner.drawn_passes, 0) << static_cast<int>(rule) << " " << speculate;
    }
  }
}

// Top-k sampled passes (with greedy mates) ask for each row's largest logits, as many as
// the largest top_k of the pass, under both rules and with a sampled model drafter; the
// seeded text is the same as target-only decoding's and as a pass that ships logits (a
// top-p-only mate forces those).
TEST_F(SpecEngineHeadTest, TopKPassesTakeTheLargestLogitsNotTheRows) {
  std::vector<SpecRequest> requests = Prompts(0.8f, 24, 5);
  for (size_t i = 0; i < requests.size(); ++i) {
    requests[i].sampling.top_k = i % 3 == 0 ? 5 : 17;
    requests[i].sampling.top_p = i % 2 == 0 ? 1.0f : 0.9f;
    if (i == 1) requests[i].sampling.temperature = 0.0f;
  }
  auto base_runner = MakeRunner("full");
  SpeculativeEngine base(base_runner.get(), {}, {});
  const auto expected = Run(base, requests);
  for (AcceptanceRule rule : {AcceptanceRule::kMatch, AcceptanceRule::kRatio}) {
    for (bool speculate : {false, true}) {
      HeadCounts runner;
      const auto got = RunCountingHeads(requests, rule, speculate, &runner);
      if (rule == AcceptanceRule::kMatch || !speculate) {
        EXPECT_EQ(got, expected) << speculate;
      }
      EXPECT_GT(runner.topk_passes, 0);
      EXPECT_EQ(runner.max_k, 17);
      EXPECT_EQ(runner.logits_passes, 0) << speculate;
    }
  }
  // A mate without top-k needs whole rows: that pass ships logits, the text stays the same.
  const std::vector<SpecRequest> with_mate =
      WithMate(requests, [](SamplingParams& p) { p.top_p = 0.95f; });
  auto inner = MakeRunner("full");
  HeadCountingRunner runner(inner.get());
  SpeculativeEngine engine(&runner, {}, {});
  const auto got = Run(engine, with_mate, inner.get());
  EXPECT_GT(runner.logits_passes, 0);
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(got[i], expected[i]) << i;
}

// A draft model's rounds take each row's draw when no sampler needs its q (the match rule)
// and none has top-k: the drafts equal those of the whole-rows path (need_q, which keeps q),
// for greedy, temperature-only and top-p samplers drafting together, and each sampled
// draft is the one its q draws.
TEST_F(SpecEngineTest, DraftRoundsWithoutQTakeEachRowsDraw) {
  std::vector<Sampler> samplers = {Sampler({0.0f, 0, 1.0f, 1}), Sampler({0.9f, 0, 1.0f, 2}),
                                   Sampler({0.7f, 0, 0.8f, 3}), Sampler({1.3f, 0, 0.95f, 4})};
  const std::vector<SpecRequest> prompts = Prompts(0.0f, 8);
  auto propose = [&](bool need_q, std::vector<Draft>* out) {
    auto drafter = MakeDrafter("draft30", "full");
    std::vector<DraftRequest> requests;
    for (size_t i = 0; i < samplers.size(); ++i) {
      const SpecRequest& p = prompts[i % prompts.size()];
      requests.push_back({static_cast<SeqId>(100 + i), p.prompt, 6, &samplers[i], "", need_q});
    }
    ASSERT_TRUE(drafter->Propose(requests, out).ok());
  };
  std::vector<Draft> drawn, rows;
  propose(false, &drawn);
  propose(true, &rows);
  ASSERT_EQ(drawn.size(), samplers.size());
  ASSERT_EQ(rows.size(), samplers.size());
  for (size_t i = 0; i < samplers.size(); ++i) {
    EXPECT_EQ(drawn[i].tokens.size(), 6u) << i;
    EXPECT_EQ(drawn[i].tokens, rows[i].tokens) << i;
    EXPECT_TRUE(drawn[i].q.empty()) << i;
  }
  // A sampled draft is what its q draws at its position (q kept by the rows path).
  const size_t vocab = rows[2].q.size() / rows[2].tokens.size();
  const size_t context = prompts[2].prompt.size();
  for (size_t j = 0; j < rows[2].tokens.size(); ++j) {
    const std::span<const float> q(rows[2].q.data() + j * vocab, vocab);
    EXPECT_EQ(samplers[2].SampleFrom(q, static_cast<int64_t>(context + j)), rows[2].tokens[j]);
  }
}

}  // namespace
}  // namespace specnode
