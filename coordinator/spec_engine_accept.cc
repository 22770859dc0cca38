// SpeculativeEngine: one sequence's draws and acceptance on its pass's results — chains by
// the rules of acceptance.h, draft trees by the match walk of draft_tree.h — and how a step
// turns a drafter's tree into pass rows.
#include <algorithm>
#include <cassert>

#include "coordinator/acceptance.h"
#include "coordinator/draft_tree.h"
#include "coordinator/spec_engine.h"
#include "coordinator/spec_engine_seq.h"

namespace specnode {
namespace {

// Trees a sequence keeps waiting for their scores, at most (a step adds one, and the next
// commits decide it within K + 1 tokens; a cap for sequences that end first).
constexpr size_t kMaxPendingTrees = 16;

}  // namespace

void SpeculativeEngine::AcceptSeq(Seq& s, const Pass& pass, size_t row_of, std::vector<float>* p,
                                  int32_t* first_token, AcceptOutcome* outcome) const {
  const int32_t vocab = target_->vocab_size();
  const bool prefill = s.prefilled < s.n_prompt;
  const bool ends_prompt = prefill && s.prefilled + s.chunk == s.n_prompt;
  const int k = static_cast<int>(s.drafts.size());
  // Row 0 predicts the token at the sequence's committed length.
  const int64_t position = static_cast<int64_t>(s.tokens.size());
  if (!prefill && s.tree()) {
    // Row r predicts the token after its path, at position + its depth; only the rows the
    // walk reaches are drawn.
    const HeadRows head =
        pass.head.k > 0 ? pass.head.Rows(pass.ids, pass.values, row_of) : HeadRows{};
    auto draw = [&](int32_t r) -> int32_t {
      const int64_t at = position + s.row_depth[r];
      if (pass.drawn) return pass.ids[row_of + r];
      if (pass.head.k > 0) return head.Sample(r, s.sampler, at);
      const float* row = pass.logits.data() + (row_of + r) * vocab;
      return s.sampler.Sample({row, static_cast<size_t>(vocab)}, at);
    };
    outcome->next_token = AcceptTree(s.drafts, s.parents, draw, &s.kept);
    outcome->accepted = static_cast<int>(s.kept.size());
    return;
  }
  if (pass.drawn) {  // the rows' draws: t_j predicts the token at position + j
    const std::span<const int32_t> t(pass.ids.data() + row_of, static_cast<size_t>(k + 1));
    if (ends_prompt) *first_token = t[0];
    if (!prefill) *outcome = AcceptDrawn(s.drafts, t);
    return;
  }
  if (pass.head.k > 0) {  // the rows' largest logits: all greedy and top-k draws need
    const HeadRows head = pass.head.Rows(pass.ids, pass.values, row_of);
    if (ends_prompt) *first_token = head.Sample(0, s.sampler, position);
    if (!prefill) {
      *outcome =
          AcceptFromHead(s.drafts, head, position, s.q, vocab, s.sampler, options_.acceptance, p);
    }
    return;
  }
  const float* row0 = pass.logits.data() + row_of * vocab;
  if (prefill) {
    if (ends_prompt) *first_token = s.sampler.Sample({row0, static_cast<size_t>(vocab)}, position);
    return;
  }
  const std::span<const float> rows(row0, static_cast<size_t>(k + 1) * vocab);
  if (k == 0) {
    outcome->next_token = s.sampler.Sample(rows, position);
  } else if (s.request.sampling.temperature == 0.0f) {
    *outcome = AcceptGreedy(s.drafts, rows, vocab);
  } else if (options_.acceptance == AcceptanceRule::kMatch) {
    *outcome = AcceptMatch(s.drafts, rows, vocab, position, &s.sampler);
  } else {
    p->resize(static_cast<size_t>(k + 1) * vocab);
    std::vector<float> dist;
    for (int r = 0; r <= k; ++r) {
      s.sampler.Distribution(rows.subspan(static_cast<size_t>(r) * vocab, vocab), &dist);
      std::copy(dist.begin(), dist.end(), p->begin() + static_cast<size_t>(r) * vocab);
    }
    *outcome = AcceptRatio(s.drafts, *p, s.q, vocab, position, s.sampler);
  }
}

int SpeculativeEngine::TreeBudget(const Seq& s, int32_t boundary) const {
  // Trees need the match walk (the ratio rule's residuals are per position: chains only)
  // and a target whose cache takes tree rows.
  const bool match =
      options_.acceptance == AcceptanceRule::kMatch || s.request.sampling.temperature == 0.0f;
  if (options_.tree_nodes <= 0 || !match || !TargetOf(s)->TreePasses()) return 0;
  int nodes = std::max(options_.tree_nodes, s.k);
  // The pass's rows (the last token and the nodes) inside one pass boundary.
  const int32_t len = static_cast<int32_t>(s.tokens.size());
  if (boundary > 0) nodes = std::min(nodes, boundary - 1 - (len - 1) % boundary);
  return nodes;
}

void SpeculativeEngine::TakeDraft(Seq& s, Draft& draft, int max_nodes) {
  s.drafts = std::move(draft.tokens);
  s.q = std::move(draft.q);
  s.parents.clear();
  // Our drafters build valid trees (a bug otherwise); a release build verifies the chain.
  assert(draft.parents.empty() || ValidateTree(s.drafts, draft.parents).ok());
  if (draft.parents.empty() || max_nodes == 0 || !ValidateTree(s.drafts, draft.parents).ok() ||
      ChainLength(draft.parents) == static_cast<int>(draft.parents.size())) {
    // A chain (or a tree that is one, or one the engine cannot use: its main chain).
    if (!draft.parents.empty()) s.drafts.resize(ChainLength(draft.parents));
    if (s.drafts.size() > static_cast<size_t>(s.k)) s.drafts.resize(s.k);
    return;
  }
  // Nodes deeper than K or beyond the budget are dropped (children follow parents, so
  // what remains is a tree), then the pass rows: the last token, then the nodes.
  const std::vector<int32_t> depth = TreeRowDepths(draft.parents);
  std::vector<int32_t> index(s.drafts.size(), -1), tokens;
  for (size_t i = 0; i < s.drafts.size(); ++i) {
    const int32_t parent = draft.parents[i] < 0 ? -1 : index[draft.parents[i]];
    if (depth[i] >= s.k || static_cast<int>(tokens.size()) >= max_nodes ||
        (draft.parents[i] >= 0 && parent < 0)) {
      continue;
    }
    index[i] = static_cast<int32_t>(tokens.size());
    tokens.push_back(s.drafts[i]);
    s.parents.push_back(parent);
  }
  s.drafts = std::move(tokens);
  s.q.clear();
  const int chain = ChainLength(s.parents);
  if (chain == static_cast<int>(s.parents.size())) {
    s.parents.clear();  // what is left is a chain
    return;
  }
  if (options_.adaptive && !options_.trees_always) {
    // The choice's evidence: scored once its tokens are committed, whichever of tree and
    // chain is verified (a fixed K or trees_always never consults it).
    if (s.pending_trees.size() < kMaxPendingTrees) {
      s.pending_trees.push_back({s.group, s.tokens.size(), s.drafts, s.parents});
    }
    const SpecController& c = *groups_[s.group].controller;
    auto verify_s = [&c](int n) { return c.PredictVerifySeconds(n); };
    const double draft_s = c.PredictDraftSeconds(s.k).value_or(0.0);
    if (!tree_gain_[s.group].PreferTree(s.request.domain, draft_s, verify_s)) {
      s.drafts.resize(chain);  // the main chain only: the tree does not pay here
      s.parents.clear();
      return;
    }
  }
  s.row_parents.assign(1, -1);
  for (int32_t parent : s.parents) s.row_parents.push_back(parent + 1);
  s.row_depth = TreeRowDepths(s.row_parents);
  s.tree_depth = *std::max_element(s.row_depth.begin(), s.row_depth.end());
}

void SpeculativeEngine::ObserveTarget(std::span<Seq* const> seqs,
                                      const std::vector<std::vector<int32_t>>& inputs,
                                      const std::vector<size_t>& pass_of,
                                      const std::vector<size_t>& row_of,
                                      const std::vector<Pass>& passes) {
  if (observers_.empty()) return;
  const int32_t vocab = target_->vocab_size();
  std::vector<int32_t> tokens, ids;
  std::vector<float> values;
  for (size_t i = 0; i < seqs.size(); ++i) {
    if (inputs[i].empty()) continue;
    const Pass& pass = passes[pass_of[i]];
    const BatchEntry* entry = nullptr;
    for (const BatchEntry& e : pass.batch) {
      if (e.seq == seqs[i]->request.id) entry = &e;
    }
    if (entry == nullptr) continue;
    // The rows that came back: every token of a verification, else the last one fed.
    const size_t n = entry->all_logits ? inputs[i].size() : 1;
    tokens.assign(inputs[i].end() - static_cast<std::ptrdiff_t>(n), inputs[i].end());
    const size_t row = row_of[i];
    int k = 1;
    if (pass.drawn) {
      ids.assign(pass.ids.begin() + row, pass.ids.begin() + row + n);
    } else if (pass.head.k > 0) {
      k = pass.head.k;
      ids.assign(pass.ids.begin() + row * k, pass.ids.begin() + (row + n) * k);
    } else {  // whole rows: their candidates on the host
      k = observe_k_;
      ids.resize(n * k);
      values.resize(n * k);
      TopKRows(pass.logits.data() + row * vocab, static_cast<int64_t>(n), vocab, k, ids.data(),
               values.data());
    }
    for (Drafter* d : observers_) d->ObserveTarget(tokens, ids, k);
  }
}

void SpeculativeEngine::ScoreTrees(Seq& s) {
  auto& pending = s.pending_trees;
  size_t kept = 0;
  for (size_t i = 0; i < pending.size(); ++i) {
    const Seq::PendingTree& t = pending[i];
    const std::optional<TreeOutcome> o = ScoreTree(t.tokens, t.parents, t.position, s.tokens);
    if (o) {
      tree_gain_[t.group].Record(s.request.domain, *o);
    } else {
      if (kept != i) pending[kept] = std::move(pending[i]);
      ++kept;
    }
  }
  pending.resize(kept);
}

}  // namespace specnode
