// The controller's cost model: timing samples in, predicted step costs out (see
// spec_controller.h, "Cost model"), and the catch-up rate the router weighs a drafter's
// first steps on a sequence with.
#include <algorithm>
#include <cmath>
#include <mutex>

#include "absl/strings/str_cat.h"
#include "coordinator/spec_controller.h"

namespace specnode {

// ---- TimingModel ----

double SpecController::MedianFilter(std::deque<double>& recent, double seconds, int median_of) {
  recent.push_back(seconds);
  while (static_cast<int>(recent.size()) > median_of) recent.pop_front();
  std::vector<double> sorted(recent.begin(), recent.end());
  std::nth_element(sorted.begin(), sorted.begin() + sorted.size() / 2, sorted.end());
  return sorted[sorted.size() / 2];
}

void SpecController::TimingModel::Add(int k, double seconds, double alpha, int median_of) {
  seconds = MedianFilter(recent[k], seconds, median_of);
  auto [it, inserted] = ewma.try_emplace(k, seconds);
  if (!inserted) it->second = alpha * seconds + (1.0 - alpha) * it->second;
}

std::optional<double> SpecController::TimingModel::Predict(int k,
                                                           std::optional<double> anchor0) const {
  if (ewma.empty()) return std::nullopt;
  if (anchor0.has_value()) {
    // The intercept is measured (a verification of zero drafts is a direct step, timed far
    // more often than any single k): fit only the slope, c1 >= 0.
    double sxr = 0.0, sxx = 0.0;
    for (const auto& [x, y] : ewma) {
      sxr += x * (y - *anchor0);
      sxx += static_cast<double>(x) * x;
    }
    const double c1 = sxx > 0.0 ? std::max(sxr / sxx, 0.0) : 0.0;
    return *anchor0 + c1 * k;
  }
  if (ewma.size() == 1) {
    const auto [k0, t0] = *ewma.begin();
    if (proportional_single && k0 > 0) return t0 * k / k0;
    return t0;
  }
  // Least squares c0 + c1·x with c0, c1 >= 0 (two-variable NNLS: the unconstrained fit if
  // feasible, else the better of the two boundary fits c1 = 0 and c0 = 0).
  const double n = static_cast<double>(ewma.size());
  double sx = 0, sy = 0, sxx = 0, sxy = 0;
  for (const auto& [x, y] : ewma) {
    sx += x;
    sy += y;
    sxx += static_cast<double>(x) * x;
    sxy += x * y;
  }
  const double mx = sx / n, my = sy / n;
  const double vxx = sxx - n * mx * mx;  // > 0: keys are distinct
  double c1 = (sxy - n * mx * my) / vxx;
  double c0 = my - c1 * mx;
  if (c1 < 0.0 || c0 < 0.0) {
    auto sse = [&](double a0, double a1) {
      double e = 0;
      for (const auto& [x, y] : ewma) {
        const double r = y - (a0 + a1 * x);
        e += r * r;
      }
      return e;
    };
    const double flat_c0 = std::max(my, 0.0);
    const double origin_c1 = sxx > 0.0 ? std::max(sxy / sxx, 0.0) : 0.0;
    if (sse(flat_c0, 0.0) <= sse(0.0, origin_c1)) {
      c0 = flat_c0;
      c1 = 0.0;
    } else {
      c0 = 0.0;
      c1 = origin_c1;
    }
  }
  return c0 + c1 * k;
}

// ---- Recording ----

namespace {
absl::Status CheckSeconds(std::string_view what, double seconds) {
  if (!std::isfinite(seconds) || seconds < 0.0) {
    return absl::InvalidArgumentError(
        absl::StrCat(std::string(what), ": seconds must be finite and >= 0, got ", seconds));
  }
  return absl::OkStatus();
}
}  // namespace

absl::Status SpecController::RecordDraftTime(int k, double seconds) {
  if (k < 1 || k > kMaxRecordedK) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordDraftTime: k = ", k, " outside [1, ", kMaxRecordedK, "]"));
  }
  absl::Status st = CheckSeconds("RecordDraftTime", seconds);
  if (!st.ok()) return st;
  std::unique_lock lock(mu_);
  costs_[batch_class_].draft.Add(k, seconds, config_.timing_alpha, config_.timing_median);
  return absl::OkStatus();
}

absl::Status SpecController::RecordVerifyTime(int k, double seconds) {
  if (k < 0 || k > kMaxRecordedK) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordVerifyTime: k = ", k, " outside [0, ", kMaxRecordedK, "]"));
  }
  absl::Status st = CheckSeconds("RecordVerifyTime", seconds);
  if (!st.ok()) return st;
  std::unique_lock lock(mu_);
  costs_[batch_class_].verify.Add(k, seconds, config_.timing_alpha, config_.timing_median);
  return absl::OkStatus();
}

absl::Status SpecController::RecordDirectTime(double seconds) {
  absl::Status st = CheckSeconds("RecordDirectTime", seconds);
  if (!st.ok()) return st;
  std::unique_lock lock(mu_);
  const double alpha = config_.timing_alpha;
  CostModel& c = costs_[batch_class_];
  seconds = MedianFilter(c.direct_recent, seconds, config_.timing_median);
  c.direct_ewma =
      c.direct_ewma.has_value() ? alpha * seconds + (1.0 - alpha) * *c.direct_ewma : seconds;
  return absl::OkStatus();
}

absl::Status SpecController::RecordCatchupTime(int64_t tokens, double seconds) {
  if (tokens < 1) {
    return absl::InvalidArgumentError(absl::StrCat("RecordCatchupTime: tokens = ", tokens, " < 1"));
  }
  absl::Status st = CheckSeconds("RecordCatchupTime", seconds);
  if (!st.ok()) return st;
  std::unique_lock lock(mu_);
  const double rate =
      MedianFilter(catchup_recent_, seconds / static_cast<double>(tokens), config_.timing_median);
  const double alpha = config_.timing_alpha;
  catchup_ewma_ = catchup_ewma_.has_value() ? alpha * rate + (1.0 - alpha) * *catchup_ewma_ : rate;
  return absl::OkStatus();
}

std::optional<double> SpecController::PredictCatchupSeconds(int64_t tokens) const {
  if (tokens <= 0) return 0.0;
  std::shared_lock lock(mu_);
  if (!catchup_ewma_.has_value()) return std::nullopt;
  return *catchup_ewma_ * static_cast<double>(tokens);
}

}  // namespace specnode
