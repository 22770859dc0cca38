// SpeculativeEngine: runs sequences on a target model, each step drafting K tokens per
// sequence (batched across sequences) and verifying them in one batched target pass of K+1
// positions per sequence, with the exact acceptance rules of acceptance.h.
//
// A sequence moves through two states:
//   prefill — its prompt is fed to the target in chunks under the step's token budget; the
//             last chunk's logits give the first generated token (no drafting);
//   decode  — each step: K from its group's SpecController (0 = direct decoding), drafts
//             from its group's Drafter, one target pass over [last token, drafts...],
//             acceptance, rollback of the target cache to the accepted prefix (the drafter
//             rolls its own back on its next call, see drafter.h), stats to the controller.
// Invariant in decode: the target cache holds every committed token but the last.
//
// Prefill chunks and decode/verify entries of different sequences share one target
// forward, so a scheduler gets continuous batching by choosing which sequences step.
//
// Cost attribution for the controllers: a group's draft time (Propose) is split evenly
// over the sequences it drafted for; catching up on unseen context (Sync) counts in the
// sequences' draft_s but not in the controller's draft-time line, whose intercept it would
// otherwise inflate for every K (see spec_engine.cc); the target pass time is split over the
// sequences in proportion to the tokens each fed (K+1 for a verification), so in a large batch
// speculation is charged for the rows it adds. With one sequence per step (the CLI, the benchmark)
// both are exact. With several targets, a pass is timed from the step's first BeginForward to its
// own EndForward; the passes are ended in order, so a target that finished before an earlier one is
// charged the earlier one's time (an overestimate for the faster group).
//
// Not thread-safe: one thread calls Start/Step/Finish (the scheduler's step loop). The
// target, drafters and controllers are not owned and must outlive the engine.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/acceptance.h"
#include "coordinator/domain_router.h"
#include "coordinator/drafter.h"
#include "coordinator/request_validator.h"
#include "coordinator/spec_controller.h"
#include "coordinator/tree_gain.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/sampling.h"
#include "runtime/model_runner.h"

namespace specnode {

// One drafter with the controller that learns its acceptance per domain, and the target
// that verifies its drafts. In a cluster each group of ranks (a draft + a tensor-parallel
// target) is one DraftGroup with its own target; a sequence stays on its group's target.
struct DraftGroup {
  Drafter* drafter = nullptr;            // null: the group decodes directly (no speculation)
  SpecController* controller = nullptr;  // null exactly when drafter is null
  ModelRunner* target = nullptr;         // null: the engine's target
};

struct SpecEngineOptions {
  // Speculation on: K per step from the group's controller (adaptive, per domain). Off: a
  // fixed K (fixed_k) for every decode step — the "router off" baseline; fixed_k 0 is
  // plain target-only decoding.
  bool adaptive = true;
  int fixed_k = 4;
  // Prompt tokens fed per step in total (prefill chunks), and per sequence per step.
  int32_t prefill_budget = 512;
  // Token ids that end a generation (the tokenizer's end-of-generation set).
  std::set<int32_t> stop_tokens;
  // With several groups, every explore_every-th sequence of a domain goes to the groups in
  // turn instead of the best one, so estimates of groups that lost a domain do not go
  // stale (0 = never).
  int explore_every = 16;
  // How sampled verification accepts drafts (coordinator/acceptance.h). kMatch: a seed's
  // text does not depend on speculation; kRatio: the classic rule.
  AcceptanceRule acceptance = AcceptanceRule::kMatch;
  // Spreads the per-sequence sampling and acceptance of a step over this pool (the one the
  // forward pass uses; idle at that point). nullptr: on the calling thread.
  ThreadPool* pool = nullptr;
  // Prefix caching (ModelRunner::MatchPrefix / PublishPrefix on the sequence's target): a
  // new sequence's prefill starts after the longest cached run of whole pages of its prompt
  // (one token at least is always fed: its logits give the first token); the prompt's pages
  // are published as its prefill goes (after each chunk, before mixed KV demotes them), and
  // every committed token's whole full-precision pages when the sequence is finished (a
  // follow-up turn starts from them). Off: nothing is shared.
  bool prefix_cache = false;
  // The move checks (routing, see SpeculativeEngine); off: a sequence stays on the group it
  // started on.
  bool route_moves = true;
  // Called with one line per routing decision (a sequence's start group, its move check):
  // the domain, each group's rate and bound (DomainRouter::GroupChoice), the choice. For
  // diagnosis (`specnode spec-bench --route-log`); empty = none. Runs on the step thread.
  std::function<void(std::string_view)> route_log;
  // Draft trees (docs/speculative.md "Draft trees"): > 0 lets drafters that build trees
  // (suffix, recycle, a draft model) propose up to this many nodes (at least K, none deeper than
  // K), verified in one target pass with a tree mask and kept along the path the target draws —
  // only with the match rule (or greedy) and where the target takes trees
  // (ModelRunner::TreePasses); else, and at 0, chains. Adaptive, a step verifies the tree
  // only where its domain's measured gain over the main chain pays for the extra rows
  // (tree_gain.h); with a fixed K, or trees_always, every tree is verified.
  int tree_nodes = 0;
  bool trees_always = false;
  // The longest sequence (prompt + max_tokens) a request may take, in tokens: 0 = the
  // target's context length; otherwise at most that (serve.max_model_len; callers check).
  int32_t max_model_len = 0;
};

struct SpecRequest {
  SeqId id = 0;
  std::vector<int32_t> prompt;  // non-empty, ids in the target's vocabulary
  SamplingParams sampling;
  int32_t max_new_tokens = 128;  // >= 1; prompt + max_new_tokens <= target context
  std::string domain = "default";
  bool ignore_stop = false;  // generate through stop tokens
};

enum class FinishReason { kNone, kStop, kLength };

// Per-sequence counters (cumulative).
struct SpecSeqStats {
  int32_t prompt_tokens = 0;
  int32_t generated = 0;
  int32_t steps = 0;                 // decode steps (speculative or direct)
  int32_t spec_steps = 0;            // steps that verified >= 1 draft
  int32_t tree_steps = 0;            // of those, steps that verified a draft tree
  int32_t drafted = 0;               // draft tokens (tree nodes) verified
  int32_t accepted = 0;              // draft tokens accepted
  double draft_s = 0, target_s = 0;  // attributed time
  int32_t cached_tokens = 0;         // prompt tokens taken from the prefix cache
  int32_t group_moves = 0;           // times the router moved it to another group
};

// What one Step did for one sequence.
struct SeqStepResult {
  SeqId id = 0;
  std::vector<int32_t> tokens;  // newly committed tokens (empty while still prefilling)
  int k = 0;                    // drafts (tree nodes) verified this step
  int accepted = 0;
  FinishReason finish = FinishReason::kNone;
};

class SpeculativeEngine {
 public:
  static constexpr int kRouteCheckSteps = 8;        // decode steps between move checks
  static constexpr int kRouteChecks = 4;            // move checks per sequence, at most
  static constexpr double kMoveMargin = 0.1;        // relative gain that moves a sequence
  static constexpr int64_t kMinCatchupSample = 16;  // fewest tokens a catch-up is timed on

  // groups may be empty (a target-only engine). With several groups (routing,
  // coordinator/spec_engine_route.cc):
  //   - each new sequence goes where DomainRouter::ChooseGroupFor says: the best expected
  //     rate over the tokens it is expected to generate, each group's catch-up on its prompt
  //     included (a draft model prefills it), the least loaded target among near-equals;
  //     untried groups first while they could win; every explore_every-th sequence of a
  //     domain re-explores the groups in turn where that could win;
  //   - every kRouteCheckSteps decode steps, up to kRouteChecks times, a sequence is
  //     checked among the groups on its target, and moved at most once: to a first try that
  //     could win (as at the start: once the best known estimate is settled), or to a group
  //     whose rate over what is left beats its own by more than kMoveMargin (a draft model
  //     it leaves frees the sequence; one it joins catches up, which the rate counts);
  //   - shadow scoring: after each step every drafter that is cheap to shadow
  //     (Drafter::CheapToShadow: prompt lookup) replays, for each decoding sequence of
  //     another group on its target, the run it would have made over the tokens committed
  //     so far: from where its simulated run stands, it proposes (at ShadowK) and its
  //     controller records the outcome a verification would have given — the proposal's
  //     matching prefix, one failed position at the first mismatch — then the run moves
  //     past the matched tokens and the target's own next one, as a real step would; a
  //     proposal whose outcome needs tokens not committed yet waits for them. For greedy
  //     decoding that is exactly the run it would have made (steps, proposals, acceptance),
  //     for sampling the same per-position odds. Its proposal rate and draft times are
  //     recorded too, and target timings reach it (RecordTargetTime). Its own sequences'
  //     direct steps (K = 0 chosen: a disabled domain, or one its cost model decodes
  //     directly) are scored the same way, so a domain it sits out stays measured: outcomes
  //     of a disabled domain go to the controller's probe window and re-enable it once they
  //     pass (measured on the held-out summarisation prompts: early disabling after the
  //     summary's first, unmatched tokens had kept fixed-K's 1.4x from the adaptive drafter).
  //     Scoring a proposal only at the other drafter's step boundaries instead measured the
  //     0.5B-served code sequences at 0.80-0.88 per position for prompt lookup, which at its own
  //     steps gets far less (its failures cluster: a wrong copy fails step after step). Its
  //     acceptance per domain is thus learnt on every sequence, without a first try of its own.
  // Groups' targets must share `target`'s vocabulary and context length. Each step begins every
  // target's pass before waiting for any (BeginForward), so targets on different ranks compute
  // together; if one target's pass fails, the others' are rolled back, so a failed Step still
  // changes no sequence.
  SpeculativeEngine(ModelRunner* target, std::vector<DraftGroup> groups, SpecEngineOptions options);
  ~SpeculativeEngine();

  // Registers a sequence (prefill happens in the next Steps). InvalidArgument on a duplicate
  // id, empty prompt, out-of-vocabulary id, bad sampling params, max_new_tokens < 1 or a
  // prompt + max_new_tokens beyond the target's context.
  absl::Status Start(const SpecRequest& request);
  // What a request must fit: the target's vocabulary and context (request_validator.h).
  // The context is options.max_model_len when set.
  RequestLimits limits() const {
    const int32_t len =
        options_.max_model_len > 0 ? options_.max_model_len : target_->max_positions();
    return {target_->vocab_size(), len, len};
  }

  // Advances each listed sequence by one step (prefill chunk or decode step) in one target
  // forward. Unknown or finished ids are InvalidArgument. On an error from a model (e.g. KV
  // memory exhausted) no listed sequence has changed and the step may be retried with fewer
  // sequences. Results in `out`, one per listed id, in order.
  absl::Status Step(std::span<const SeqId> ids, std::vector<SeqStepResult>* out);

  // Forgets a sequence (finished or cancelled) and frees its KV on target and drafter.
  void Finish(SeqId id);

  bool Has(SeqId id) const { return seqs_.count(id) != 0; }

  // KV-aware admission: true when some group's target can hold `tokens` more tokens now,
  // or no target can tell (ModelRunner::Room).
  bool HasRoomFor(int64_t tokens) const;
  // Preemption that keeps the work done: moves a decoding sequence's target KV to the host
  // tier (ModelRunner::SwapOut); its drafter forgets it and catches up after Resume. A
  // parked sequence may not Step. FailedPrecondition while it is prefilling or already
  // parked; otherwise the runner's error (Unimplemented: no host tier; ResourceExhausted:
  // host tier full), and nothing changed.
  absl::Status Park(SeqId id);
  // Brings a parked sequence's KV back. ResourceExhausted when it does not fit now (it stays
  // parked).
  absl::Status Resume(SeqId id);
  bool Parked(SeqId id) const;

  // Liveness of idle targets: every distinct target whose last pass (or ping) ended at
  // least idle_s ago is pinged (ModelRunner::Ping: a remote target's ranks must answer
  // within its deadline), and every drafter every idle_s (Drafter::Ping: a draft model on
  // another rank). Returns the first failure; the scheduler treats it like a step's.
  absl::Status Heartbeat(double idle_s);
  bool Prefilling(SeqId id) const;
  const SpecSeqStats& Stats(SeqId id) const;
  // The committed tokens (prompt + generated).
  std::span<const int32_t> Tokens(SeqId id) const;
  // Which group the router gave the sequence (-1: none).
  int Group(SeqId id) const;
  // Live sequences per group (the router's load signal; metrics).
  std::vector<int> GroupLoads() const;
  // Sequences started per group since the engine was made.
  std::vector<int64_t> GroupStarts() const { return group_starts_; }

 private:
  struct Seq;
  struct Pass;
  void Emit(Seq& s, std::span<const int32_t> tokens, SeqStepResult* result);
  ModelRunner* TargetOf(const Seq& s) const;
  void FreeInDrafters(SeqId id);  // every drafter forgets the sequence
  // Which passes draw on the runner instead of returning rows (Pass::drawn) and their
  // draws, one per row in the pass's row order.
  // One sequence's draws and acceptance on its pass's results (spec_engine_accept.cc):
  // *first_token when the pass ends its prompt, else *outcome (and Seq::kept for a tree).
  // Runs on the pool for different sequences at once: touches only s and its outputs.
  void AcceptSeq(Seq& s, const Pass& pass, size_t row_of, std::vector<float>* p,
                 int32_t* first_token, AcceptOutcome* outcome) const;
  // The node budget of s's next draft (DraftRequest::max_nodes): 0 for chains (trees off,
  // the ratio rule on a sampled sequence, or a target without tree passes).
  int TreeBudget(const Seq& s, int32_t boundary) const;
  // A drafter's proposal into s's plan: a chain cut to K, or a tree cut to depth K and
  // max_nodes nodes with its pass rows (Seq::row_parents, row_depth) — or, adaptive, cut to
  // its main chain where the group's TreeGain says the tree does not pay this step.
  void TakeDraft(Seq& s, Draft& draft, int max_nodes);
  // Scores s's pending trees that its committed tokens now decide into their groups'
  // TreeGain (spec_engine_accept.cc).
  void ScoreTrees(Seq& s);
  void PlanDraws(std::span<Seq* const> seqs, const std::vector<std::vector<int32_t>>& inputs,
                 const std::vector<size_t>& pass_of, std::vector<Pass>& passes);
  // Runs every pass (begin all, then end each); on any failure rolls the others back.
  absl::Status RunPasses(std::vector<Pass>& passes);
  // After a step's commit and shadow scoring: every drafter that recycles the target's
  // candidates (Drafter::ObservedTopK) gets each sequence's pass rows (spec_engine_accept.cc).
  void ObserveTarget(std::span<Seq* const> seqs, const std::vector<std::vector<int32_t>>& inputs,
                     const std::vector<size_t>& pass_of, const std::vector<size_t>& row_of,
                     const std::vector<Pass>& passes);

  // Routing and shadow scoring (spec_engine_route.cc; see the class comment).
  // The group a new sequence starts on.
  int StartGroup(const Seq& s);
  // Every group as an option for s; with same_target_only, only those whose target holds
  // s's KV are eligible.
  std::vector<GroupOption> GroupOptions(const Seq& s, bool same_target_only) const;
  // Tokens s is expected still to generate: what is left of max_new_tokens, capped by the
  // domain's mean answer length so far (domain_tokens_) where known.
  double ExpectedRemaining(const Seq& s) const;
  // A move check (every kRouteCheckSteps decode steps, kRouteChecks at most, until a
  // move): may move s to another group on its target.
  void MaybeMove(Seq& s);
  // After a step's commit: every cheap-to-shadow drafter scores what it would have proposed
  // for the decoded sequences of other groups on its target.
  // Advisory: a failing proposal is skipped (the step has committed).
  void ShadowScore(std::span<Seq* const> seqs, bool has_prefill);
  // Advances group g's simulated run over s's committed tokens (see the class comment).
  void SimulateRun(Seq& s, size_t g, bool has_prefill);
  // A target pass's time for s (k drafts verified; 0: a direct step) into s's group's
  // controller and those of the shadowed groups on the same target (a target cost does
  // not depend on who drafted).
  void RecordTargetTime(const Seq& s, int k, double seconds);
  void NoteGenerated(const Seq& s);  // a finished sequence's answer length into domain_tokens_

  ModelRunner* target_;
  std::vector<DraftGroup> groups_;
  std::vector<ModelRunner*> targets_;  // target_ and every group's, each once
  SpecEngineOptions options_;
  std::map<SeqId, std::unique_ptr<Seq>> seqs_;
  std::map<std::string, int64_t> domain_starts_;  // sequences started per domain
  std::map<std::string, double> domain_tokens_;   // EWMA of tokens generated per sequence
  std::vector<int64_t> group_starts_;             // sequences started per group
  std::map<ModelRunner*, std::chrono::steady_clock::time_point> last_pass_;  // per target
  std::map<Drafter*, std::chrono::steady_clock::time_point> last_draft_ping_;
  std::vector<std::vector<float>> p_;  // per sequence of the step: target distributions
  // Drafters that learn from the target's candidates (each once), and how many a row they
  // want at most (the head's k is raised to it).
  std::vector<Drafter*> observers_;
  int observe_k_ = 0;
  std::vector<TreeGain> tree_gain_;  // per group
};

}  // namespace specnode
