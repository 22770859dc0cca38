#include "coordinator/spec_controller.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <mutex>
#include <utility>

#include "absl/strings/str_cat.h"

namespace specnode {
namespace {

// Floor on a predicted step cost, so a model fitted through zero never divides by zero.
constexpr double kMinStepSeconds = 1e-9;

absl::Status FieldError(std::string_view field, std::string_view what) {
  return absl::InvalidArgumentError(
      absl::StrCat("SpecControllerConfig.", std::string(field), ": ", std::string(what)));
}

bool InUnit(double x) { return std::isfinite(x) && x >= 0.0 && x <= 1.0; }

}  // namespace

double ExpectedTokensPerStep(double a, int k) {
  if (k <= 0) return 1.0;
  if (!(a > 0.0)) return 1.0;  // also NaN
  if (a >= 1.0) return static_cast<double>(k + 1);
  return (1.0 - std::pow(a, k + 1)) / (1.0 - a);
}

absl::Status ValidateSpecControllerConfig(const SpecControllerConfig& c) {
  if (!InUnit(c.free_threshold)) return FieldError("free_threshold", "must be in [0, 1]");
  if (!InUnit(c.disable_threshold)) return FieldError("disable_threshold", "must be in [0, 1]");
  if (c.disable_threshold > c.free_threshold) {
    return FieldError("disable_threshold", "must be <= free_threshold");
  }
  if (c.k_min < 1) return FieldError("k_min", "must be >= 1");
  if (c.k_max < c.k_min || c.k_max > SpecController::kMaxK) {
    return FieldError("k_max", absl::StrCat("must be in [k_min, ", SpecController::kMaxK, "]"));
  }
  if (c.k_initial < c.k_min || c.k_initial > c.k_max) {
    return FieldError("k_initial", "must be in [k_min, k_max]");
  }
  if (c.window < 1) return FieldError("window", "must be >= 1");
  if (c.min_observations < 1 || c.min_observations > c.window) {
    return FieldError("min_observations", "must be in [1, window]");
  }
  if (c.probe_every < 1) return FieldError("probe_every", "must be >= 1");
  if (c.probe_k < 1 || c.probe_k > c.k_max) return FieldError("probe_k", "must be in [1, k_max]");
  if (c.probe_window < c.min_observations || c.probe_window > c.window) {
    return FieldError("probe_window", "must be in [min_observations, window]");
  }
  if (!std::isfinite(c.timing_alpha) || c.timing_alpha <= 0.0 || c.timing_alpha > 1.0) {
    return FieldError("timing_alpha", "must be in (0, 1]");
  }
  if (c.timing_median < 1 || c.timing_median > 32) {
    return FieldError("timing_median", "must be in [1, 32]");
  }
  if (c.max_domains < 1) return FieldError("max_domains", "must be >= 1");
  if (!(c.free_direct_margin >= 0.0)) return FieldError("free_direct_margin", "must be >= 0");
  if (!(c.early_z >= 0.0 && c.early_z <= 10.0)) return FieldError("early_z", "must be in [0, 10]");
  if (c.early_min_observations < 1) return FieldError("early_min_observations", "must be >= 1");
  if (!(c.probe_overhead_budget >= 0.0 && c.probe_overhead_budget <= 1.0)) {
    return FieldError("probe_overhead_budget", "must be in [0, 1]");
  }
  return absl::OkStatus();
}

std::string_view SpecModeName(SpecMode mode) {
  switch (mode) {
    case SpecMode::kWarmup:
      return "warmup";
    case SpecMode::kFree:
      return "free";
    case SpecMode::kAdapt:
      return "adapt";
    case SpecMode::kDisabled:
      return "disabled";
    case SpecMode::kProbing:
      return "probing";
  }
  return "unknown";
}

// ---- OutcomeWindow ----

void SpecController::OutcomeWindow::Push(bool ok, int capacity) {
  bits.push_back(ok ? 1 : 0);
  accepted += ok ? 1 : 0;
  while (static_cast<int>(bits.size()) > capacity) {
    accepted -= bits.front();
    bits.pop_front();
  }
}

void SpecController::OutcomeWindow::Clear() {
  bits.clear();
  accepted = 0;
}

double SpecController::OutcomeWindow::Acceptance() const {
  return bits.empty() ? 0.0 : static_cast<double>(accepted) / static_cast<double>(bits.size());
}

// ---- SpecController ----

double WilsonUpperBound(int successes, int trials, double z) {
  if (trials <= 0) return 1.0;
  const double n = trials;
  const double p = successes / n;
  const double z2 = z * z;
  const double center = p + z2 / (2 * n);
  const double spread = z * std::sqrt(p * (1 - p) / n + z2 / (4 * n * n));
  return std::min(1.0, (center + spread) / (1 + z2 / n));
}

int SpecController::ProbeIntervalLocked() const {
  int interval = config_.probe_every;
  if (config_.probe_overhead_budget <= 0.0) return interval;
  const std::optional<double> td = CostLocked().draft.Predict(config_.probe_k);
  const std::optional<double> tv = VerifySecondsLocked(config_.probe_k);
  const std::optional<double> t_direct = DirectSecondsLocked();
  if (!td || !tv || !t_direct || *t_direct <= 0.0) return interval;
  const double extra = *td + *tv - *t_direct;
  const double needed = extra / (config_.probe_overhead_budget * *t_direct);
  constexpr double kMaxInterval = 1 << 16;
  return std::max(interval, static_cast<int>(std::ceil(std::min(needed, kMaxInterval))));
}

absl::StatusOr<std::unique_ptr<SpecController>> SpecController::Create(
    const SpecControllerConfig& config) {
  absl::Status status = ValidateSpecControllerConfig(config);
  if (!status.ok()) return status;
  return std::unique_ptr<SpecController>(new SpecController(config));
}

SpecController::SpecController(const SpecControllerConfig& config) : config_(config) {
  for (CostModel& c : costs_) {
    c.draft.proportional_single = true;
    c.verify.proportional_single = false;
  }
}

int SpecController::BatchClass(int sequences) {
  if (sequences <= 1) return 0;
  if (sequences <= 3) return 1;
  if (sequences <= 7) return 2;
  return 3;
}

void SpecController::SetBatchSize(int sequences) {
  std::unique_lock lock(mu_);
  batch_class_ = BatchClass(sequences);
}

const SpecController::CostModel& SpecController::CostLocked() const {
  if (costs_[batch_class_].has_timings()) return costs_[batch_class_];
  for (int c = batch_class_ - 1; c >= 0; --c) {
    if (costs_[c].has_timings()) return costs_[c];
  }
  for (int c = batch_class_ + 1; c < kBatchClasses; ++c) {
    if (costs_[c].has_timings()) return costs_[c];
  }
  return costs_[batch_class_];
}

SpecController::DomainState& SpecController::StateFor(std::string_view domain) {
  auto it = domains_.find(domain);
  if (it != domains_.end()) return it->second;
  if (static_cast<int>(domains_.size()) >= config_.max_domains) {
    domain = kOverflowDomain;
    it = domains_.find(domain);
    if (it != domains_.end()) return it->second;
  }
  return domains_.emplace(std::string(domain), DomainState{}).first->second;
}

const SpecController::DomainState* SpecController::FindState(std::string_view domain) const {
  auto it = domains_.find(domain);
  if (it == domains_.end() && static_cast<int>(domains_.size()) >= config_.max_domains) {
    it = domains_.find(kOverflowDomain);
  }
  return it == domains_.end() ? nullptr : &it->second;
}

std::optional<double> SpecController::VerifySecondsLocked(int k) const {
  const CostModel& c = CostLocked();
  return c.verify.Predict(k, c.direct_ewma);
}

std::optional<double> SpecController::DirectSecondsLocked() const {
  const CostModel& c = CostLocked();
  if (c.direct_ewma.has_value()) return c.direct_ewma;
  std::optional<double> proxy = c.verify.Predict(0);
  if (proxy.has_value() && *proxy > 0.0) return proxy;
  return std::nullopt;
}

std::optional<double> SpecController::GoodputLocked(double a, int k) const {
  if (k == 0) {
    std::optional<double> t = DirectSecondsLocked();
    if (!t.has_value()) return std::nullopt;
    return 1.0 / std::max(*t, kMinStepSeconds);
  }
  std::optional<double> td = CostLocked().draft.Predict(k);
  std::optional<double> tv = VerifySecondsLocked(k);
  if (!td.has_value() || !tv.has_value()) return std::nullopt;
  return ExpectedTokensPerStep(a, k) / std::max(*td + *tv, kMinStepSeconds);
}

std::optional<int> SpecController::BestK(double a) const {
  std::optional<int> best;
  double best_g = -1.0;
  for (int k = config_.k_min; k <= config_.k_max; ++k) {
    std::optional<double> g = GoodputLocked(a, k);
    if (!g.has_value()) return std::nullopt;
    // Strictly better by a relative margin, so float noise does not break ties upward.
    if (!best.has_value() || *g > best_g * (1.0 + 1e-12)) {
      best = k;
      best_g = *g;
    }
  }
  return best;
}

SpecController::Decision SpecController::Decide(const DomainState& s) const {
  if (s.disabled) {
    return {s.probe_in_flight ? SpecMode::kProbing : SpecMode::kDisabled, 0};
  }
  if (s.window.size() < config_.min_observations) {
    // A drafter that loses even with every draft accepted (by the live timings) does not
    // warm a new domain up by speculating: the domain starts direct and is probed at the
    // budgeted rate, like an adapt-direct one (a self-draft's warm-up also prefills its
    // cache over the whole prompt; measured: 4-16% of a domain's decode time).
    if (CanNeverWinLocked()) return {SpecMode::kWarmup, 0};
    return {SpecMode::kWarmup, config_.k_initial};
  }
  const double a = s.window.Acceptance();
  // Free: speculate unless plain decoding is clearly faster. Adapt band (a <
  // disable_threshold disables the domain in RecordStep): speculate only when it pays.
  const SpecMode mode = a >= config_.free_threshold ? SpecMode::kFree : SpecMode::kAdapt;
  const std::optional<int> best = BestK(a);
  if (best.has_value() && DirectWinsLocked(mode, a, *best)) return {mode, 0};
  return {mode, best.value_or(config_.k_initial)};
}

bool SpecController::DirectWinsLocked(SpecMode mode, double a, int k) const {
  const std::optional<double> g = GoodputLocked(a, k);
  const std::optional<double> g_direct = GoodputLocked(a, 0);
  if (!g.has_value() || !g_direct.has_value()) return false;
  // Free domains go direct only when it is faster by more than free_direct_margin (e.g. a
  // well-accepted but nearly target-sized draft); adapt domains whenever it is faster.
  const double margin = mode == SpecMode::kFree ? config_.free_direct_margin : 0.0;
  return *g * (1.0 + margin) < *g_direct;
}

int SpecController::RunAwareK(const DomainState& s, const Decision& d, bool in_run) const {
  if (d.k == 0 || !config_.run_aware || d.mode == SpecMode::kWarmup) return d.k;
  const OutcomeWindow& w = in_run ? s.run_window : s.fresh_window;
  if (w.size() < config_.min_observations) return d.k;
  const double a = w.Acceptance();
  const std::optional<int> best = BestK(a);
  if (!best.has_value()) return d.k;
  // The mode's speculate-or-not rule, at this state's acceptance: a fresh guess in a
  // domain whose runs are long may not pay for its verification on its own.
  return DirectWinsLocked(d.mode, a, *best) ? 0 : *best;
}

int SpecController::ChooseK(std::string_view domain, bool in_run) {
  std::unique_lock lock(mu_);
  DomainState& s = StateFor(domain);
  ++s.decisions;
  const Decision d = Decide(s);
  if (d.k > 0) {
    const int k = RunAwareK(s, d, in_run);
    if (k > 0) return k;
    // Direct for this state only: counted and probed like any direct decision, so the
    // state's window keeps being measured.
  }
  if (s.direct_since_probe >= ProbeIntervalLocked()) {
    s.direct_since_probe = 0;
    ++s.probes;
    s.probe_in_flight = s.disabled;
    return config_.probe_k;
  }
  s.probe_in_flight = false;  // a probe the engine never ran (e.g. clamped to k = 0)
  ++s.direct_since_probe;
  ++s.direct_decisions;
  return 0;
}

absl::Status SpecController::RecordStep(std::string_view domain, int k, int accepted, bool in_run) {
  if (k < 0 || k > kMaxRecordedK) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordStep: k = ", k, " outside [0, ", kMaxRecordedK, "]"));
  }
  if (accepted < 0 || accepted > k) {
    return absl::InvalidArgumentError(
        absl::StrCat("RecordStep: accepted = ", accepted, " outside [0, k = ", k, "]"));
  }
  if (k == 0) return absl::OkStatus();
  std::unique_lock lock(mu_);
  DomainState& s = StateFor(domain);
  ++s.spec_steps;
  s.drafted += k;
  s.accepted += accepted;
  const bool has_failure = accepted < k;
  if (s.disabled) {
    s.probe_in_flight = false;
    for (int i = 0; i < accepted; ++i) s.probe_window.Push(true, config_.probe_window);
    if (has_failure) s.probe_window.Push(false, config_.probe_window);
    if (s.probe_window.size() >= config_.min_observations &&
        s.probe_window.Acceptance() >= config_.disable_threshold) {
      // Recovered: the pre-disable history is stale; restart the window from the probes.
      s.disabled = false;
      ++s.reenables;
      s.window.Clear();
      s.run_window.Clear();
      s.fresh_window.Clear();
      for (uint8_t bit : s.probe_window.bits) s.window.Push(bit != 0, config_.window);
      s.probe_window.Clear();
      s.direct_since_probe = 0;
      s.probe_in_flight = false;
    }
    return absl::OkStatus();
  }
  OutcomeWindow& split = in_run ? s.run_window : s.fresh_window;
  for (int i = 0; i < accepted; ++i) {
    s.window.Push(true, config_.window);
    split.Push(true, config_.window);
  }
  if (has_failure) {
    s.window.Push(false, config_.window);
    split.Push(false, config_.window);
  }
  const bool judged = s.window.size() >= config_.min_observations;
  const bool judged_early = !judged && config_.early_z > 0.0 &&
                            s.window.size() >= config_.early_min_observations &&
                            WilsonUpperBound(s.window.accepted, s.window.size(), config_.early_z) <
                                config_.disable_threshold;
  if (judged_early || (judged && s.window.Acceptance() < config_.disable_threshold)) {
    s.disabled = true;
    ++s.disables;
    s.probe_window.Clear();
    s.direct_since_probe = 0;
    s.probe_in_flight = false;
  }
  return absl::OkStatus();
}

double SpecController::ExpectedGoodputLocked(const DomainState& s) const {
  const Decision d = Decide(s);
  if (d.k == 0) {
    // Direct, but paying for probes now and then: a group whose probes are expensive is
    // worth a little less than plain decoding (so the router prefers cheap probers).
    const std::optional<double> g = GoodputLocked(0.0, 0);
    if (!g.has_value()) return 0.0;
    const std::optional<double> td = CostLocked().draft.Predict(config_.probe_k);
    const std::optional<double> tv = VerifySecondsLocked(config_.probe_k);
    const std::optional<double> t_direct = DirectSecondsLocked();
    if (!td || !tv || !t_direct || *t_direct <= 0.0) return *g;
    // A drafter with state (a draft model) also catches up, at each probe, on the tokens
    // decoded since the last one: what makes a direct draft-model group worth less than a
    // direct prompt-lookup one.
    const int interval = ProbeIntervalLocked();
    const double catchup = catchup_ewma_.value_or(0.0) * interval;
    const double extra = std::max(0.0, *td + *tv - *t_direct) + catchup;
    return *g / (1.0 + extra / (interval * *t_direct));
  }
  // Never observed. (Asked but never proposing — a prompt-lookup drafter finding no match
  // in a domain — is observed: π = 0, every step direct after the drafting attempt.)
  if (s.window.size() == 0 && s.proposals.size() == 0) return 0.0;
  const std::optional<double> td = CostLocked().draft.Predict(d.k);
  const std::optional<double> tv = VerifySecondsLocked(d.k);
  // π = 1 (or no direct time to weigh the other steps with) is G(K) = E(K) / (t_draft +
  // t_verify), GoodputLocked's.
  const std::optional<double> t_direct = DirectSecondsLocked();
  const double pi = t_direct.has_value() ? ProposalRate(s) : 1.0;
  // A drafter that never proposed was never verified: at π = 0 no verification is needed.
  if (!td || (!tv && pi > 0.0)) return 0.0;
  const double tokens = pi * ExpectedTokensPerStep(s.window.Acceptance(), d.k) + (1.0 - pi);
  const double seconds = *td + pi * tv.value_or(0.0) + (1.0 - pi) * t_direct.value_or(0.0);
  return tokens / std::max(seconds, kMinStepSeconds);
}

bool SpecController::Settled(std::string_view domain) const {
  std::shared_lock lock(mu_);
  const DomainState* s = FindState(domain);
  return s != nullptr && (s->window.size() >= config_.min_observations ||
                          s->proposals.size() >= config_.min_observations);
}

double SpecController::ProposalRate(const DomainState& s) {
  return s.proposals.size() > 0 ? s.proposals.Acceptance() : 1.0;
}

void SpecController::RecordProposal(std::string_view domain, bool proposed) {
  std::unique_lock lock(mu_);
  StateFor(domain).proposals.Push(proposed, config_.window);
}

bool SpecController::CanNeverWin() const {
  std::shared_lock lock(mu_);
  return CanNeverWinLocked();
}

bool SpecController::CanNeverWinLocked() const {
  const std::optional<double> direct = GoodputLocked(1.0, 0);
  if (!direct.has_value()) return false;
  for (int k = config_.k_min; k <= config_.k_max; ++k) {
    const std::optional<double> g = GoodputLocked(1.0, k);
    if (!g.has_value() || *g > *direct) return false;
  }
  return true;
}

std::optional<double> SpecController::BestCaseGoodput() const {
  std::shared_lock lock(mu_);
  std::optional<double> best;
  for (int k = config_.k_min; k <= config_.k_max; ++k) {
    const std::optional<double> td = CostLocked().draft.Predict(k);
    // Never verified (a drafter that never proposed): a verification costs at least a
    // direct step, which keeps the bound optimistic.
    std::optional<double> tv = VerifySecondsLocked(k);
    if (!tv.has_value()) tv = DirectSecondsLocked();
    if (!td.has_value() || !tv.has_value()) return std::nullopt;
    const double g = (k + 1) / std::max(*td + *tv, kMinStepSeconds);
    best = std::max(best.value_or(0.0), g);
  }
  return best;
}

int SpecController::ShadowK(std::string_view domain, bool in_run) const {
  std::shared_lock lock(mu_);
  const DomainState* s = FindState(domain);
  if (s == nullptr) return config_.k_initial;
  int k = RunAwareK(*s, Decide(*s), in_run);
  if (k == 0 && s->window.size() > 0) k = BestK(s->window.Acceptance()).value_or(0);
  return k > 0 ? k : config_.k_initial;
}

double SpecController::ExpectedGoodput(std::string_view domain) const {
  std::shared_lock lock(mu_);
  const DomainState* s = FindState(domain);
  if (s == nullptr) return 0.0;
  return ExpectedGoodputLocked(*s);
}

std::optional<double> SpecController::PredictDraftSeconds(int k) const {
  std::shared_lock lock(mu_);
  return CostLocked().draft.Predict(k);
}

std::optional<double> SpecController::PredictVerifySeconds(int k) const {
  std::shared_lock lock(mu_);
  return VerifySecondsLocked(k);
}

std::optional<double> SpecController::DirectSeconds() const {
  std::shared_lock lock(mu_);
  return DirectSecondsLocked();
}

DomainSnapshot SpecController::SnapshotLocked(std::string_view name, const DomainState& s) const {
  DomainSnapshot snap;
  snap.domain = std::string(name);
  const Decision d = Decide(s);
  snap.mode = d.mode;
  snap.k = RunAwareK(s, d, false);
  snap.k_in_run = RunAwareK(s, d, true);
  snap.run_acceptance = s.run_window.Acceptance();
  snap.fresh_acceptance = s.fresh_window.Acceptance();
  snap.acceptance = s.window.Acceptance();
  snap.window_positions = s.window.size();
  snap.expected_goodput = ExpectedGoodputLocked(s);
  snap.probe_acceptance = s.probe_window.Acceptance();
  snap.probe_positions = s.probe_window.size();
  snap.proposal_rate = ProposalRate(s);
  snap.decisions = s.decisions;
  snap.direct_decisions = s.direct_decisions;
  snap.probes = s.probes;
  snap.spec_steps = s.spec_steps;
  snap.drafted = s.drafted;
  snap.accepted = s.accepted;
  snap.disables = s.disables;
  snap.reenables = s.reenables;
  return snap;
}

DomainSnapshot SpecController::Snapshot(std::string_view domain) const {
  std::shared_lock lock(mu_);
  const DomainState* s = FindState(domain);
  if (s == nullptr) {
    static const DomainState kFresh;
    return SnapshotLocked(domain, kFresh);
  }
  return SnapshotLocked(domain, *s);
}

std::vector<DomainSnapshot> SpecController::AllDomains() const {
  std::shared_lock lock(mu_);
  std::vector<DomainSnapshot> out;
  out.reserve(domains_.size());
  for (const auto& [name, state] : domains_) out.push_back(SnapshotLocked(name, state));
  return out;
}

}  // namespace specnode
