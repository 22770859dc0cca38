// SpecController: the adaptive speculation-length controller. One instance per drafter
// (or per group: one draft rank + its target ranks); it learns, per request domain, how
// often that drafter's proposals are accepted, measures what drafting and verification
// cost on this hardware, and chooses the speculation length K for each sequence's next
// step (K = 0: plain target decoding, no draft).
//
// Acceptance estimate (per domain). A speculative step of length k whose first n drafts
// were accepted evaluated n positions that passed and, when n < k, one that failed (the
// positions after the first rejection were never judged). The per-token acceptance a is
// the geometric maximum-likelihood estimate Σaccepted / Σevaluated over a sliding window
// of the last `window` evaluated positions of that domain (older outcomes are forgotten).
//
// Cost model (per controller, shared by its domains; all times in seconds of wall time,
// measured live by the engine, never hard-coded):
//   RecordDraftTime(k, s)   the drafter proposed k tokens (for the whole step) in s.
//   RecordVerifyTime(k, s)  one target verification pass of k + 1 positions took s.
//   RecordDirectTime(s)     one plain (non-speculative) target decode step took s.
// Each distinct k keeps an EWMA (weight `timing_alpha` on the newest sample) of the
// median of its last `timing_median` samples (a spike filter: on a shared machine a
// preempted pass takes 5-10x its normal time, and one such sample would otherwise bend the
// line for many steps; measured on a loaded 2-core VM: verify EWMAs 4-8x the direct step,
// which turned speculation off everywhere). t_draft(K)
// is a least-squares line c0 + c1·K through the per-k EWMAs, fitted with c0, c1 >= 0 (time
// never falls as K grows; when that fit is infeasible, the better of the flat line and the
// line through the origin), and with a single measured k0, t_draft(K) = t_draft(k0)·K/k0 (a
// model drafter runs one step per token). t_verify(K) = t_direct + c1·K once a direct step
// was timed: a verification of zero drafts is a direct step, timed far more often than any
// single k, so only the slope c1 >= 0 is fitted (least squares through that point; a free
// intercept fitted to noisy per-k samples landed at half the direct time on SmolLM2, with
// twice the real slope). Before any direct step, t_verify is fitted like t_draft but flat
// for a single k0. t_direct is its EWMA; until one is measured, the verify line at K = 0
// stands in for it (a verification pass of one position is a plain decode step).
//   Expected tokens per step   E(K) = (1 − a^(K+1)) / (1 − a)   (K + 1 when a == 1)
//   Speculative goodput        G(K) = E(K) / (t_draft(K) + t_verify(K))   tokens/s
//   Direct goodput             G_direct = 1 / t_direct
// The cost model is "ready" once at least one draft time and one verify time were
// recorded. Until then every speculative decision uses K = k_initial and an "adapt"
// domain speculates (the engine must record both times, also for drafters whose draft
// cost is negligible such as prompt lookup, or K stays at k_initial).
//
// Decision for the next step of a sequence in a domain (ChooseK):
//   warmup    fewer than min_observations evaluated positions: K = k_initial (unless
//             early disabling already judged the domain bad, see early_z), or K = 0 when
//             the drafter can never win (CanNeverWin): the domain is then probed like an
//             adapt-direct one instead of warmed up.
//   free      a >= free_threshold: speculate; K = argmax G(K) over [k_min, k_max], unless
//             plain decoding is faster by more than free_direct_margin (then K = 0, and
//             the domain is probed like an adapt-direct one).
//   adapt     disable_threshold <= a < free_threshold: K = argmax G(K), or 0 (direct)
//             when G(K) < G_direct (G_direct unknown: speculate).
//   disabled  a < disable_threshold: K = 0. The domain stays disabled (sticky) until
//             probing shows it recovered.
//   probing   a disabled domain whose last decision was a probe not yet recorded
//             (reported by Snapshot; cleared by the next RecordStep or direct decision).
// Argmax ties go to the smaller K.
//
// Runs (run_aware). Acceptance is bursty: once a prompt-lookup draft starts copying a span,
// its next drafts are accepted far more often than a fresh guess (measured on SmolLM2 code
// edits: 0.93 after a fully accepted step vs 0.79 otherwise, and 0.5 at the first position
// of a fresh match). So each domain also keeps two more windows, split by whether the
// sequence's previous speculative step had every draft accepted ("in a run") or not
// ("fresh"); when speculating, K = argmax G(K) at the acceptance of the window matching
// the sequence's state, once that window holds min_observations positions (else the
// domain's), and the mode's speculate-or-direct rule (free: direct when slower by more
// than free_direct_margin; adapt: direct when slower) is applied again at that acceptance,
// so a fresh guess that does not pay for its verification goes direct while runs still
// speculate; such direct decisions count towards probes like any other. The mode itself
// (free / adapt / disabled) still follows the domain window.
//
// Probing. Every decision of K = 0 (disabled, or adapt-and-direct) counts as a direct
// step of its domain; after the probe interval of direct steps the next decision is one
// probe step with K = probe_k, and the count restarts. The interval is probe_every, or
// longer when a probe is expensive (probe_overhead_budget). While a domain is disabled its
// speculative outcomes (probes) fill a separate probe window (its last `probe_window`
// evaluated positions; emptied when the domain is disabled); once that holds at least
// min_observations positions with acceptance >= disable_threshold the domain is
// re-enabled and its acceptance window restarts from the probe outcomes (the history
// that disabled it is stale). Outcomes of an adapt-and-direct domain's probes go to its
// normal window.
//
// Domains. Any string (the router's output). At most `max_domains` distinct domains are
// tracked; further new domains share the state of kOverflowDomain.
//
// Thread-safety: every method may be called from any thread; state is guarded by one
// internal mutex (the engine thread records and chooses while a metrics thread takes
// snapshots; readers share the lock). No method throws. Record* return InvalidArgument
// (and change nothing) for out-of-range arguments.
#pragma once

#include <array>
#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <optional>
#include <shared_mutex>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace specnode {

struct SpecControllerConfig {
  double free_threshold = 0.6;     // a >= this: speculate freely
  double disable_threshold = 0.4;  // a < this: disable (direct decoding)
  int k_min = 1;                   // speculative K range, 1 <= k_min <= k_max <= kMaxK
  int k_max = 8;
  int k_initial = 4;          // K in warmup and while the cost model is not ready
  int window = 256;           // evaluated draft positions kept per domain
  int min_observations = 16;  // positions needed before acceptance drives decisions
  int probe_every = 32;       // direct steps between two probe steps
  int probe_k = 2;            // K of a probe step, in [1, k_max]
  int probe_window = 64;      // probe positions kept while disabled, >= min_observations
  // Early disabling: from early_min_observations evaluated positions on, a domain is
  // disabled as soon as the upper confidence bound of its acceptance (Wilson score, z =
  // early_z) is below disable_threshold — 5 straight rejections suffice at z = 1.64, so a
  // bad drafter costs few warm-up steps. early_z = 0 turns this off.
  double early_z = 1.64;
  // A free domain goes direct only when G_direct > (1 + free_direct_margin) · G(K).
  double free_direct_margin = 0.1;
  int early_min_observations = 4;
  // Probing costs (t_draft(probe_k) + t_verify(probe_k) − t_direct) per probe. The probe
  // interval is stretched beyond probe_every so that this extra cost stays within this
  // fraction of the direct decoding time (0 = always probe_every).
  double probe_overhead_budget = 0.02;
  double timing_alpha = 0.2;  // EWMA weight of the newest timing sample, (0, 1]
  int timing_median = 5;      // samples per k in the spike filter, [1, 32] (1 = none)
  int max_domains = 1024;     // distinct domains tracked before kOverflowDomain is shared
  bool run_aware = true;      // choose K from the in-run / fresh windows (see "Runs")
};

// InvalidArgument naming the offending field: thresholds outside [0, 1] or
// disable_threshold > free_threshold; k range outside 1 <= k_min <= k_initial <= k_max <=
// kMaxK; window < 1; min_observations outside [1, window]; probe_every < 1; probe_k
// outside [1, k_max]; probe_window outside [min_observations, window]; timing_alpha
// outside (0, 1]; max_domains < 1.
absl::Status ValidateSpecControllerConfig(const SpecControllerConfig& config);

enum class SpecMode : uint8_t { kWarmup, kFree, kAdapt, kDisabled, kProbing };
std::string_view SpecModeName(SpecMode mode);  // "warmup", "free", "adapt", ...

// One domain's state, for metrics and the router. Counters are lifetime totals.
struct DomainSnapshot {
  std::string domain;
  SpecMode mode = SpecMode::kWarmup;
  double acceptance = 0.0;        // a over the window (0 when window_positions == 0)
  int window_positions = 0;       // evaluated positions currently in the window
  int k = 0;                      // K of the next non-probe decision (0 = direct)
  int k_in_run = 0;               // same, for a sequence in a run (see "Runs")
  double run_acceptance = 0.0;    // over the in-run window
  double fresh_acceptance = 0.0;  // over the fresh window
  double expected_goodput = 0.0;  // ExpectedGoodput(domain), tokens/s; 0 = unknown
  double probe_acceptance = 0.0;  // over the probe window (disabled domains)
  int probe_positions = 0;
  // Of the last `window` steps the drafter was asked to draft for, the share where it
  // proposed anything (RecordProposal; 1 before any): ExpectedGoodput's π.
  double proposal_rate = 1.0;
  int64_t decisions = 0;         // ChooseK calls
  int64_t direct_decisions = 0;  // ChooseK calls that returned 0
  int64_t probes = 0;            // ChooseK calls that returned a probe
  int64_t spec_steps = 0;        // RecordStep calls with k > 0
  int64_t drafted = 0;           // Σ k over those steps
  int64_t accepted = 0;          // Σ accepted over those steps
  int64_t disables = 0;          // times the domain was disabled
  int64_t reenables = 0;         // times probing re-enabled it
};

class SpecController {
 public:
  static constexpr int kMaxK = 64;           // largest k_max
  static constexpr int kMaxRecordedK = 256;  // largest k accepted by Record*
  static constexpr std::string_view kOverflowDomain = "_overflow";

  // InvalidArgument from ValidateSpecControllerConfig.
  static absl::StatusOr<std::unique_ptr<SpecController>> Create(const SpecControllerConfig& config);

  SpecController(const SpecController&) = delete;
  SpecController& operator=(const SpecController&) = delete;

  // K for the next step of one sequence in `domain` (0 = direct target decoding). Call
  // once per sequence per step: direct decisions advance the domain's probe count.
  // in_run: the sequence's previous step was speculative and every draft was accepted.
  int ChooseK(std::string_view domain, bool in_run = false);

  // Outcome of one speculative step of `domain`: k drafts proposed, the first `accepted`
  // of them accepted (0 <= accepted <= k). k == 0 (a direct step) is accepted and
  // ignored. InvalidArgument when k or accepted is out of range. in_run as for ChooseK
  // (the state the step was chosen in).
  absl::Status RecordStep(std::string_view domain, int k, int accepted, bool in_run = false);

  // Whether the drafter, asked for K > 0 drafts in `domain`, proposed any (a prompt-lookup
  // drafter without a match proposes none: that step is then a direct step, which
  // RecordStep ignores). Kept over the domain's last `window` asks.
  void RecordProposal(std::string_view domain, bool proposed);

  // Wall times in seconds (finite, >= 0). k in [1, kMaxRecordedK] for draft, [0,
  // kMaxRecordedK] for verify (a pass over k + 1 positions).
  absl::Status RecordDraftTime(int k, double seconds);
  absl::Status RecordVerifyTime(int k, double seconds);
  absl::Status RecordDirectTime(double seconds);

  // Catch-up: the drafter fed `tokens` context tokens it had not seen (Drafter::Sync: a
  // draft model prefilling a new sequence's prompt, or what it sat out) in `seconds`. Kept
  // as an EWMA of the median of the last timing_median per-token rates, one for the
  // controller (not per batch class: a catch-up is a prefill, batched or not). tokens >= 1.
  // A drafter without state never records one (it never catches up).
  absl::Status RecordCatchupTime(int64_t tokens, double seconds);
  // Predicted seconds to catch up on `tokens` tokens: 0 for tokens <= 0, nullopt while no
  // catch-up was recorded.
  std::optional<double> PredictCatchupSeconds(int64_t tokens) const;

  // Batch regimes. On a CPU a step of one sequence is memory-bound (a draft row is cheap
  // next to the step) while a step of many is compute-bound (a draft row costs as much as a
  // direct row), so one cost model cannot serve both. The controller keeps one per batch
  // class — 1, 2-3, 4-7, 8+ sequences in the step — and SetBatchSize selects the class that
  // later timings are recorded into and K is chosen from, until the next call (class 1
  // initially). A class without timings yet borrows the nearest smaller class's (then the
  // nearest larger's).
  void SetBatchSize(int sequences);
  static constexpr int kBatchClasses = 4;
  static int BatchClass(int sequences);  // 0: 1 (or fewer), 1: 2-3, 2: 4-7, 3: 8+

  // Tokens/s `domain` is expected to get from this drafter under its current decision:
  // when speculating, a step proposes with probability π (RecordProposal) and is otherwise
  // a direct step after the drafting attempt, so
  //   G = (π E(K) + 1 − π) / (t_draft(K) + π t_verify(K) + (1 − π) t_direct)
  // (G(K) when π = 1: a measured prompt-lookup drafter on code matched in ~40% of steps,
  // and rating it by its proposals' acceptance alone put it above the draft model there);
  // G_direct when direct. 0 when unknown (domain never observed, or the timings it needs
  // were never recorded).
  double ExpectedGoodput(std::string_view domain) const;

  // The model's predictions, in seconds; nullopt when nothing was measured.
  std::optional<double> PredictDraftSeconds(int k) const;
  std::optional<double> PredictVerifySeconds(int k) const;
  std::optional<double> DirectSeconds() const;  // measured, else the verify line at 0
  // Whether the domain's estimate rests on enough evidence: at least min_observations
  // evaluated positions or min_observations asks (RecordProposal). The router holds first
  // tries of other drafters back until the best known one is settled (DomainRouter::
  // ChooseGroupFor): a few early steps misjudge a drafter (prompt lookup before the text it
  // will copy begins).
  bool Settled(std::string_view domain) const;
  // The goodput at a = 1 (every draft accepted) at the best K in [k_min, k_max], tokens/s:
  // what no domain can beat, an optimistic bound for a domain never observed (a drafter
  // never verified yet is bounded with a verification as cheap as a direct step). nullopt
  // while the timings it needs are unknown.
  std::optional<double> BestCaseGoodput() const;
  // K to score a counterfactual proposal of this drafter with (the engine's shadow scoring,
  // Drafter::CheapToShadow): the K of the domain's next speculative decision for a sequence
  // in state in_run, or, where the domain decodes directly, the best K at its acceptance
  // (k_initial while unknown). Changes nothing (unlike ChooseK).
  int ShadowK(std::string_view domain, bool in_run) const;
  // True when even every draft accepted (a = 1) at the best K would not beat direct
  // decoding by the live cost model: the drafter costs more per token than it can save
  // (e.g. a deep self-draft on a compute-bound CPU). False while timings are unknown.
  bool CanNeverWin() const;

  // A domain never seen gives the fresh state (mode warmup, K = k_initial, zeros).
  DomainSnapshot Snapshot(std::string_view domain) const;
  // Every tracked domain, sorted by name.
  std::vector<DomainSnapshot> AllDomains() const;

  const SpecControllerConfig& config() const { return config_; }

 private:
  // The last `capacity` evaluated positions (1 = accepted) and their sum.
  struct OutcomeWindow {
    std::deque<uint8_t> bits;
    int accepted = 0;
    void Push(bool ok, int capacity);
    void Clear();
    int size() const { return static_cast<int>(bits.size()); }
    double Acceptance() const;
  };
  struct DomainState {
    OutcomeWindow window;
    OutcomeWindow probe_window;
    OutcomeWindow run_window, fresh_window;  // split of `window` by sequence state
    OutcomeWindow proposals;                 // RecordProposal: 1 = proposed something
    bool disabled = false;
    int direct_since_probe = 0;
    bool probe_in_flight = false;  // last decision was a probe of a disabled domain
    int64_t decisions = 0, direct_decisions = 0, probes = 0, spec_steps = 0;
    int64_t drafted = 0, accepted = 0, disables = 0, reenables = 0;
  };
  // c0 + c1·k through per-k EWMAs (see the header comment).
  struct TimingModel {
    std::map<int, double> ewma;                // k -> seconds
    std::map<int, std::deque<double>> recent;  // k -> last timing_median raw samples
    bool proportional_single = false;          // one point: through the origin (draft) or flat
    void Add(int k, double seconds, double alpha, int median_of);
    // anchor0: a known value at k = 0 (the direct step time, for the verify line).
    std::optional<double> Predict(int k, std::optional<double> anchor0 = std::nullopt) const;
  };
  struct Decision {
    SpecMode mode;
    int k;
  };
  // The timings of one batch class.
  struct CostModel {
    TimingModel draft, verify;
    std::optional<double> direct_ewma;
    std::deque<double> direct_recent;
    bool has_timings() const { return direct_ewma.has_value() || !verify.ewma.empty(); }
  };

  explicit SpecController(const SpecControllerConfig& config);

  // Appends a raw sample to `recent` (keeping the last median_of) and returns their median.
  static double MedianFilter(std::deque<double>& recent, double seconds, int median_of);

  // The helpers below require mu_ held (shared for the const ones, exclusive for StateFor).

  // The batch class's model, or the nearest one with timings (see SetBatchSize).
  const CostModel& CostLocked() const;

  DomainState& StateFor(std::string_view domain);
  const DomainState* FindState(std::string_view domain) const;
  Decision Decide(const DomainState& s) const;
  // d.k refined for a sequence's run state (see "Runs"); d.k when d.k == 0.
  int RunAwareK(const DomainState& s, const Decision& d, bool in_run) const;
  // argmax over [k_min, k_max] of G(K) at acceptance a; nullopt when not ready.
  std::optional<int> BestK(double a) const;
  std::optional<double> GoodputLocked(double a, int k) const;
  std::optional<double> DirectSecondsLocked() const;
  // t_verify(k): the verify line through the timed direct step (see the header comment).
  std::optional<double> VerifySecondsLocked(int k) const;
  // The speculate-or-direct rule of a free or adapt decision at acceptance a and length k:
  // true when plain decoding is faster (free: by more than free_direct_margin). False while
  // the timings it needs are unknown.
  bool DirectWinsLocked(SpecMode mode, double a, int k) const;
  // Direct steps between probes (see probe_overhead_budget).
  int ProbeIntervalLocked() const;
  bool CanNeverWinLocked() const;
  double ExpectedGoodputLocked(const DomainState& s) const;
  // π of ExpectedGoodput: the share of asks the drafter proposed in (1 before any).
  static double ProposalRate(const DomainState& s);
  DomainSnapshot SnapshotLocked(std::string_view name, const DomainState& s) const;

  const SpecControllerConfig config_;
  // Guards everything below. A std::shared_mutex (pthread) rather than absl::Mutex so
  // ThreadSanitizer sees the ordering with the prebuilt (uninstrumented) system absl.
  mutable std::shared_mutex mu_;
  std::map<std::string, DomainState, std::less<>> domains_;
  std::array<CostModel, kBatchClasses> costs_;
  std::optional<double> catchup_ewma_;  // seconds per caught-up token
  std::deque<double> catchup_recent_;
  int batch_class_ = 0;
};

// Upper end of the Wilson score interval for a binomial proportion (successes of trials)
// at normal quantile z; 1 when trials == 0.
double WilsonUpperBound(int successes, int trials, double z);

// Expected tokens per speculative step of length k at per-token acceptance a:
// (1 − a^(k+1)) / (1 − a), k + 1 when a == 1. a is clamped to [0, 1].
double ExpectedTokensPerStep(double a, int k);

}  // namespace specnode
