#include "coordinator/ngram_drafter.h"

#include <algorithm>

#include "absl/strings/str_format.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<NgramDrafter>> NgramDrafter::Create(
    const NgramDrafterOptions& options) {
  if (options.min_n < 1 || options.min_n > options.max_n || options.max_n > 64 ||
      options.max_lookback < 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "n-gram drafter needs 1 <= min_n <= max_n <= 64 and max_lookback >= 1 (got min_n %d, "
        "max_n %d, max_lookback %d)",
        options.min_n, options.max_n, options.max_lookback));
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

absl::Status NgramDrafter::Propose(std::span<const DraftRequest> requests,
                                   std::vector<Draft>* drafts) {
  drafts->assign(requests.size(), Draft{});
  for (size_t i = 0; i < requests.size(); ++i) {
    (*drafts)[i].tokens = Lookup(requests[i].context, requests[i].k);
  }
  return absl::OkStatus();
}

}  // namespace specnode
