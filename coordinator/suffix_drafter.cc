#include "coordinator/suffix_drafter.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace specnode {
namespace {

constexpr std::string_view kOverflowHistory = "_overflow";

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
  std::vector<int32_t> tail;
  // The children of the node at the end of `path`: what followed the longest suffix of the
  // context + path, at most `branch`, each but the first with a share >= min_share.
  auto children = [&](std::span<const int32_t> path, std::vector<TreeChild>* out) {
    const std::span<const int32_t> own = path.last(std::min<size_t>(path.size(), max_n));
    const size_t from_context = max_n - own.size();
    const auto ctx = context.last(std::min(context.size(), from_context));
    tail.assign(ctx.begin(), ctx.end());
    tail.insert(tail.end(), own.begin(), own.end());
    const SuffixIndex::Match m = Continuations(s, h, tail);
    for (const SuffixIndex::Next& e : m.next) {
      if (static_cast<int>(out->size()) == branch) break;
      const double share = static_cast<double>(e.count) / static_cast<double>(m.total);
      if (!out->empty() && share < options_.min_share) break;
      out->push_back({e.token, share});
    }
  };
  return GrowDraftTree(max_nodes, max_depth, children);
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
