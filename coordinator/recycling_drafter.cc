#include "coordinator/recycling_drafter.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<RecyclingDrafter>> RecyclingDrafter::Create(
    const RecyclingDrafterOptions& o) {
  if (o.top_k < 1 || o.top_k > 32 || o.branch < 1 || o.branch > o.top_k || o.max_token_id < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "recycling drafter needs 1 <= top_k <= 32, 1 <= branch <= top_k and max_token_id >= 1 "
        "(got top_k %d, branch %d, max_token_id %d)",
        o.top_k, o.branch, o.max_token_id));
  }
  return std::unique_ptr<RecyclingDrafter>(new RecyclingDrafter(o));
}

RecyclingDrafter::RecyclingDrafter(const RecyclingDrafterOptions& options)
    : options_(options), hits_(options.top_k, 0) {}

std::string RecyclingDrafter::name() const { return absl::StrFormat("recycle:%d", options_.top_k); }

const int32_t* RecyclingDrafter::FindRow(int32_t token) const {
  const size_t at = static_cast<size_t>(token) * options_.top_k;
  if (token < 0 || at >= table_.size() || table_[at] < 0) return nullptr;
  return table_.data() + at;
}

int32_t* RecyclingDrafter::MutableRow(int32_t token) {
  if (token < 0 || token >= options_.max_token_id) return nullptr;
  const size_t at = static_cast<size_t>(token) * options_.top_k;
  if (at >= table_.size()) {
    // Grow by half again at least, so a vocabulary fills the table in a few moves.
    const size_t want = std::max(at + options_.top_k, table_.size() + table_.size() / 2);
    const size_t cap = static_cast<size_t>(options_.max_token_id) * options_.top_k;
    table_.resize(std::min(want, cap), -1);
  }
  return table_.data() + at;
}

std::vector<int32_t> RecyclingDrafter::Row(int32_t token) const {
  const int32_t* row = FindRow(token);
  if (row == nullptr) return {};
  std::vector<int32_t> out;
  for (int r = 0; r < options_.top_k && row[r] >= 0; ++r) out.push_back(row[r]);
  return out;
}

double RecyclingDrafter::RankShare(int r) const {
  // Hits per lookup, with a pseudo-count that halves rank by rank (a prior that keeps the
  // ranks' order until the table has been tried).
  const double prior = 1.0 / static_cast<double>(2 << r);
  return (static_cast<double>(hits_[r]) + prior) / (static_cast<double>(lookups_) + 1.0);
}

void RecyclingDrafter::ObserveTarget(std::span<const int32_t> tokens, std::span<const int32_t> ids,
                                     int k) {
  const int top_k = options_.top_k;
  std::vector<int32_t> merged;
  for (size_t r = 0; r < tokens.size(); ++r) {
    if ((r + 1) * static_cast<size_t>(k) > ids.size()) break;
    const std::span<const int32_t> cand = ids.subspan(r * k, k);
    if (cand[0] < 0) continue;  // the row had no candidates
    int32_t* row = MutableRow(tokens[r]);
    if (row == nullptr) continue;
    if (row[0] >= 0) {  // how well the row the table held predicted the target's best
      ++lookups_;
      for (int j = 0; j < top_k && row[j] >= 0; ++j) {
        if (row[j] == cand[0]) {
          ++hits_[j];
          break;
        }
      }
    }
    // The new candidates first, then the older ones they do not repeat.
    merged.clear();
    for (int32_t id : cand) {
      if (static_cast<int>(merged.size()) == top_k || id < 0) break;
      if (std::find(merged.begin(), merged.end(), id) == merged.end()) merged.push_back(id);
    }
    for (int j = 0; j < top_k && row[j] >= 0 && static_cast<int>(merged.size()) < top_k; ++j) {
      if (std::find(merged.begin(), merged.end(), row[j]) == merged.end()) merged.push_back(row[j]);
    }
    std::fill(row, row + top_k, -1);
    std::copy(merged.begin(), merged.end(), row);
  }
}

DraftTree RecyclingDrafter::ProposeTree(int32_t last, int max_nodes, int branch,
                                        int max_depth) const {
  auto children = [&](std::span<const int32_t> path, std::vector<TreeChild>* out) {
    const int32_t* row = FindRow(path.empty() ? last : path.back());
    if (row == nullptr) return;
    for (int r = 0; r < branch && row[r] >= 0; ++r) out->push_back({row[r], RankShare(r)});
  };
  return GrowDraftTree(max_nodes, max_depth, children);
}

absl::Status RecyclingDrafter::Propose(std::span<const DraftRequest> requests,
                                       std::vector<Draft>* drafts) {
  drafts->assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    if (r.context.empty() || r.k < 1) continue;
    const bool tree = r.max_nodes > 0 && options_.branch > 1;
    DraftTree t = tree ? ProposeTree(r.context.back(), r.max_nodes, options_.branch, r.k)
                       : ProposeTree(r.context.back(), r.k, /*branch=*/1, r.k);
    (*drafts)[i].tokens = std::move(t.tokens);
    if (tree) (*drafts)[i].parents = std::move(t.parents);
  }
  return absl::OkStatus();
}

}  // namespace specnode
