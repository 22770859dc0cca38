#include "coordinator/suffix_drafter.h"

#include <algorithm>
#include <queue>

#include "absl/strings/str_format.h"

namespace specnode {
namespace {

constexpr std::string_view kOverflowHistory = "_overflow";

// A child not yet in the tree: the best-first frontier's entry.
struct Candidate {
  double score = 0;
  int64_t order = 0;  // tie-break: earlier pushes first (deterministic)
  int32_t parent = -1;
  int32_t token = 0;
  bool operator<(const Candidate& o) const {  // priority_queue pops the largest
    return score != o.score ? score < o.score : order > o.order;
  }
};

// The chain of best children first (each node's first-added child is its best), the other
// nodes after in the order they were added; parents re-numbered.
DraftTree LayOut(const std::vector<int32_t>& tokens, const std::vector<int32_t>& parents) {
  const int n = static_cast<int>(tokens.size());
  std::vector<int32_t> order;
  std::vector<char> placed(n, 0);
  for (int32_t at = -1;;) {
    int32_t best = -1;
    for (int i = 0; i < n && best < 0; ++i) {
      if (parents[i] == at) best = i;
    }
    if (best < 0) break;
    order.push_back(best);
    placed[best] = 1;
    at = best;
  }
  for (int i = 0; i < n; ++i) {
    if (!placed[i]) order.push_back(i);
  }
  std::vector<int32_t> new_index(n);
  for (int j = 0; j < n; ++j) new_index[order[j]] = j;
  DraftTree tree;
  for (int32_t old : order) {
    tree.tokens.push_back(tokens[old]);
    tree.parents.push_back(parents[old] < 0 ? -1 : new_index[parents[old]]);
  }
  return tree;
}

}  // namespace

absl::StatusOr<std::unique_ptr<SuffixDrafter>> SuffixDrafter::Create(
    const SuffixDrafterOptions& o) {
  if (o.min_n < 1 || o.min_n > o.history_min_n || o.history_min_n > o.max_n || o.max_n > 64 ||
      o.branch < 1 || !(o.min_share >= 0 && o.min_share <= 1) || o.history_tokens < 0 ||
      o.history_domains < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "suffix drafter needs 1 <= min_n <= history_min_n <= max_n <= 64, branch >= 1, "
        "0 <= min_share <= 1, history_tokens >= 0 and history_domains >= 1 (got min_n %d, "
        "history_min_n %d, max_n %d, branch %d, min_share %g, history_tokens %d, "
        "history_domains %d)",
        o.min_n, o.history_min_n, o.max_n, o.branch, o.min_share, o.history_tokens,
        o.history_domains));
  }
  return std::unique_ptr<SuffixDrafter>(new SuffixDrafter(o));
}

std::string SuffixDrafter::name() const { return absl::StrFormat("suffix:%d", options_.max_n); }

SuffixDrafter::SeqState& SuffixDrafter::Catch(SeqId seq, std::span<const int32_t> context,
                                              std::string_view domain) {
  SeqState& s = seqs_[seq];
  s.domain.assign(domain);
  const bool extends = s.index != nullptr && s.tokens.size() <= context.size() &&
                       std::equal(s.tokens.begin(), s.tokens.end(), context.begin());
  if (!extends) {
    s.index = std::make_unique<SuffixIndex>(options_.max_n);
    s.tokens.clear();
  }
  s.index->Append(context.subspan(s.tokens.size()));
  s.tokens.assign(context.begin(), context.end());
  return s;
}

const SuffixDrafter::History* SuffixDrafter::FindHistory(std::string_view domain) const {
  auto it = histories_.find(domain);
  if (it == histories_.end()) it = histories_.find(kOverflowHistory);
  return it == histories_.end() ? nullptr : &it->second;
}

SuffixDrafter::History& SuffixDrafter::HistoryFor(std::string_view domain) {
  auto it = histories_.find(domain);
  if (it != histories_.end()) return it->second;
  if (static_cast<int>(histories_.size()) >= options_.history_domains) domain = kOverflowHistory;
  History& h = histories_[std::string(domain)];
  if (h.index == nullptr) h.index = std::make_unique<SuffixIndex>(options_.max_n);
  return h;
}

SuffixIndex::Match SuffixDrafter::Continuations(const SeqState& s, const History* h,
                                                std::span<const int32_t> tail) const {
  SuffixIndex::Match own = s.index->Longest(tail, options_.min_n);
  if (h == nullptr) return own;
  SuffixIndex::Match past = h->index->Longest(tail, options_.history_min_n);
  return past.n > own.n ? past : own;
}

DraftTree SuffixDrafter::ProposeTree(SeqId seq, std::span<const int32_t> context,
                                     std::string_view domain, int max_nodes, int branch,
                                     int max_depth) {
  const SeqState& s = Catch(seq, context, domain);
  const History* h = options_.history_tokens > 0 ? FindHistory(domain) : nullptr;
  const int max_n = options_.max_n;
  std::vector<int32_t> tokens, parents;
  std::vector<double> scores;
  std::vector<int32_t> depths;
  std::priority_queue<Candidate> frontier;
  int64_t pushes = 0;
  std::vector<int32_t> tail;
  // Pushes the children of `node` (-1: the context itself) onto the frontier.
  auto expand = [&](int32_t node) {
    std::vector<int32_t> path;
    for (int32_t v = node; v >= 0 && static_cast<int>(path.size()) < max_n; v = parents[v]) {
      path.push_back(tokens[v]);
    }
    const size_t from_context = max_n - std::min<size_t>(max_n, path.size());
    const auto ctx = context.last(std::min(context.size(), from_context));
    tail.assign(ctx.begin(), ctx.end());
    tail.insert(tail.end(), path.rbegin(), path.rend());
    const SuffixIndex::Match m = Continuations(s, h, tail);
    const double base = node < 0 ? 1.0 : scores[node];
    int taken = 0;
    for (const SuffixIndex::Next& e : m.next) {
      if (taken == branch) break;
      const double share = static_cast<double>(e.count) / static_cast<double>(m.total);
      if (taken > 0 && share < options_.min_share) break;
      frontier.push(Candidate{base * share, pushes++, node, e.token});
      ++taken;
    }
  };
  expand(-1);
  while (static_cast<int>(tokens.size()) < max_nodes && !frontier.empty()) {
    const Candidate c = frontier.top();
    frontier.pop();
    tokens.push_back(c.token);
    parents.push_back(c.parent);
    scores.push_back(c.score);
    depths.push_back(c.parent < 0 ? 0 : depths[c.parent] + 1);
    if (static_cast<int>(tokens.size()) < max_nodes && depths.back() + 1 < max_depth) {
      expand(static_cast<int32_t>(tokens.size()) - 1);
    }
  }
  return LayOut(tokens, parents);
}

absl::Status SuffixDrafter::Propose(std::span<const DraftRequest> requests,
                                    std::vector<Draft>* drafts) {
  drafts->assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    if (r.max_nodes > 0 && options_.branch > 1) {
      DraftTree tree = ProposeTree(r.seq, r.context, r.domain, r.max_nodes, options_.branch,
                                   /*max_depth=*/r.k);
      (*drafts)[i].tokens = std::move(tree.tokens);
      (*drafts)[i].parents = std::move(tree.parents);
      continue;
    }
    DraftTree tree = ProposeTree(r.seq, r.context, r.domain, r.k, /*branch=*/1);
    (*drafts)[i].tokens = std::move(tree.tokens);
  }
  return absl::OkStatus();
}

void SuffixDrafter::Free(SeqId seq) {
  auto it = seqs_.find(seq);
  if (it == seqs_.end()) return;
  SeqState s = std::move(it->second);
  seqs_.erase(it);
  const int64_t cap = options_.history_tokens;
  if (cap == 0 || s.tokens.empty()) return;
  History& h = HistoryFor(s.domain);
  std::vector<int32_t> context = std::move(s.tokens);
  if (static_cast<int64_t>(context.size()) > cap) {
    context.erase(context.begin(), context.end() - cap);
  }
  h.tokens += static_cast<int64_t>(context.size());
  h.contexts.push_back(std::move(context));
  if (h.tokens <= cap) {
    h.index->Append(h.contexts.back());
    h.index->Break();
    return;
  }
  // Full: drop the oldest contexts down to half the budget and index the rest afresh.
  while (h.tokens > cap / 2 && h.contexts.size() > 1) {
    h.tokens -= static_cast<int64_t>(h.contexts.front().size());
    h.contexts.erase(h.contexts.begin());
  }
  h.index->Clear();
  for (const auto& c : h.contexts) {
    h.index->Append(c);
    h.index->Break();
  }
}

int64_t SuffixDrafter::HistoryTokens(std::string_view domain) const {
  const History* h = FindHistory(domain);
  return h == nullptr ? 0 : h->tokens;
}

}  // namespace specnode
