// The tuner's algorithm (node/tuner.h) against a scripted measurer: which options it tries,
// in which order, how it pairs and alternates measurements, what it keeps and why, and the
// tuned YAML it writes.
#include "node/tune/tuner.h"

#include <map>
#include <string>
#include <vector>

#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;

// Tokens/s and KV bytes per configuration: a base value times a factor per setting.
class ScriptedMeasurer final : public TuneMeasurer {
 public:
  std::map<std::string, double> speed;      // setting ("draft=ngram", "kv=mixed", ...) -> factor
  std::map<std::string, double> memory;     // setting -> factor on KV bytes
  std::map<std::string, double> agreement;  // setting -> top-1 agreement
  std::vector<std::string> calls;           // TuneKey of every Measure, in order
  std::vector<std::string> agreement_calls;
  std::vector<double> jitter;  // factor of the i-th measurement (1 beyond the list)

  absl::StatusOr<TuneMeasurement> Measure(const ServeConfig& c) override {
    calls.push_back(TuneKey(c));
    TuneMeasurement m;
    const size_t i = calls.size() - 1;
    m.tokens_per_s = 100 * (i < jitter.size() ? jitter[i] : 1.0);
    m.kv_bytes_per_token = 1000;
    for (const std::string& s : Settings(c)) {
      if (speed.count(s)) m.tokens_per_s *= speed[s];
      if (memory.count(s)) m.kv_bytes_per_token *= memory[s];
    }
    m.outputs = {{1, 2, 3}, {4, 5}};
    return m;
  }
  absl::StatusOr<double> Agreement(const ServeConfig& c,
                                   const std::vector<std::vector<int32_t>>& reference) override {
    agreement_calls.push_back(TuneKey(c));
    EXPECT_EQ(reference.size(), 2u);  // the baseline's outputs
    double a = 1.0;
    for (const std::string& s : Settings(c)) {
      if (agreement.count(s)) a = std::min(a, agreement[s]);
    }
    return a;
  }

 private:
  static std::vector<std::string> Settings(const ServeConfig& c) {
    std::string alternatives;
    for (const DraftSpec& d : c.alternatives)
      alternatives += (alternatives.empty() ? "" : ",") + d.text();
    return {"draft=" + c.draft.text(), "alternatives=" + alternatives,
            "k_max=" + std::to_string(c.k_max), "kv=" + std::string(KvModeName(c.kv.mode)),
            std::string("activations=") + (c.activations == ActQuant::kInt8 ? "int8" : "int16")};
  }
};

ServeConfig Base() {
  ServeConfig c;  // defaults: draft ngram, k_max 4, kv mixed, int16, cpu
  c.model = "/models/m.gguf";
  return c;
}

TEST(TuneStackTest, DefaultStackOnCpuAndGpu) {
  ServeConfig base = Base();
  std::vector<std::string> names;
  for (const TuneOption& o : DefaultTuneStack(base, 30)) names.push_back(o.name());
  EXPECT_THAT(names, ::testing::ElementsAre("speculation.draft=ngram", "speculation.draft=self:20",
                                            "speculation.alternatives=ngram", "speculation.k_max=8",
                                            "speculation.disable_threshold=0.2",
                                            "model.activations=int8", "kv.mode=mixed"));
  base.device = Device::Cuda(0);           // the GPU runner: f16 KV, int16 activations
  base.k_max = 8;                     // nothing larger to try
  base.draft = ParseDraftSpec("/models/draft.gguf").value();  // the user's own drafter is tried first
  names.clear();
  for (const TuneOption& o : DefaultTuneStack(base, 30)) names.push_back(o.name());
  EXPECT_THAT(names, ::testing::ElementsAre(
                         "speculation.draft=/models/draft.gguf", "speculation.draft=ngram",
                         "speculation.draft=self:20", "speculation.alternatives=ngram",
                         "speculation.disable_threshold=0.2", "speculation.tree_nodes=8"));
  // A tiny model gets no self-draft.
  EXPECT_EQ(DefaultTuneStack(Base(), 2).size(), 6u);
}

TEST(TuneStackTest, BaselineSwitchesEveryOptionOff) {
  ServeConfig base = Base();
  base.activations = ActQuant::kInt8;
  const ServeConfig b = TuneBaseline(base);
  EXPECT_EQ(b.draft.text(), "none");
  EXPECT_EQ(b.kv.mode, KvMode::kFull);
  EXPECT_EQ(b.activations, ActQuant::kInt16);
  EXPECT_EQ(b.k_max, base.k_max);
  EXPECT_EQ(b.tree_nodes, 0);
  EXPECT_EQ(b.model, base.model);
  EXPECT_EQ(TuneKey(b), "draft=none k_max=4 disable=0.4 kv=full activations=int16");
}

TEST(TuneStackTest, ApplyRejectsUnknownKeysAndBadValues) {
  ServeConfig c = Base();
  EXPECT_FALSE(ApplyTuneOption({"serve.bind", "x"}, &c).ok());
  EXPECT_FALSE(ApplyTuneOption({"speculation.k_max", "0"}, &c).ok());
  EXPECT_FALSE(ApplyTuneOption({"speculation.tree_nodes", "65"}, &c).ok());
  EXPECT_FALSE(ApplyTuneOption({"speculation.tree_nodes", "some"}, &c).ok());
  ASSERT_TRUE(ApplyTuneOption({"speculation.tree_nodes", "8"}, &c).ok());
  EXPECT_EQ(c.tree_nodes, 8);
  EXPECT_THAT(TuneKey(c), HasSubstr(" trees=8 "));
  EXPECT_FALSE(ApplyTuneOption({"speculation.k_max", "many"}, &c).ok());
  EXPECT_FALSE(ApplyTuneOption({"model.activations", "int4"}, &c).ok());
  EXPECT_FALSE(ApplyTuneOption({"kv.mode", "fp8"}, &c).ok());
  EXPECT_FALSE(ApplyTuneOption({"speculation.draft", ""}, &c).ok());
  EXPECT_FALSE(ApplyTuneOption({"speculation.disable_threshold", "0.9"}, &c).ok());  // > free
  EXPECT_FALSE(ApplyTuneOption({"speculation.disable_threshold", "-1"}, &c).ok());
  ASSERT_TRUE(ApplyTuneOption({"kv.mode", "int4"}, &c).ok());
  EXPECT_EQ(c.kv.mode, KvMode::kInt4);
}

TEST(TuneDecisionTest, LatencyMemoryAndAccuracyRules) {
  const TuneCriteria c;  // 3% gain, 0.97 agreement
  const TuneOption fast{"speculation.draft", "ngram", TuneOption::Goal::kLatency, false};
  const TuneOption kv{"kv.mode", "mixed", TuneOption::Goal::kMemory, true};
  EXPECT_TRUE(DecideTuneStep(fast, 1.05, 1.0, 1.0, c).keep);
  EXPECT_FALSE(DecideTuneStep(fast, 1.02, 1.0, 1.0, c).keep);  // within the noise margin
  TuneDecision d = DecideTuneStep(fast, 1.5, 1.0, 0.96, c);    // fast but inaccurate
  EXPECT_FALSE(d.keep);
  EXPECT_THAT(d.reason, HasSubstr("below the budget"));
  EXPECT_TRUE(DecideTuneStep(kv, 0.99, 0.7, 0.99, c).keep);   // saves memory, about as fast
  EXPECT_FALSE(DecideTuneStep(kv, 0.90, 0.7, 0.99, c).keep);  // saves memory, too slow
  EXPECT_FALSE(DecideTuneStep(kv, 1.2, 0.99, 0.99, c).keep);  // faster but saves no memory
  EXPECT_FALSE(DecideTuneStep(kv, 1.0, 0.0, 1.0, c).keep);    // bytes unknown
}

TEST(TuneRunTest, KeepsWhatPaysAndRecordsWhy) {
  ScriptedMeasurer m;
  m.speed = {{"draft=ngram", 1.3},
             {"draft=self:20", 0.6},
             {"k_max=8", 1.1},
             {"activations=int8", 1.2},
             {"kv=mixed", 0.99}};
  m.memory = {{"kv=mixed", 0.7}};
  m.agreement = {{"activations=int8", 0.95}, {"kv=mixed", 0.98}};
  const ServeConfig base = Base();
  TuneCriteria criteria;
  criteria.rounds = 2;
  std::vector<std::string> log;
  absl::StatusOr<TuneResult> r = TuneStack(base, DefaultTuneStack(base, 30), m, criteria,
                                           [&](const std::string& l) { log.push_back(l); });
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> kept;
  for (const TuneOption& k : r->kept) kept.push_back(k.name());
  EXPECT_THAT(kept, ::testing::ElementsAre("speculation.draft=ngram", "speculation.k_max=8",
                                           "kv.mode=mixed"));
  ASSERT_EQ(r->steps.size(), 7u);
  EXPECT_NEAR(r->steps[0].speedup, 1.3, 1e-9);
  EXPECT_FALSE(r->steps[1].decision.keep);  // the self-draft loses against n-gram
  EXPECT_NEAR(r->steps[1].speedup, 0.6 / 1.3, 1e-9);
  // Prompt lookup beside prompt lookup is the current setting.
  EXPECT_EQ(r->steps[2].skipped, "already the current setting");
  EXPECT_FALSE(r->steps[4].decision.keep);  // disable_threshold: no gain scripted
  EXPECT_THAT(r->steps[5].decision.reason, HasSubstr("below the budget"));  // int8: 0.95
  EXPECT_NEAR(r->steps[6].memory_ratio, 0.7, 1e-9);
  EXPECT_EQ(TuneKey(r->tuned), "draft=ngram k_max=8 disable=0.4 kv=mixed activations=int16");
  EXPECT_NEAR(r->tuned_accuracy, 0.98, 1e-9);
  // Agreement is measured only for options that can change the output, each on top of the
  // options kept before it.
  EXPECT_THAT(m.agreement_calls,
              ::testing::ElementsAre("draft=ngram k_max=8 disable=0.4 kv=full activations=int8",
                                     "draft=ngram k_max=8 disable=0.4 kv=mixed activations=int16"));
  // 1 baseline + 2 A/A noise rounds x 2 + 6 options x 2 rounds x 2 configurations; rounds
  // alternate the order.
  ASSERT_EQ(m.calls.size(), 29u);
  for (int i = 0; i < 5; ++i) {
    EXPECT_EQ(m.calls[i], "draft=none k_max=4 disable=0.4 kv=full activations=int16");
  }
  EXPECT_EQ(r->noise, 0.0);
  EXPECT_EQ(r->min_gain, criteria.min_gain);
  EXPECT_EQ(m.calls[5], m.calls[0]);  // round 1: current first
  EXPECT_EQ(m.calls[6], "draft=ngram k_max=4 disable=0.4 kv=full activations=int16");
  EXPECT_EQ(m.calls[7], m.calls[6]);  // round 2: candidate first
  EXPECT_EQ(m.calls[8], m.calls[0]);
  EXPECT_FALSE(log.empty());
}

TEST(TuneRunTest, NothingKeptGivesTheBaselineAndKMaxNeedsADrafter) {
  ScriptedMeasurer m;
  m.speed = {{"draft=ngram", 0.9}, {"draft=self:20", 0.5}, {"activations=int8", 1.01}};
  m.memory = {{"kv=mixed", 0.99}};
  const ServeConfig base = Base();
  TuneCriteria criteria;
  criteria.rounds = 1;
  absl::StatusOr<TuneResult> r = TuneStack(base, DefaultTuneStack(base, 30), m, criteria, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE(r->kept.empty());
  EXPECT_EQ(TuneKey(r->tuned), TuneKey(TuneBaseline(base)));
  for (int i : {2, 3, 4}) {  // alternatives, k_max and disable_threshold need a drafter
    EXPECT_FALSE(r->steps[i].tried);
    EXPECT_EQ(r->steps[i].skipped, "no drafter kept");
  }
}

// A draft model kept, prompt lookup beside it (the router choosing per domain) is tried on
// top and kept where it pays; the tuned YAML lists it and parses back.
TEST(TuneRunTest, KeepsPromptLookupBesideADraftModel) {
  ScriptedMeasurer m;
  m.speed = {{"draft=/models/draft.gguf", 1.2},
             {"draft=ngram", 1.1},
             {"draft=self:20", 0.7},
             {"alternatives=ngram", 1.1}};
  ServeConfig base = Base();
  base.draft = ParseDraftSpec("/models/draft.gguf").value();
  TuneCriteria criteria;
  criteria.rounds = 1;
  absl::StatusOr<TuneResult> r = TuneStack(base, DefaultTuneStack(base, 30), m, criteria, {});
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<std::string> kept;
  for (const TuneOption& k : r->kept) kept.push_back(k.name());
  EXPECT_THAT(kept, ::testing::ElementsAre("speculation.draft=/models/draft.gguf",
                                           "speculation.alternatives=ngram"));
  EXPECT_THAT(TuneKey(r->tuned), HasSubstr("draft=/models/draft.gguf+ngram "));
  absl::StatusOr<std::string> yaml = TunedYaml("speculation:\n  draft: ngram\n", r->kept, "", "");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(*yaml, HasSubstr("alternatives: [ngram]"));
  const ServeConfig back = ParseServeConfig(*yaml, "tuned").value();
  ASSERT_EQ(back.alternatives.size(), 1u);
  EXPECT_EQ(back.alternatives[0].text(), "ngram");
  // Off, the list is empty (and still parses).
  yaml = TunedYaml("speculation:\n  draft: ngram\n", {}, "", "");
  ASSERT_TRUE(yaml.ok()) << yaml.status();
  EXPECT_THAT(*yaml, HasSubstr("alternatives: []"));
}

// On a noisy machine the gain asked grows to the noise of the baseline against itself.
TEST(TuneRunTest, GainsWithinTheMachinesNoiseAreNotKept) {
  ScriptedMeasurer m;
  m.speed = {{"draft=ngram", 1.06}, {"draft=self:20", 1.2}};
  m.jitter = {1.0, 1.0, 1.08};  // the A/A comparison (calls 1 and 2) shows 8%
  TuneCriteria criteria;
  criteria.rounds = 1;
  absl::StatusOr<TuneResult> r = TuneStack(Base(), DefaultTuneStack(Base(), 30), m, criteria, {});
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_NEAR(r->noise, 0.08, 1e-9);
  EXPECT_NEAR(r->min_gain, 0.08, 1e-9);
  ASSERT_GE(r->steps.size(), 2u);
  EXPECT_FALSE(r->steps[0].decision.keep) << r->steps[0].decision.reason;  // ngram: 1.06
  EXPECT_THAT(r->steps[0].decision.reason, HasSubstr("1.08x asked"));
  EXPECT_TRUE(r->steps[1].decision.keep) << r->steps[1].decision.reason;  // self: 1.2
}

TEST(TuneRunTest, BadCriteriaAreInvalidArgument) {
  ScriptedMeasurer m;
  TuneCriteria c;
  c.rounds = 0;
  EXPECT_EQ(TuneStack(Base(), {}, m, c, {}).status().code(), absl::StatusCode::kInvalidArgument);
  c = TuneCriteria();
  c.accuracy = 1.5;
  EXPECT_EQ(TuneStack(Base(), {}, m, c, {}).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(m.calls.empty());
}

TEST(TunedYamlTest, SetsTheKeptKeysKeepsTheRestAndParses) {
  const std::string base = kEmbeddedLocalCpuConfig;
  const std::vector<TuneOption> kept = {{"speculation.draft", "ngram"},
                                        {"speculation.k_max", "8"},
                                        {"speculation.disable_threshold", "0.2"},
                                        {"kv.mode", "mixed"}};
  absl::StatusOr<std::string> y = TunedYaml(base, kept, "/models/m.gguf", "kept: a\nrejected: b");
  ASSERT_TRUE(y.ok()) << y.status();
  EXPECT_THAT(*y, ::testing::StartsWith("# kept: a\n# rejected: b\n"));
  absl::StatusOr<ServeConfig> c = ParseServeConfig(*y, "tuned");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->draft.text(), "ngram");
  EXPECT_EQ(c->k_max, 8);
  EXPECT_DOUBLE_EQ(c->disable_threshold, 0.2);
  EXPECT_EQ(c->kv.mode, KvMode::kMixed);
  EXPECT_EQ(c->activations, ActQuant::kInt16);  // not kept: written explicitly off
  EXPECT_EQ(c->model, "/models/m.gguf");
  absl::StatusOr<ServeConfig> original = ParseServeConfig(base, "base");
  ASSERT_TRUE(original.ok());
  EXPECT_EQ(c->max_active, original->max_active);  // untouched keys survive
  EXPECT_EQ(c->sla.classes.size(), original->sla.classes.size());
  // Nothing kept: every stack key explicitly off.
  y = TunedYaml(base, {}, "", "");
  ASSERT_TRUE(y.ok()) << y.status();
  c = ParseServeConfig(*y, "tuned");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->draft.text(), "none");
  EXPECT_EQ(c->kv.mode, KvMode::kFull);
  EXPECT_EQ(c->model, original->model);
  EXPECT_FALSE(TunedYaml("[1, 2", {}, "", "").ok());
  EXPECT_FALSE(TunedYaml("- a list", {}, "", "").ok());
}

}  // namespace
}  // namespace specnode
