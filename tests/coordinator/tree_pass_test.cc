// Draft-tree passes through the real forward and every CPU KV mode: a tree row's logits are
// bit for bit those of its path decoded alone as a chain, KeepRows leaves the cache as if
// only the kept path had been decoded (the next steps' logits agree bit for bit, demotions
// in mixed mode included), and what cannot take a tree says so.
#include <gtest/gtest.h>

#include <filesystem>
#include <vector>

#include "coordinator/draft_tree.h"
#include "coordinator/model_drafter.h"
#include "coordinator/recycling_drafter.h"
#include "coordinator/suffix_drafter.h"
#include "model/llama/kv_cache.h"
#include "tests/coordinator/spec_engine_test_util.h"

namespace specnode::spec_engine_test {
namespace {

using Tokens = std::vector<int32_t>;

// A tree under root token 50: 0:[60] 1:[61 under 0] 2:[62 under 1] 3:[70 under 0]
// 4:[71 under 3] 5:[80] (another child of the root) 6:[81 under 5] — rows are the root
// then the nodes (TreePassRows' layout): row parents {-1, 0, 1, 2, 1, 4, 0, 6}.
const Tokens kRows = {50, 60, 61, 62, 70, 71, 80, 81};
const Tokens kRowParents = {-1, 0, 1, 2, 1, 4, 0, 6};

// The rows from the root to `row`, in order.
Tokens PathTo(int32_t row) {
  Tokens path;
  TreeRowPath(kRowParents, row, &path);
  return path;
}

Tokens TokensOf(const Tokens& rows) {
  Tokens out;
  for (int32_t r : rows) out.push_back(kRows[r]);
  return out;
}

class TreePassTest : public SpecEngineTest {
 protected:
  // A runner of `model` (the suite's target when null) over a cache in kv_mode.
  std::unique_ptr<LocalModelRunner> Runner(const std::string& kv_mode,
                                           const LlamaModel* model = nullptr) {
    if (model == nullptr) return MakeRunner(kv_mode);
    auto cache = MakeKvCache(model->config(), model->weights().kv_heads_held(), KvFor(kv_mode));
    EXPECT_TRUE(cache.ok()) << cache.status();
    return std::make_unique<LocalModelRunner>(model->config(), model->weights(), pool_.get(),
                                              std::move(cache).value());
  }

  // Logits rows of a pass of `tokens` (all rows) after `prompt`, on a fresh runner.
  std::vector<float> ChainLogits(const std::string& kv_mode, const Tokens& prompt,
                                 const Tokens& tokens, const LlamaModel* model = nullptr) {
    auto runner = Runner(kv_mode, model);
    std::vector<float> logits;
    const BatchEntry pre{1, prompt, false};
    EXPECT_TRUE(runner->Forward({&pre, 1}, &logits).ok());
    const BatchEntry chain{1, tokens, true};
    EXPECT_TRUE(runner->Forward({&chain, 1}, &logits).ok());
    return logits;
  }

  // The checks below on `model` (null: the suite's target) in every CPU KV mode.
  void CheckRowsAndKeptPath(const LlamaModel* model);
};

TEST_F(TreePassTest, EveryRowGetsItsPathsLogitsAndKeepRowsLeavesThatPath) {
  CheckRowsAndKeptPath(nullptr);
}

TEST_F(TreePassTest, SlidingWindowsCountFromTheRowsDepth) {
  // A window of 6 is shorter than the prompt plus the tree's depth: a row's window must
  // start 5 positions before its depth's position, not its slot's.
  TinyModelOptions o = TargetOptions();
  o.sliding_window = 6;
  const std::string path = TempPath("windowed");
  ASSERT_TRUE(WriteTinyModel(o, path).ok());
  auto model = LlamaModel::Load(path);
  std::filesystem::remove(path);
  ASSERT_TRUE(model.ok()) << model.status();
  CheckRowsAndKeptPath(model->get());
}

void TreePassTest::CheckRowsAndKeptPath(const LlamaModel* model) {
  const Tokens prompt = {200, 17, 17, 300, 42, 99, 120, 121, 122, 123, 124};
  const int32_t vocab = target_->config().vocab_size;
  for (const std::string kv_mode : {"dense", "full", "int8", "int4", "mixed-tight"}) {
    auto runner = Runner(kv_mode, model);
    ASSERT_TRUE(runner->TreePasses()) << kv_mode;
    std::vector<float> tree_logits, logits;
    const BatchEntry pre{1, prompt, false};
    ASSERT_TRUE(runner->Forward({&pre, 1}, &logits).ok());
    const int32_t pos0 = runner->Length(1);
    BatchEntry tree{1, kRows, true};
    tree.parents = kRowParents;
    ASSERT_TRUE(runner->Forward({&tree, 1}, &tree_logits).ok()) << kv_mode;
    ASSERT_EQ(tree_logits.size(), kRows.size() * vocab);
    for (int32_t r = 0; r < static_cast<int32_t>(kRows.size()); ++r) {
      const Tokens path = PathTo(r);
      const std::vector<float> chain = ChainLogits(kv_mode, prompt, TokensOf(path), model);
      const std::vector<float> last(chain.end() - vocab, chain.end());
      const std::vector<float> row(tree_logits.begin() + r * vocab,
                                   tree_logits.begin() + (r + 1) * vocab);
      EXPECT_EQ(row, last) << kv_mode << ": row " << r << " differs from its path alone";
    }
    // Keep the branch 50 60 70 71 (rows 0 1 4 5), then decode on: the same numbers as a
    // runner that only ever saw that path, step after step (mixed-tight demotes within).
    const Tokens kept = PathTo(5);
    ASSERT_TRUE(runner->KeepRows(1, pos0, kept).ok()) << kv_mode;
    EXPECT_EQ(runner->Length(1), pos0 + static_cast<int32_t>(kept.size()));
    auto alone = Runner(kv_mode, model);
    ASSERT_TRUE(alone->Forward({&pre, 1}, &logits).ok());
    const Tokens path_tokens = TokensOf(kept);
    const BatchEntry walk{1, path_tokens, false};
    ASSERT_TRUE(alone->Forward({&walk, 1}, &logits).ok());
    for (int step = 0; step < 24; ++step) {
      const Tokens next = {300 + (7 * step) % 20};
      const BatchEntry e{1, next, false};
      std::vector<float> a, b;
      ASSERT_TRUE(runner->Forward({&e, 1}, &a).ok());
      ASSERT_TRUE(alone->Forward({&e, 1}, &b).ok());
      ASSERT_EQ(a, b) << kv_mode << ": step " << step << " after KeepRows";
    }
  }
}

TEST_F(TreePassTest, TreesAreBatchedWithChainsAndRollBackOnError) {
  const Tokens prompt = {1, 2, 3, 4, 5, 6, 7, 8};
  auto runner = MakeRunner("full");
  std::vector<float> logits;
  const BatchEntry pre1{1, prompt, false};
  const BatchEntry pre2{2, prompt, false};
  ASSERT_TRUE(runner->Forward({&pre1, 1}, &logits).ok());
  ASSERT_TRUE(runner->Forward({&pre2, 1}, &logits).ok());
  // A tree and a chain in one pass: the chain's rows are what it gets alone.
  const Tokens chain_tokens = {9, 10, 11};
  BatchEntry batch[2] = {{1, kRows, true}, {2, chain_tokens, true}};
  batch[0].parents = kRowParents;
  ASSERT_TRUE(runner->Forward(batch, &logits).ok());
  const int32_t vocab = target_->config().vocab_size;
  const std::vector<float> chain_rows(logits.end() - 3 * vocab, logits.end());
  EXPECT_EQ(chain_rows, ChainLogits("full", prompt, chain_tokens));
  // Bad parents are refused before anything runs.
  const int32_t before = runner->Length(1);
  BatchEntry bad{1, kRows, true};
  const Tokens forward_parent = {-1, 0, 1, 3, 1, 4, 0, 6};  // row 3 names itself
  bad.parents = forward_parent;
  EXPECT_EQ(runner->Forward({&bad, 1}, &logits).code(), absl::StatusCode::kInvalidArgument);
  const Tokens short_parents = {-1, 0};
  bad.parents = short_parents;
  EXPECT_EQ(runner->Forward({&bad, 1}, &logits).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->Length(1), before);
  // KeepRows checks its rows: ascending, rows[j] >= j, inside the pass.
  const int32_t pos0 = before - static_cast<int32_t>(kRows.size());
  EXPECT_EQ(runner->KeepRows(1, pos0, Tokens{0, 0}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->KeepRows(1, pos0, Tokens{2, 1}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_EQ(runner->KeepRows(1, pos0, Tokens{0, 99}).code(), absl::StatusCode::kInvalidArgument);
  EXPECT_TRUE(runner->KeepRows(1, pos0, Tokens{0, 6, 7}).ok());
  EXPECT_EQ(runner->Length(1), pos0 + 3);
}

// A draft model asked for a tree drafts the same chain and adds each position's runners-up
// as leaf siblings, shallowest first, within the node budget: a valid tree, chain first.
TEST_F(TreePassTest, ModelDraftTreesAreTheChainWithItsRunnersUpAsLeaves) {
  auto chain_drafter = MakeDrafter("draft30", "full");
  auto tree_drafter = MakeDrafter("draft30", "full");
  Sampler greedy(SamplingParams{});
  const std::vector<int32_t> context = {72, 101, 108, 108, 111, 32};
  DraftRequest chain{1, context, 3, &greedy, "d", false, 0};
  std::vector<Draft> c, t;
  ASSERT_TRUE(chain_drafter->Propose({&chain, 1}, &c).ok());
  ASSERT_EQ(c[0].tokens.size(), 3u);
  for (int budget : {8, 5, 3}) {
    DraftRequest tree{2, context, 3, &greedy, "d", false, budget};
    ASSERT_TRUE(tree_drafter->Propose({&tree, 1}, &t).ok());
    const Draft& d = t[0];
    ASSERT_LE(d.tokens.size(), static_cast<size_t>(budget));
    EXPECT_EQ(std::vector<int32_t>(d.tokens.begin(), d.tokens.begin() + 3), c[0].tokens);
    if (budget == 3) {
      EXPECT_TRUE(d.parents.empty());  // no room beyond the chain: a chain
      continue;
    }
    ASSERT_EQ(d.parents.size(), d.tokens.size());
    EXPECT_TRUE(ValidateTree(d.tokens, d.parents).ok());
    EXPECT_EQ(ChainLength(d.parents), 3);
    // Leaves, shallowest first: the first position's runners-up (kTreeBranch - 1 of them) hang
    // off the context, then the second's off node 0.
    for (size_t i = 3; i < d.tokens.size(); ++i) {
      const int32_t want = i < 3 + ModelDrafter::kTreeBranch - 1 ? -1 : 0;
      EXPECT_EQ(d.parents[i], want) << "node " << i << " of a budget of " << budget;
    }
  }
}

// A drafter that counts the trees (drafts that are not chains) it passes on.
class TreeCounter final : public Drafter {
 public:
  explicit TreeCounter(std::unique_ptr<Drafter> inner) : inner_(std::move(inner)) {}
  std::string name() const override { return inner_->name(); }
  absl::Status Propose(std::span<const DraftRequest> requests,
                       std::vector<Draft>* drafts) override {
    absl::Status st = inner_->Propose(requests, drafts);
    for (const Draft& d : *drafts) {
      trees += !d.parents.empty() && ChainLength(d.parents) < static_cast<int>(d.parents.size());
    }
    return st;
  }
  bool CheapToShadow() const override { return inner_->CheapToShadow(); }
  int ObservedTopK() const override { return inner_->ObservedTopK(); }
  void ObserveTarget(std::span<const int32_t> tokens, std::span<const int32_t> ids,
                     int k) override {
    inner_->ObserveTarget(tokens, ids, k);
  }
  void Free(SeqId seq) override { inner_->Free(seq); }
  int trees = 0;

 private:
  std::unique_ptr<Drafter> inner_;
};

// The engine verifying suffix-drafter, token-recycling and draft-model trees (the model's
// runners-up as leaf siblings): greedy text equals
// target-only decoding in every CPU KV mode, seeded sampled text is the same with trees,
// chains or no speculation, alone and batched — and trees were verified (the check is not
// blind).
TEST_F(TreePassTest, EngineTreesGiveTargetOnlyText) {
  SuffixDrafterOptions o;
  o.min_n = 1;
  o.branch = 3;
  o.min_share = 0.0;
  auto make_drafter = [&](const std::string& name,
                          const std::string& kv_mode) -> std::unique_ptr<Drafter> {
    if (name == "recycle") return std::move(RecyclingDrafter::Create({})).value();
    if (name == "suffix") return std::move(SuffixDrafter::Create(o)).value();
    return MakeDrafter(name, kv_mode);  // a draft model: its runners-up as leaf siblings
  };
  for (float temperature : {0.0f, 0.8f}) {
    auto requests = Prompts(temperature, 40, 5);
    for (SpecRequest& r : requests) r.sampling.top_k = 40;
    for (const std::string kv_mode : {"dense", "full", "int4", "mixed-tight"}) {
      auto base_runner = MakeRunner(kv_mode);
      SpeculativeEngine base(base_runner.get(), {}, {});
      const auto expected = Run(base, requests);
      for (int k : {0, 3}) {  // 0: adaptive
        for (const std::string name : {"suffix", "recycle", "draft30"}) {
          auto runner = MakeRunner(kv_mode);
          TreeCounter drafter(make_drafter(name, kv_mode));
          auto controller = NewController();
          SpecEngineOptions options;
          options.adaptive = k == 0;
          options.fixed_k = k;
          options.tree_nodes = 8;
          options.pool = pool_.get();
          SpeculativeEngine engine(runner.get(), {{&drafter, controller.get()}}, options);
          EXPECT_EQ(Run(engine, requests, runner.get()), expected)
              << drafter.name() << " " << kv_mode << " T " << temperature << " K " << k;
          EXPECT_GT(drafter.trees, 0)
              << drafter.name() << " " << kv_mode << " T " << temperature << ": no tree drafted";
          for (size_t i = 0; i < requests.size() && k == 3; ++i) {
            EXPECT_EQ(Run(engine, {requests[i]}), std::vector<std::vector<int32_t>>{expected[i]})
                << drafter.name() << " " << kv_mode << " alone, prompt " << i;
          }
        }
      }
    }
  }
}

}  // namespace
}  // namespace specnode::spec_engine_test
