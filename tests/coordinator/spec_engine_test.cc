// The speculative engine on tiny models: greedy output identical to target-only decoding
// with every drafter, sampled output distributed as target-only sampling, stops, lengths,
// batching, prefill chunking and bad requests (same-seed determinism:
// spec_engine_determinism_test.cc; the heads a pass asks its target for:
// spec_engine_heads_test.cc; routing and shadow scoring: spec_engine_route_test.cc).
#include "coordinator/spec_engine.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "tests/coordinator/spec_controller_test_util.h"
#include "tests/coordinator/spec_engine_test_util.h"

namespace specnode {
namespace {

using spec_engine_test::NewController;
using spec_engine_test::SpecEngineTest;
using spec_engine_test::TargetOptions;
using spec_engine_test::TempPath;

TEST_F(SpecEngineTest, GreedyEqualsTargetOnlyWithEveryDrafter) {
  // mixed-tight: demotion and critical-token observation run throughout (issue 16, item 11:
  // greedy speculation equals plain greedy in mixed mode too).
  for (const std::string kv_mode : {"dense", "full", "mixed-tight"}) {
    auto base_runner = MakeRunner(kv_mode);
    SpeculativeEngine base(base_runner.get(), {}, {});
    const auto expected = Run(base, Prompts(0.0f, 40));
    for (const std::string name :
         {"draft5", "draft30", "draft100", "self1", "self2", "ngram", "suffix", "recycle"}) {
      for (bool adaptive : {false, true}) {
        auto runner = MakeRunner(kv_mode);
        auto drafter = MakeDrafter(name, kv_mode);
        auto controller = NewController();
        SpecEngineOptions options;
        options.adaptive = adaptive;
        options.fixed_k = 5;
        SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
        EXPECT_EQ(Run(engine, Prompts(0.0f, 40), runner.get()), expected)
            << name << " kv " << kv_mode << (adaptive ? " adaptive" : " fixed K");
      }
    }
  }
}

TEST_F(SpecEngineTest, CloseDraftIsMostlyAccepted) {
  auto runner = MakeRunner("dense");
  auto drafter = MakeDrafter("draft5", "dense");
  auto controller = NewController();
  SpecEngineOptions options;
  options.adaptive = false;
  options.fixed_k = 4;
  SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
  auto requests = Prompts(0.0f, 64);
  requests.resize(1);
  ASSERT_TRUE(engine.Start(requests[0]).ok());
  std::vector<SeqStepResult> results;
  while (true) {
    ASSERT_TRUE(engine.Step(std::vector<SeqId>{1}, &results).ok());
    if (results[0].finish != FinishReason::kNone) break;
  }
  const SpecSeqStats& st = engine.Stats(1);
  EXPECT_EQ(st.generated, 64);
  EXPECT_GT(st.drafted, 0);
  EXPECT_GT(static_cast<double>(st.accepted) / st.drafted, 0.7);
  EXPECT_LT(st.steps, 40);  // fewer target passes than tokens
}

// Sampled speculation must not change the output distribution. For each drafter, the
// third generated token's distribution over 2500 seeds is compared with target-only
// sampling's (two-sample chi-square over the 15 most frequent tokens + the rest; df = 15,
// critical value 37.7 at 0.1%).
TEST_F(SpecEngineTest, SampledMatchesTargetOnlyDistribution) {
  constexpr int kSamples = 2500;
  constexpr int kPosition = 2;
  auto sample_tokens = [&](Drafter* drafter, uint64_t seed_base, AcceptanceRule rule) {
    auto runner = MakeRunner("dense");
    auto controller = NewController();
    SpecEngineOptions options;
    options.adaptive = false;
    options.fixed_k = 3;
    options.acceptance = rule;
    std::vector<DraftGroup> groups;
    if (drafter != nullptr) groups.push_back({drafter, controller.get()});
    SpeculativeEngine engine(runner.get(), groups, options);
    std::map<int32_t, int64_t> counts;
    for (int i = 0; i < kSamples; ++i) {
      SpecRequest r;
      r.id = i;
      r.prompt = {1, 2, 3, 1, 2};
      r.sampling.temperature = 1.0f;
      r.sampling.top_k = 12;  // a support the chi-square can resolve
      r.sampling.seed = seed_base + i;
      r.max_new_tokens = kPosition + 1;
      r.ignore_stop = true;
      const auto out = Run(engine, {r});
      counts[out[0].at(kPosition)]++;
    }
    return counts;
  };
  const auto base = sample_tokens(nullptr, 1000000, AcceptanceRule::kMatch);
  std::vector<std::pair<int64_t, int32_t>> by_count;
  for (auto [t, c] : base) by_count.push_back({c, t});
  std::sort(by_count.rbegin(), by_count.rend());
  by_count.resize(std::min<size_t>(15, by_count.size()));
  for (const auto& [name, rule] :
       std::vector<std::pair<std::string, AcceptanceRule>>{{"draft30", AcceptanceRule::kRatio},
                                                           {"draft100", AcceptanceRule::kRatio},
                                                           {"ngram", AcceptanceRule::kRatio},
                                                           {"draft30", AcceptanceRule::kMatch},
                                                           {"ngram", AcceptanceRule::kMatch}}) {
    auto drafter = MakeDrafter(name, "dense");
    // Other seeds than the base's: under the match rule the same seeds would give the very
    // same tokens (SeededTextIsTheSame... below), which says nothing of the distribution.
    const auto spec = sample_tokens(drafter.get(), 0, rule);
    double chi2 = 0;
    int64_t base_rest = kSamples, spec_rest = kSamples;
    auto term = [](double a, double b) { return a + b > 0 ? (a - b) * (a - b) / (a + b) : 0.0; };
    for (auto [c, t] : by_count) {
      const int64_t s = spec.count(t) ? spec.at(t) : 0;
      chi2 += term(c, s);
      base_rest -= c;
      spec_rest -= s;
    }
    chi2 += term(base_rest, spec_rest);
    EXPECT_LT(chi2, 37.7) << name << " " << AcceptanceRuleName(rule);
  }
}

TEST_F(SpecEngineTest, BatchedSequencesEqualSeparateRuns) {
  auto runner = MakeRunner("full");
  auto drafter = MakeDrafter("draft30", "full");
  auto controller = NewController();
  SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, {});
  const auto together = Run(engine, Prompts(0.0f, 30), runner.get());
  for (size_t i = 0; i < 3; ++i) {
    auto one = Prompts(0.0f, 30);
    EXPECT_EQ(Run(engine, {one[i]}), std::vector<std::vector<int32_t>>{together[i]});
  }
}

TEST_F(SpecEngineTest, StopsAtStopTokenAndAtMaxTokens) {
  auto runner = MakeRunner("dense");
  SpeculativeEngine base(runner.get(), {}, {});
  const auto free_run = Run(base, Prompts(0.0f, 20));
  const int32_t stop = free_run[0][6];
  auto drafter = MakeDrafter("draft5", "dense");
  auto controller = NewController();
  SpecEngineOptions options;
  options.stop_tokens = {stop};
  options.adaptive = false;
  options.fixed_k = 6;
  SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
  auto requests = Prompts(0.0f, 20);
  requests[0].ignore_stop = false;
  const auto out = Run(engine, {requests[0]});
  const auto first_stop = std::find(free_run[0].begin(), free_run[0].end(), stop);
  EXPECT_EQ(out[0], std::vector<int32_t>(free_run[0].begin(), first_stop));
  for (int max_new : {1, 2, 5, 7}) {
    auto r = Prompts(0.0f, max_new);
    EXPECT_EQ(Run(engine, {r[1]})[0].size(), static_cast<size_t>(max_new));
  }
}

TEST_F(SpecEngineTest, ChunkedPrefillGivesTheSameTokens) {
  for (const std::string kv_mode : {"dense", "mixed-tight"}) {
    auto runner = MakeRunner(kv_mode);
    SpeculativeEngine whole(runner.get(), {}, {});
    const auto expected = Run(whole, Prompts(0.0f, 30));
    for (int budget : {3, 5}) {
      SpecEngineOptions options;
      options.prefill_budget = budget;  // prompts of 5..16 tokens take several steps
      SpeculativeEngine chunked(runner.get(), {}, options);
      EXPECT_EQ(Run(chunked, Prompts(0.0f, 30)), expected) << kv_mode << " budget " << budget;
    }
  }
}

TEST_F(SpecEngineTest, PrefixCacheSkipsTheSharedPrefillAndKeepsTheTokens) {
  // A second run of the same prompts on one target: each prompt's whole pages come from the
  // cache (Stats().cached_tokens: all whole pages but the one holding the last token), and
  // greedy output equals the cold run's — in full precision and in mixed mode (whose
  // demotion of the cached tokens then starts afresh; the tiny prompts stay in the window).
  for (const std::string kv_mode : {"full", "mixed"}) {
    auto runner = MakeRunner(kv_mode);
    SpecEngineOptions options;
    options.prefix_cache = true;
    options.prefill_budget = 5;  // chunked: the pages are published as the prefill goes
    SpeculativeEngine engine(runner.get(), {}, options);
    const auto cold = Run(engine, Prompts(0.0f, 12));
    std::vector<SpecRequest> again = Prompts(0.0f, 12);
    for (SpecRequest& r : again) r.id += 100;
    for (const SpecRequest& r : again) ASSERT_TRUE(engine.Start(r).ok());
    for (const SpecRequest& r : again) {
      const int32_t page = 8;  // KvOptions' default page_tokens
      EXPECT_EQ(engine.Stats(r.id).cached_tokens,
                (static_cast<int32_t>(r.prompt.size()) - 1) / page * page)
          << kv_mode << " prompt of " << r.prompt.size();
      engine.Finish(r.id);
    }
    EXPECT_EQ(Run(engine, again), cold) << kv_mode;
    // Off: nothing is shared.
    auto plain_runner = MakeRunner(kv_mode);
    SpeculativeEngine plain(plain_runner.get(), {}, {});
    EXPECT_EQ(Run(plain, Prompts(0.0f, 12)), cold);
    ASSERT_TRUE(plain.Start(again[2]).ok());
    EXPECT_EQ(plain.Stats(again[2].id).cached_tokens, 0);
  }
}

TEST_F(SpecEngineTest, RejectsBadRequests) {
  auto runner = MakeRunner("dense");
  SpeculativeEngine engine(runner.get(), {}, {});
  SpecRequest r = Prompts(0.0f, 4)[0];
  ASSERT_TRUE(engine.Start(r).ok());
  EXPECT_EQ(engine.Start(r).code(), absl::StatusCode::kInvalidArgument);  // duplicate id
  SpecRequest bad = r;
  bad.id = 50;
  bad.prompt = {};
  EXPECT_EQ(engine.Start(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.prompt = {1, 1 << 20};
  EXPECT_EQ(engine.Start(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.prompt = {1};
  bad.max_new_tokens = 0;
  EXPECT_EQ(engine.Start(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.max_new_tokens = 1 << 20;
  EXPECT_EQ(engine.Start(bad).code(), absl::StatusCode::kInvalidArgument);
  bad.max_new_tokens = 4;
  bad.sampling.top_p = 2.0f;
  EXPECT_EQ(engine.Start(bad).code(), absl::StatusCode::kInvalidArgument);
  std::vector<SeqStepResult> results;
  EXPECT_EQ(engine.Step(std::vector<SeqId>{77}, &results).code(),
            absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(engine.Step(std::vector<SeqId>{r.id, r.id}, &results).code(),
            absl::StatusCode::kInvalidArgument);
}

TEST_F(SpecEngineTest, DraftWithAnotherVocabularyIsRefused) {
  TinyModelOptions o = TargetOptions();
  o.n_merges = 40;  // a different vocabulary
  const std::string path = TempPath("othervocab");
  ASSERT_TRUE(WriteTinyModel(o, path).ok());
  auto d = ModelDrafter::Load(path, *target_, pool_.get(), {});
  std::filesystem::remove(path);
  ASSERT_FALSE(d.ok());
  EXPECT_EQ(d.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(d.status().message().find("vocabulary"), std::string::npos) << d.status();
  EXPECT_FALSE(ModelDrafter::SelfDraft(*target_, 3, pool_.get(), {}).ok());
  EXPECT_FALSE(ModelDrafter::SelfDraft(*target_, 0, pool_.get(), {}).ok());
}

// Sampling and acceptance spread over the pool give exactly the tokens of the serial loop
// (every sequence draws from its own stream).
TEST_F(SpecEngineTest, SamplingOnThePoolGivesTheSameTokens) {
  std::vector<std::vector<int32_t>> got[2];
  for (int with_pool = 0; with_pool < 2; ++with_pool) {
    auto runner = MakeRunner("full");
    auto drafter = MakeDrafter("draft30", "full");
    auto controller = NewController();
    SpecEngineOptions options;
    options.pool = with_pool ? pool_.get() : nullptr;
    // Fixed K: the adaptive K follows live timings (the match rule makes the text
    // independent of K anyway; this test is about the pool).
    options.adaptive = false;
    options.fixed_k = 4;
    SpeculativeEngine engine(runner.get(), {{drafter.get(), controller.get()}}, options);
    got[with_pool] = Run(engine, Prompts(0.8f, 24, 7), runner.get());
  }
  EXPECT_EQ(got[0], got[1]);
  EXPECT_EQ(got[0].size(), 3u);
  for (const auto& g : got[0]) EXPECT_EQ(g.size(), 24u);
}

// Delegates to a runner; fails the next EndForward when told to (after the pass ran, as a
// remote target whose shards refused the step would).
class FlakyRunner final : public ModelRunner {
 public:
  explicit FlakyRunner(ModelRunner* inner) : inner_(inner) {}
  int32_t vocab_size() const override { return inner_->vocab_size(); }
  int32_t max_positions() const override { return inner_->max_positions(); }
  absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) override {
    if (fail_next_) {
      fail_next_ = false;
      return absl::ResourceExhaustedError("scripted failure");
    }
    return inner_->Forward(batch, logits);
  }
  int32_t Length(SeqId seq) const override { return inner_->Length(seq); }
  absl::Status Truncate(SeqId seq, int32_t n) override { return inner_->Truncate(seq, n); }
  void Free(SeqId seq) override { inner_->Free(seq); }
  bool fail_next_ = false;

 private:
  ModelRunner* inner_;
};

TEST_F(SpecEngineTest, GroupsOnSeparateTargetsShareTheLoadAndGiveTheSameTokens) {
  auto base_runner = MakeRunner("full");
  SpeculativeEngine base(base_runner.get(), {}, {});
  std::vector<SpecRequest> requests = Prompts(0.0f, 24);
  for (SpecRequest r : Prompts(0.0f, 24)) {
    r.id += 10;
    requests.push_back(r);
  }
  const auto expected = Run(base, requests);

  // Two "cluster groups": each an n-gram drafter verified on its own target; and two
  // target-only groups (no drafter).
  for (bool speculate : {true, false}) {
    auto ta = MakeRunner("full");
    auto tb = MakeRunner("full");
    auto da = MakeDrafter("ngram", "full");
    auto db = MakeDrafter("ngram", "full");
    auto ca = NewController();
    auto cb = NewController();
    std::vector<DraftGroup> groups = {{da.get(), ca.get(), ta.get()},
                                      {db.get(), cb.get(), tb.get()}};
    if (!speculate) groups = {{nullptr, nullptr, ta.get()}, {nullptr, nullptr, tb.get()}};
    SpeculativeEngine engine(ta.get(), groups, {});
    for (const SpecRequest& r : requests) ASSERT_TRUE(engine.Start(r).ok());
    const std::vector<int> loads = engine.GroupLoads();
    EXPECT_EQ(loads[0] + loads[1], 6);
    EXPECT_GE(std::min(loads[0], loads[1]), 2) << "one group took (nearly) everything";
    // Every sequence's KV lives on its group's target only.
    std::vector<SeqStepResult> res;
    std::vector<SeqId> ids;
    for (const SpecRequest& r : requests) ids.push_back(r.id);
    ASSERT_TRUE(engine.Step(ids, &res).ok());
    for (SeqId id : ids) {
      ModelRunner* own = engine.Group(id) == 0 ? ta.get() : tb.get();
      ModelRunner* other = engine.Group(id) == 0 ? tb.get() : ta.get();
      EXPECT_GT(own->Length(id), 0) << id;
      EXPECT_EQ(other->Length(id), 0) << id;
    }
    for (SeqId id : ids) engine.Finish(id);
    EXPECT_EQ(ta->Length(1) + tb->Length(1), 0);
    EXPECT_EQ(Run(engine, requests), expected) << (speculate ? "n-gram groups" : "direct groups");
  }
}

TEST_F(SpecEngineTest, AFailedPassOnOneTargetRollsBackTheOthers) {
  auto ta = MakeRunner("full");
  auto tb_inner = MakeRunner("full");
  FlakyRunner tb(tb_inner.get());
  auto da = MakeDrafter("draft30", "full");
  auto db = MakeDrafter("draft30", "full");
  auto ca = NewController();
  auto cb = NewController();
  SpeculativeEngine engine(ta.get(), {{da.get(), ca.get(), ta.get()}, {db.get(), cb.get(), &tb}},
                           {});
  auto base_runner = MakeRunner("full");
  SpeculativeEngine base(base_runner.get(), {}, {});
  const auto requests = Prompts(0.0f, 16);
  const auto expected = Run(base, requests);

  for (const SpecRequest& r : requests) ASSERT_TRUE(engine.Start(r).ok());
  std::vector<SeqId> ids;
  for (const SpecRequest& r : requests) ids.push_back(r.id);
  std::map<SeqId, std::vector<int32_t>> generated;
  std::vector<SeqStepResult> res;
  int failures = 0;
  for (int step = 0; !ids.empty() && step < 200; ++step) {
    std::map<SeqId, int32_t> lengths;
    for (SeqId id : ids) lengths[id] = ta->Length(id) + tb.Length(id);
    tb.fail_next_ = step % 3 == 1;  // every third step fails on target B
    absl::Status st = engine.Step(ids, &res);
    if (!st.ok()) {
      ++failures;
      EXPECT_EQ(st.code(), absl::StatusCode::kResourceExhausted);
      // No sequence changed, on either target.
      for (SeqId id : ids) EXPECT_EQ(ta->Length(id) + tb.Length(id), lengths[id]) << id;
      continue;
    }
    std::vector<SeqId> next;
    for (const SeqStepResult& r : res) {
      generated[r.id].insert(generated[r.id].end(), r.tokens.begin(), r.tokens.end());
      if (r.finish == FinishReason::kNone) next.push_back(r.id);
    }
    ids = next;
  }
  EXPECT_GT(failures, 0);
  EXPECT_TRUE(ids.empty());
  for (size_t i = 0; i < requests.size(); ++i) EXPECT_EQ(generated[requests[i].id], expected[i]);
}

TEST(NgramDrafterTest, CopiesTheContinuationOfTheLatestMatch) {
  auto d = std::move(NgramDrafter::Create({})).value();
  // "... 5 6 7 8 9 | 1 2 5 6" -> suffix "5 6" matched at the start -> "7 8 9".
  const std::vector<int32_t> ctx = {5, 6, 7, 8, 9, 1, 2, 5, 6};
  EXPECT_EQ(d->Lookup(ctx, 3), (std::vector<int32_t>{7, 8, 9}));
  EXPECT_EQ(d->Lookup(ctx, 10), (std::vector<int32_t>{7, 8, 9, 1, 2, 5, 6}));
  // The most recent occurrence wins: "1 2" occurs twice.
  const std::vector<int32_t> twice = {1, 2, 3, 1, 2, 4, 0, 1, 2};
  EXPECT_EQ(d->Lookup(twice, 2), (std::vector<int32_t>{4, 0}));
  // No repeated bigram: nothing (min_n 2).
  EXPECT_TRUE(d->Lookup(std::vector<int32_t>{1, 2, 3, 4}, 3).empty());
  EXPECT_FALSE(NgramDrafter::Create({.max_n = 2, .min_n = 3}).ok());
}

// Finished sequences of a domain feed that domain's history; a context with no match of its
// own drafts from it (at most history_max_draft tokens, newest occurrence, no crossing into
// the next stored context), and other domains do not see it.
TEST(NgramDrafterTest, DraftsFromTheDomainHistoryWhenTheContextHasNoMatch) {
  NgramDrafterOptions o;
  o.history_max_draft = 2;
  auto d = std::move(NgramDrafter::Create(o)).value();
  Sampler sampler(SamplingParams{});
  auto propose = [&](SeqId seq, std::vector<int32_t> ctx, std::string_view domain, int k) {
    std::vector<DraftRequest> req = {{seq, ctx, k, &sampler, domain}};
    std::vector<Draft> out;
    EXPECT_TRUE(d->Propose(req, &out).ok());
    return out[0].tokens;
  };
  EXPECT_TRUE(propose(1, {10, 11, 12, 13, 14, 15}, "code", 4).empty());  // nothing yet
  d->Free(1);                              // seq 1's context (10..15) joins the "code" history
  EXPECT_EQ(d->HistoryTokens("code"), 8);  // separators on both sides
  EXPECT_EQ(propose(2, {7, 11, 12, 13}, "code", 4), (std::vector<int32_t>{14, 15}));
  EXPECT_EQ(propose(3, {7, 11, 12, 13}, "code", 1), (std::vector<int32_t>{14}));
  EXPECT_TRUE(propose(4, {7, 11, 12, 13}, "chat", 4).empty());
  EXPECT_TRUE(propose(5, {7, 8, 12, 13}, "code", 4).empty());   // 2-gram: below history_min_n
  EXPECT_TRUE(propose(6, {9, 13, 14, 15}, "code", 4).empty());  // the context's end: nothing
  // The own context wins over the history.
  EXPECT_EQ(propose(7, {11, 12, 13, 50, 11, 12, 13}, "code", 4),
            (std::vector<int32_t>{50, 11, 12, 13}));
  // A newer context with the same 3-gram takes over.
  d->Free(2);
  EXPECT_TRUE(propose(8, {20, 11, 12, 13, 99, 98}, "code", 4).empty());
  d->Free(8);
  EXPECT_EQ(propose(9, {0, 11, 12, 13}, "code", 4), (std::vector<int32_t>{99, 98}));
  // Bounded: a small history keeps the newest contexts only.
  o.history_tokens = 16;
  auto small = std::move(NgramDrafter::Create(o)).value();
  for (SeqId s = 0; s < 10; ++s) {
    std::vector<int32_t> ctx = {static_cast<int32_t>(100 + s), 1, 2, 3, static_cast<int32_t>(s)};
    std::vector<DraftRequest> req = {{s, ctx, 2, &sampler, "x"}};
    std::vector<Draft> out;
    ASSERT_TRUE(small->Propose(req, &out).ok());
    small->Free(s);
    EXPECT_LE(small->HistoryTokens("x"), 16);
  }
  EXPECT_EQ(small->LookupHistory("x", std::vector<int32_t>{1, 2, 3}, 2), (std::vector<int32_t>{9}));
  o.history_min_n = 1;
  EXPECT_FALSE(NgramDrafter::Create(o).ok());
}

}  // namespace
}  // namespace specnode
