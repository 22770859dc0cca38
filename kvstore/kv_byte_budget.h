// The byte budget's class choice (kv.bytes_per_token, kv_options.h): which precision class
// each demotable token of a sequence gets so that their bytes fit an allowance with the
// least expected attention error. Pure arithmetic, no store state; KvStore::Settle
// (kv_store_policy.cc) calls it at each demotion boundary. Thread-safe.
//
// Model. A token stored in class c adds error ∝ mass × kClassError[c]: its attention mass
// (relative to a uniform share, what the store observes) weights how much a query's output
// moves with its rows, and kClassError is the mean squared error of a row of unit variance
// in that format (kv_precision.h; Gaussian rows, which the Hadamard rotation makes of K
// and V). Every token starts at the floor class; upgrades one class up are taken in order
// of error removed per byte, each only after the token's previous one, while they fit.
// Per token the error falls convexly with bytes, so this greedy order is the optimum of the
// fractional problem, and within one step of it here.
#pragma once

#include <array>
#include <cstdint>
#include <optional>
#include <span>
#include <vector>

#include "kvstore/kv_precision.h"

namespace specnode {

// Mean squared error of one stored value of a unit-variance Gaussian row per class
// (measured with KvEncodeRow on 64-value rows: f16 ~0, int8 max|x|/127 steps, int4
// (max - min)/15 steps, int2 its chosen spacing).
inline constexpr std::array<double, kNumKvPrecisions> kClassError = {0.0, 3.4e-5, 9.6e-3, 0.118};

struct BudgetToken {
  float mass = 0.0f;  // mean observed attention mass relative to a uniform share
  // The most precise class it may take (a token never moves up: its current class, or what
  // the policy allows a token leaving the window).
  KvPrecision best = KvPrecision::kFull;
};

// Classes for `tokens` (in order) whose slot bytes sum to at most `allowance`, the least
// Σ mass × kClassError among choices no better than each token's `best` and no worse than
// `floor`. nullopt when even every token at floor (or at its best, if that is lower) does
// not fit. Ties (equal error per byte) go to the earlier token.
std::optional<std::vector<KvPrecision>> ChooseClassesForBudget(
    std::span<const BudgetToken> tokens, int64_t allowance,
    const std::array<int64_t, kNumKvPrecisions>& slot_bytes, KvPrecision floor);

}  // namespace specnode
