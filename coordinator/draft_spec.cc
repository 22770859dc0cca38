#include "coordinator/draft_spec.h"

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"

namespace specnode {

std::string DraftSpec::text() const {
  switch (kind) {
    case Kind::kNone:
      return "none";
    case Kind::kNgram:
      return count == 0 ? "ngram" : absl::StrCat("ngram:", count);
    case Kind::kSuffix:
      return count == 0 ? "suffix" : absl::StrCat("suffix:", count);
    case Kind::kRecycle:
      return count == 0 ? "recycle" : absl::StrCat("recycle:", count);
    case Kind::kSelf:
      return absl::StrCat("self:", count);
    case Kind::kModel:
      return path;
  }
  return "?";
}

absl::StatusOr<DraftSpec> ParseDraftSpec(std::string_view text) {
  const std::string spec(text);
  auto count = [&spec](std::string_view digits) -> absl::StatusOr<int> {
    int value = 0;
    if (!absl::SimpleAtoi(std::string(digits), &value) || value < 1 ||
        digits.find_first_not_of("0123456789") != std::string_view::npos) {
      return absl::InvalidArgumentError(
          absl::StrCat("draft spec \"", spec, "\": expected a positive integer after ':'"));
    }
    return value;
  };
  if (spec.empty()) return absl::InvalidArgumentError("empty draft spec");
  if (spec == "none") return DraftSpec::None();
  if (spec == "ngram") return DraftSpec{DraftSpec::Kind::kNgram, 0, {}};
  if (absl::StartsWith(spec, "ngram:")) {
    absl::StatusOr<int> n = count(text.substr(6));
    if (!n.ok()) return n.status();
    return DraftSpec{DraftSpec::Kind::kNgram, *n, {}};
  }
  if (spec == "suffix") return DraftSpec{DraftSpec::Kind::kSuffix, 0, {}};
  if (absl::StartsWith(spec, "suffix:")) {
    absl::StatusOr<int> n = count(text.substr(7));
    if (!n.ok()) return n.status();
    return DraftSpec{DraftSpec::Kind::kSuffix, *n, {}};
  }
  if (spec == "recycle") return DraftSpec{DraftSpec::Kind::kRecycle, 0, {}};
  if (absl::StartsWith(spec, "recycle:")) {
    absl::StatusOr<int> n = count(text.substr(8));
    if (!n.ok()) return n.status();
    return DraftSpec{DraftSpec::Kind::kRecycle, *n, {}};
  }
  if (absl::StartsWith(spec, "self:")) {
    absl::StatusOr<int> layers = count(text.substr(5));
    if (!layers.ok()) return layers.status();
    return DraftSpec{DraftSpec::Kind::kSelf, *layers, {}};
  }
  return DraftSpec{DraftSpec::Kind::kModel, 0, spec};
}

}  // namespace specnode
