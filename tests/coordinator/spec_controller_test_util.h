// Helpers shared by the SpecController tests: scripted acceptance and exact timings.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string_view>
#include <vector>

#include "coordinator/spec_controller.h"

namespace specnode::spec_test {

// Deterministic per-position acceptance at rate r: position i passes when
// floor((i + 1)·r) > floor(i·r), so any n consecutive positions hold n·r ± 1 passes.
class ScriptedDrafter {
 public:
  explicit ScriptedDrafter(double rate) : rate_(rate) {}
  void set_rate(double rate) { rate_ = rate; }
  bool Next() {
    const bool ok = std::floor((i_ + 1) * rate_) > std::floor(i_ * rate_);
    ++i_;
    return ok;
  }
  // Accepted drafts of a step of length k: positions are judged until the first failure.
  int Step(int k) {
    int n = 0;
    while (n < k && Next()) ++n;
    return n;
  }

 private:
  double rate_;
  int64_t i_ = 0;
};

// Runs `steps` engine steps of one sequence in `domain`: ChooseK, then the scripted outcome.
// Returns the Ks chosen.
inline std::vector<int> Drive(SpecController& ctl, std::string_view domain, ScriptedDrafter& drafter,
                       int steps) {
  std::vector<int> ks;
  for (int i = 0; i < steps; ++i) {
    const int k = ctl.ChooseK(domain);
    ks.push_back(k);
    if (k > 0) {
      EXPECT_TRUE(ctl.RecordStep(domain, k, drafter.Step(k)).ok());
    }
  }
  return ks;
}

// Feeds single-position outcomes (k = 1 steps) straight into the window, no decisions.
inline void Feed(SpecController& ctl, std::string_view domain, double rate, int positions) {
  ScriptedDrafter d(rate);
  for (int i = 0; i < positions; ++i) ASSERT_TRUE(ctl.RecordStep(domain, 1, d.Next() ? 1 : 0).ok());
}

// Linear timings, in milliseconds: draft = per_token·K, verify = base + slope·K.
inline void SetTimings(SpecController& ctl, double draft_ms_per_token, double verify_base_ms,
                double verify_ms_per_k, double direct_ms) {
  for (int k : {1, 8}) {
    ASSERT_TRUE(ctl.RecordDraftTime(k, draft_ms_per_token * k * 1e-3).ok());
    ASSERT_TRUE(ctl.RecordVerifyTime(k, (verify_base_ms + verify_ms_per_k * k) * 1e-3).ok());
  }
  ASSERT_TRUE(ctl.RecordDirectTime(direct_ms * 1e-3).ok());
}

inline std::unique_ptr<SpecController> Make(SpecControllerConfig config = {}) {
  auto ctl = SpecController::Create(config);
  EXPECT_TRUE(ctl.ok()) << ctl.status();
  return std::move(ctl).value();
}

inline SpecControllerConfig ExactTimings() {
  SpecControllerConfig c;
  c.timing_alpha = 1.0;  // the latest sample replaces the estimate: timings can be switched
  c.timing_median = 1;
  return c;
}

}  // namespace specnode::spec_test
