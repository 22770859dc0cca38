#include "coordinator/ngram_drafter.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace specnode {
namespace {

constexpr std::string_view kOverflowHistory = "_overflow";

uint64_t HashTokens(const int32_t* t, int n) {
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the token ids
  for (int i = 0; i < n; ++i) {
    h ^= static_cast<uint32_t>(t[i]);
    h *= 1099511628211ull;
  }
  return h;
}

}  // namespace

absl::StatusOr<std::unique_ptr<NgramDrafter>> NgramDrafter::Create(
    const NgramDrafterOptions& options) {
  if (options.min_n < 1 || options.min_n > options.max_n || options.max_n > 64 ||
      options.max_lookback < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "n-gram drafter needs 1 <= min_n <= max_n <= 64 and max_lookback >= 1 (got min_n %d, "
        "max_n %d, max_lookback %d)",
        options.min_n, options.max_n, options.max_lookback));
  }
  if (options.history_tokens < 0 || options.history_min_n < options.min_n ||
      options.history_min_n > options.max_n || options.history_max_draft < 1 ||
      options.history_domains < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "n-gram drafter history needs history_tokens >= 0, min_n <= history_min_n <= max_n, "
        "history_max_draft >= 1 and history_domains >= 1 (got %d, %d, %d, %d)",
        options.history_tokens, options.history_min_n, options.history_max_draft,
        options.history_domains));
  }
  return std::unique_ptr<NgramDrafter>(new NgramDrafter(options));
}

std::string NgramDrafter::name() const { return absl::StrFormat("ngram:%d", options_.max_n); }

std::vector<int32_t> NgramDrafter::Lookup(std::span<const int32_t> context, int k) const {
  const int64_t len = static_cast<int64_t>(context.size());
  const int64_t lo = std::max<int64_t>(0, len - options_.max_lookback);
  for (int n = std::min<int64_t>(options_.max_n, len - 1); n >= options_.min_n; --n) {
    const auto suffix = context.last(n);
    // Most recent match first: start positions s with s + n < len (a continuation exists).
    for (int64_t s = len - n - 1; s >= lo; --s) {
      if (!std::equal(suffix.begin(), suffix.end(), context.begin() + s)) continue;
      const int64_t from = s + n;
      const int64_t count = std::min<int64_t>(k, len - from);
      return {context.begin() + from, context.begin() + from + count};
    }
  }
  return {};
}

const NgramDrafter::History* NgramDrafter::FindHistory(std::string_view domain) const {
  auto it = histories_.find(domain);
  if (it == histories_.end()) it = histories_.find(kOverflowHistory);
  return it == histories_.end() ? nullptr : &it->second;
}

NgramDrafter::History& NgramDrafter::HistoryFor(std::string_view domain) {
  auto it = histories_.find(domain);
  if (it != histories_.end()) return it->second;
  if (static_cast<int>(histories_.size()) >= options_.history_domains) domain = kOverflowHistory;
  History& h = histories_[std::string(domain)];
  h.index.resize(options_.max_n - options_.history_min_n + 1);
  return h;
}

void NgramDrafter::IndexFrom(History& h, int64_t begin) {
  const int64_t len = static_cast<int64_t>(h.tokens.size());
  for (int n = options_.history_min_n; n <= options_.max_n; ++n) {
    auto& index = h.index[n - options_.history_min_n];
    // Start positions whose n tokens and at least one continuation lie in one context.
    for (int64_t s = std::max<int64_t>(0, begin - n); s + n < len; ++s) {
      const int32_t* t = h.tokens.data() + s;
      if (std::find(t, t + n + 1, kSeparator) != t + n + 1) continue;
      index[HashTokens(t, n)] = s;  // later positions overwrite: newest wins
    }
  }
}

void NgramDrafter::Append(History& h, std::span<const int32_t> context) {
  const int64_t cap = options_.history_tokens;
  std::span<const int32_t> ctx = context;
  if (static_cast<int64_t>(ctx.size()) + 1 > cap) ctx = ctx.last(cap - 1);
  if (static_cast<int64_t>(h.tokens.size() + ctx.size()) + 1 > cap) {
    // Full: keep the newer half (whole contexts from the first separator on) and reindex.
    const int64_t keep_from = static_cast<int64_t>(h.tokens.size()) / 2;
    auto sep = std::find(h.tokens.begin() + keep_from, h.tokens.end(), kSeparator);
    h.tokens.erase(h.tokens.begin(), sep);
    for (auto& index : h.index) index.clear();
    if (static_cast<int64_t>(h.tokens.size() + ctx.size()) + 1 > cap) h.tokens.clear();
    IndexFrom(h, 0);
  }
  const int64_t begin = static_cast<int64_t>(h.tokens.size());
  if (h.tokens.empty() || h.tokens.back() != kSeparator) h.tokens.push_back(kSeparator);
  h.tokens.insert(h.tokens.end(), ctx.begin(), ctx.end());
  h.tokens.push_back(kSeparator);
  IndexFrom(h, begin);
}

std::vector<int32_t> NgramDrafter::LookupHistory(std::string_view domain,
                                                 std::span<const int32_t> context, int k) const {
  const History* h = FindHistory(domain);
  if (h == nullptr || h->tokens.empty()) return {};
  k = std::min(k, options_.history_max_draft);
  const int64_t len = static_cast<int64_t>(context.size());
  for (int n = std::min<int64_t>(options_.max_n, len); n >= options_.history_min_n; --n) {
    const auto suffix = context.last(n);
    const auto& index = h->index[n - options_.history_min_n];
    auto it = index.find(HashTokens(suffix.data(), n));
    if (it == index.end()) continue;
    const int64_t s = it->second;
    if (!std::equal(suffix.begin(), suffix.end(), h->tokens.begin() + s)) continue;  // collision
    std::vector<int32_t> out;
    for (int64_t p = s + n; p < static_cast<int64_t>(h->tokens.size()) &&
                            static_cast<int>(out.size()) < k && h->tokens[p] != kSeparator;
         ++p) {
      out.push_back(h->tokens[p]);
    }
    if (!out.empty()) return out;
  }
  return {};
}

int64_t NgramDrafter::HistoryTokens(std::string_view domain) const {
  const History* h = FindHistory(domain);
  return h == nullptr ? 0 : static_cast<int64_t>(h->tokens.size());
}

absl::Status NgramDrafter::Propose(std::span<const DraftRequest> requests,
                                   std::vector<Draft>* drafts) {
  drafts->assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) {
    const DraftRequest& r = requests[i];
    std::vector<int32_t>& out = (*drafts)[i].tokens;
    out = Lookup(r.context, r.k);
    if (options_.history_tokens == 0) continue;
    if (out.empty()) out = LookupHistory(r.domain, r.context, r.k);
    Pending& p = pending_[r.seq];
    p.domain.assign(r.domain);
    p.context.assign(r.context.begin(), r.context.end());
  }
  return absl::OkStatus();
}

void NgramDrafter::Free(SeqId seq) {
  auto it = pending_.find(seq);
  if (it == pending_.end()) return;
  Append(HistoryFor(it->second.domain), it->second.context);
  pending_.erase(it);
}

}  // namespace specnode
