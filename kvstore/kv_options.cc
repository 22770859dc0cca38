#include "kvstore/kv_options.h"

#include "absl/strings/str_cat.h"

namespace specnode {

std::string_view KvModeName(KvMode m) {
  switch (m) {
    case KvMode::kAuto:
      return "auto";
    case KvMode::kDense:
      return "dense";
    case KvMode::kFull:
      return "full";
    case KvMode::kInt8:
      return "int8";
    case KvMode::kInt4:
      return "int4";
    case KvMode::kMixed:
      return "mixed";
    case KvMode::kInt2:
      return "int2";
  }
  return "?";
}

absl::StatusOr<KvMode> ParseKvMode(std::string_view name) {
  for (KvMode m : {KvMode::kAuto, KvMode::kDense, KvMode::kFull, KvMode::kInt8, KvMode::kInt4,
                   KvMode::kMixed, KvMode::kInt2}) {
    if (KvModeName(m) == name) return m;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown KV mode \"", std::string(name),
                   "\" (expected auto, mixed, full, int8, int4, int2 or dense)"));
}

std::string_view KvBudgetRankName(KvBudgetRank r) {
  return r == KvBudgetRank::kRecency ? "recency" : "mass";
}

absl::StatusOr<KvBudgetRank> ParseKvBudgetRank(std::string_view name) {
  for (KvBudgetRank r : {KvBudgetRank::kMass, KvBudgetRank::kRecency}) {
    if (KvBudgetRankName(r) == name) return r;
  }
  return absl::InvalidArgumentError(
      absl::StrCat("unknown budget rank \"", std::string(name), "\" (expected mass or recency)"));
}

absl::Status KvOptions::Validate(std::string_view prefix) const {
  auto bad = [&](const char* field, const std::string& what) {
    return absl::InvalidArgumentError(absl::StrCat(std::string(prefix), field, ": ", what));
  };
  if (capacity_bytes <= 0) return bad("capacity", "must be positive");
  if (host_capacity_bytes < 0) return bad("host_capacity", "must be >= 0");
  if (!(memory_utilization >= 0.0 && memory_utilization <= 1.0)) {
    return bad("memory_utilization", "must be in (0, 1], or 0 for capacity_mb");
  }
  if (page_tokens < 1 || page_tokens > 4096) return bad("page_tokens", "must be in [1, 4096]");
  if (sink_tokens < 0) return bad("sink_tokens", "must be >= 0");
  if (window_tokens < 1) return bad("window_tokens", "must be >= 1");
  if (mass_sample_every < 1) return bad("mass_sample_every", "must be >= 1");
  if (demote_every < 1) return bad("demote_every", "must be >= 1");
  if (!(critical_threshold >= 0.0f)) return bad("critical_threshold", "must be >= 0");
  if (!(cold_threshold >= 0.0f)) return bad("cold_threshold", "must be >= 0");
  if (bytes_per_token < 0) return bad("bytes_per_token", "must be >= 0 (0: no budget)");
  if (bytes_per_token > 0 && mode != KvMode::kMixed && mode != KvMode::kAuto) {
    return bad("bytes_per_token", absl::StrCat("a byte budget needs kv mode mixed, not ",
                                               std::string(KvModeName(mode))));
  }
  if (cold_threshold > 0.0f && cold_threshold > critical_threshold) {
    return bad("cold_threshold", "must be <= critical_threshold (a token is cold or critical)");
  }
  if (evict && evict_window < window_tokens) {
    return bad("evict_window", "must be >= window_tokens");
  }
  return absl::OkStatus();
}

}  // namespace specnode
