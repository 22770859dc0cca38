// `specnode tune`: a serve config's optimisations, switched on one at a time against a
// measured baseline (docs/tune.md).
//
// The baseline is the user's config with every optimisation of the stack off (no drafter,
// f16 KV, int16 activations): the most exact configuration. Each optimisation of the stack
// is then tried on top of the ones kept so far, measured side by side with the current
// configuration over the same workload (rounds alternate which runs first), and kept only
// when it pays for its goal and the output stays within the accuracy budget. "Pays" is
// judged against the machine's noise, measured first as the baseline against itself: the
// gain asked, g, is max(min_gain, the largest deviation of that A/A comparison).
//   * latency options (a drafter, a larger K, int8 activations): decode tokens/s must rise
//     by at least g (median over the rounds of candidate / current);
//   * memory options (mixed-precision KV): KV bytes per cached token must fall by at least
//     g, and tokens/s must not fall by more than g;
//   * accuracy: top-1 agreement of the candidate's target, teacher-forced on the baseline's
//     greedy outputs, must be >= the budget. Options that cannot change the target's output
//     (speculative decoding is exact) keep the current configuration's agreement.
//
// The algorithm (TuneStack) talks to a TuneMeasurer, so it is tested with scripted
// measurements; the command (cmd_tune.cc) measures real generations.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "node/serve/cluster_config.h"

namespace specnode {

// One optimisation: a config key and the value that turns it on.
struct TuneOption {
  enum class Goal { kLatency, kMemory };
  std::string key;    // "speculation.draft", "speculation.k_max",
                      // "speculation.disable_threshold", "model.activations", "kv.mode"
  std::string value;  // "ngram", "self:20", "8", "int8", "mixed"
  Goal goal = Goal::kLatency;
  bool changes_output = false;  // false: the target's tokens cannot change (exact speculation)
  std::string name() const { return key + "=" + value; }
};

// The stack for `base` on a model of `n_layers` layers, in the order tried: base's own
// drafter when it is not "none" or "ngram" (a draft model file, ngram:N, self:L), n-gram drafter,
// self-draft of 2/3 of the layers, k_max 8 (when base's k_max is below it),
// disable_threshold 0.2 (when base's is above it: cheap drafts pay at lower acceptance), int8
// activations and mixed KV (the last two on the CPU only: a GPU target keeps f16 KV and f32
// activations).
std::vector<TuneOption> DefaultTuneStack(const ServeConfig& base, int n_layers);

// Sets o's key in c. InvalidArgument for a key the tuner does not know or a bad value.
absl::Status ApplyTuneOption(const TuneOption& o, ServeConfig* c);

// base with every stack option off: draft none, kv.mode full, activations int16.
ServeConfig TuneBaseline(const ServeConfig& base);

// A stable text naming the settings the stack varies (draft, k_max, disable threshold, kv
// mode, activations):
// equal configurations give equal keys (measurers cache engines by it).
std::string TuneKey(const ServeConfig& c);

struct TuneCriteria {
  double min_gain = 0.03;  // relative improvement an option must bring
  double accuracy = 0.97;  // least top-1 agreement with the baseline
  int rounds = 3;          // paired measurements per option
};

struct TuneDecision {
  bool keep = false;
  std::string reason;
};

// The rule above, for an option measured at `speedup` (candidate / current tokens/s),
// `memory_ratio` (candidate / current KV bytes per token) and `accuracy`.
TuneDecision DecideTuneStep(const TuneOption& o, double speedup, double memory_ratio,
                            double accuracy, const TuneCriteria& c);

// What one pass over the workload with one configuration gives.
struct TuneMeasurement {
  double tokens_per_s = 0;                    // decode tokens/s (prefills excluded)
  double kv_bytes_per_token = 0;              // target KV bytes per cached position (0 = unknown)
  std::vector<std::vector<int32_t>> outputs;  // per prompt, greedy
};

class TuneMeasurer {
 public:
  virtual ~TuneMeasurer() = default;
  // Generates the whole workload with c. A measurer may keep state per configuration
  // between calls (a server's warmed-up controllers), which the rounds then measure warm.
  virtual absl::StatusOr<TuneMeasurement> Measure(const ServeConfig& c) = 0;
  // Top-1 agreement in [0, 1] of c's target with `reference` (per prompt, the tokens the
  // baseline generated), teacher-forced: each position sees the reference's prefix.
  virtual absl::StatusOr<double> Agreement(const ServeConfig& c,
                                           const std::vector<std::vector<int32_t>>& reference) = 0;
};

struct TuneStep {
  TuneOption option;
  bool tried = false;
  std::string skipped;           // why not tried (tried == false)
  std::vector<double> speedups;  // per round, candidate / current tokens/s
  double current_tokens_per_s = 0, candidate_tokens_per_s = 0;  // medians over the rounds
  double current_kv_bytes = 0, candidate_kv_bytes = 0;          // per token, medians
  double speedup = 0, memory_ratio = 0, accuracy = 0;
  TuneDecision decision;
};

struct TuneResult {
  ServeConfig baseline;
  // Largest |ratio - 1| of the baseline measured against itself (criteria.rounds pairs),
  // and the gain options had to bring: max(criteria.min_gain, noise), at most 0.5.
  double noise = 0, min_gain = 0;
  ServeConfig tuned;  // base + every kept option
  double baseline_tokens_per_s = 0, baseline_kv_bytes = 0;
  double tuned_accuracy = 1.0;
  std::vector<TuneStep> steps;
  std::vector<TuneOption> kept;
};

// Runs the stack. `log` (may be empty) receives a line per measurement.
absl::StatusOr<TuneResult> TuneStack(const ServeConfig& base, const std::vector<TuneOption>& stack,
                                     TuneMeasurer& measurer, const TuneCriteria& criteria,
                                     const std::function<void(const std::string&)>& log);

// The tuned config as YAML: `base_yaml` (the text the base config was read from) with the
// kept options' keys set, and `model_path`, when non-empty, as model.target; a comment
// header says what was kept. The result parses as a ServeConfig (checked; Internal if not).
absl::StatusOr<std::string> TunedYaml(const std::string& base_yaml,
                                      const std::vector<TuneOption>& kept,
                                      const std::string& model_path, const std::string& header);

}  // namespace specnode
