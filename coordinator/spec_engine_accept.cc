// SpeculativeEngine: one sequence's draws and acceptance on its pass's results — chains by
// the rules of acceptance.h, draft trees by the match walk of draft_tree.h — and how a step
// turns a drafter's tree into pass rows.
#include <algorithm>

#include "coordinator/acceptance.h"
#include "coordinator/draft_tree.h"
#include "coordinator/spec_engine.h"
#include "coordinator/spec_engine_seq.h"

namespace specnode {

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
  if (ChainLength(s.parents) == static_cast<int>(s.parents.size())) {
    s.parents.clear();  // what is left is a chain
    return;
  }
  s.row_parents.assign(1, -1);
  for (int32_t parent : s.parents) s.row_parents.push_back(parent + 1);
  s.row_depth = TreeRowDepths(s.row_parents);
}

}  // namespace specnode
