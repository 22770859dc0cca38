#include "kvstore/kv_byte_budget.h"

#include <algorithm>

namespace specnode {

namespace {

// One class up for token `i`: from class `from` (an integer of KvPrecision) to from - 1.
struct Upgrade {
  double gain_per_byte;
  int32_t token;
  int from;
};

}  // namespace

std::optional<std::vector<KvPrecision>> ChooseClassesForBudget(
    std::span<const BudgetToken> tokens, int64_t allowance,
    const std::array<int64_t, kNumKvPrecisions>& slot_bytes, KvPrecision floor) {
  std::vector<int> cls(tokens.size());
  int64_t bytes = 0;
  std::vector<Upgrade> ups;
  for (size_t i = 0; i < tokens.size(); ++i) {
    const int best = static_cast<int>(tokens[i].best);
    cls[i] = std::max(best, static_cast<int>(floor));  // larger = less precise
    bytes += slot_bytes[cls[i]];
    for (int c = cls[i]; c > best; --c) {
      const double gain =
          static_cast<double>(tokens[i].mass) * (kClassError[c] - kClassError[c - 1]);
      const int64_t cost = slot_bytes[c - 1] - slot_bytes[c];
      ups.push_back(
          {cost > 0 ? gain / static_cast<double>(cost) : gain, static_cast<int32_t>(i), c});
    }
  }
  if (bytes > allowance) return std::nullopt;
  std::stable_sort(ups.begin(), ups.end(), [](const Upgrade& a, const Upgrade& b) {
    if (a.gain_per_byte != b.gain_per_byte) return a.gain_per_byte > b.gain_per_byte;
    return a.token < b.token;
  });
  for (const Upgrade& u : ups) {
    if (cls[u.token] != u.from) continue;  // its previous step was not taken
    if (u.gain_per_byte <= 0.0) break;     // no error left to remove (mass 0)
    const int64_t cost = slot_bytes[u.from - 1] - slot_bytes[u.from];
    if (bytes + cost > allowance) continue;
    bytes += cost;
    cls[u.token] = u.from - 1;
  }
  std::vector<KvPrecision> out(tokens.size());
  for (size_t i = 0; i < tokens.size(); ++i) out[i] = static_cast<KvPrecision>(cls[i]);
  return out;
}

}  // namespace specnode
