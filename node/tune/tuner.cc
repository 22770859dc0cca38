#include "node/tune/tuner.h"

#include <yaml-cpp/yaml.h>

#include <algorithm>
#include <cassert>
#include <cmath>
#include <cstdint>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "model/cpu/act_quant.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

const char* RequestedActivations(std::optional<ActQuant> a) {
  if (!a.has_value()) return "default";
  return *a == ActQuant::kInt8 ? "int8" : "int16";
}

// The stack's switches in their "off" position: what the baseline runs and what the tuned
// YAML states for every one of them the tuner did not keep. Activations are a CPU option (a
// GPU always runs int16 and refuses int8).
std::vector<TuneOption> OffSettings(const ServeConfig& base) {
  std::vector<TuneOption> off = {{"speculation.draft", "none"},
                                 {"speculation.alternatives", ""},
                                 {"speculation.tree_nodes", "0"},
                                 {"kv.mode", "full"}};
  if (base.device.is_cpu()) off.push_back({"model.activations", "int16"});
  return off;
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::sort(v.begin(), v.end());
  const size_t m = v.size() / 2;
  return v.size() % 2 ? v[m] : 0.5 * (v[m - 1] + v[m]);
}

}  // namespace

std::vector<TuneOption> DefaultTuneStack(const ServeConfig& base, int n_layers) {
  using Goal = TuneOption::Goal;
  std::vector<TuneOption> stack;
  // The base's own drafter first when it is a model file (or an n-gram / self variant the
  // stack would not try).
  const bool stock = base.draft.none() || base.draft == DraftSpec{};
  if (!stock) stack.push_back({"speculation.draft", base.draft.text(), Goal::kLatency, false});
  stack.push_back({"speculation.draft", "ngram", Goal::kLatency, false});
  if (n_layers >= 3) {
    const int layers = std::max(1, (2 * n_layers) / 3);
    const std::string self = absl::StrCat("self:", layers);
    if (self != base.draft.text()) {
      stack.push_back({"speculation.draft", self, Goal::kLatency, false});
    }
  }
  // Prompt lookup beside a model or self draft, the router choosing per domain (a kept
  // n-gram draft skips it: already the current setting).
  stack.push_back({"speculation.alternatives", "ngram", Goal::kLatency, false});
  if (base.k_max < 8) stack.push_back({"speculation.k_max", "8", Goal::kLatency, false});
  // Cheap drafts (a GPU target verifies extra rows for ~5% of a step) pay at acceptances
  // the default threshold switches off: let the cost model decide down to 0.2.
  if (base.disable_threshold > 0.2) {
    stack.push_back({"speculation.disable_threshold", "0.2", Goal::kLatency, false});
  }
  // Draft trees where a verification row is cheap (a GPU: ~0.07 of a step on an H200); on a
  // CPU a row costs 0.15-0.4 of a step and trees lose to their chains (bench/README.md).
  if (!base.device.is_cpu()) {
    stack.push_back({"speculation.tree_nodes", "8", Goal::kLatency, false});
  }
  if (base.device.is_cpu()) {
    stack.push_back({"model.activations", "int8", Goal::kLatency, true});
    stack.push_back({"kv.mode", "mixed", Goal::kMemory, true});
  }
  return stack;
}

absl::Status ApplyTuneOption(const TuneOption& o, ServeConfig* c) {
  if (o.key == "speculation.draft") {
    absl::StatusOr<DraftSpec> d = ParseDraftSpec(o.value);
    if (!d.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("speculation.draft: ", d.status().message()));
    }
    c->draft = *d;
  } else if (o.key == "speculation.alternatives") {
    absl::StatusOr<std::vector<DraftSpec>> alts = ParseAlternatives(o.value, c->topology);
    if (!alts.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculation.alternatives: ", alts.status().message()));
    }
    // Beside an n-gram draft, n-gram alternatives add nothing.
    c->alternatives.clear();
    for (const DraftSpec& d : *alts) {
      if (!(d == c->draft)) c->alternatives.push_back(d);
    }
  } else if (o.key == "speculation.k_max") {
    int k = 0;
    if (!absl::SimpleAtoi(o.value, &k) || k < 1 || k > 64) {
      return absl::InvalidArgumentError("speculation.k_max: expected an integer in [1, 64]");
    }
    c->k_max = k;
  } else if (o.key == "speculation.tree_nodes") {
    int n = 0;
    if (!absl::SimpleAtoi(o.value, &n) || n < 0 || n > 64) {
      return absl::InvalidArgumentError("speculation.tree_nodes: expected an integer in [0, 64]");
    }
    c->tree_nodes = n;
  } else if (o.key == "speculation.disable_threshold") {
    double t = 0;
    if (!absl::SimpleAtod(o.value, &t) || !(t >= 0 && t <= c->free_threshold)) {
      return absl::InvalidArgumentError(
          "speculation.disable_threshold: expected a number in [0, free_threshold]");
    }
    c->disable_threshold = t;
  } else if (o.key == "model.activations") {
    ActQuant act;
    if (!ParseActQuant(o.value, &act)) {
      return absl::InvalidArgumentError("model.activations: expected int16 or int8");
    }
    c->activations = act;
  } else if (o.key == "kv.mode") {
    absl::StatusOr<KvMode> mode = ParseKvMode(o.value);
    if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("kv.mode: ", mode.status().message()));
    c->kv.mode = *mode;
  } else {
    return absl::InvalidArgumentError(absl::StrCat("the tuner does not vary ", o.key));
  }
  return absl::OkStatus();
}

ServeConfig TuneBaseline(const ServeConfig& base) {
  ServeConfig c = base;
  for (const TuneOption& off : OffSettings(base)) {
    [[maybe_unused]] const absl::Status s = ApplyTuneOption(off, &c);
    assert(s.ok());  // our own literals
  }
  return c;
}

std::string TuneKey(const ServeConfig& c) {
  std::vector<std::string> alts;
  for (const DraftSpec& d : c.alternatives) alts.push_back(d.text());
  return absl::StrCat("draft=", c.draft.text(), alts.empty() ? "" : "+", absl::StrJoin(alts, "+"),
                      " k_max=", c.k_max,
                      c.tree_nodes > 0 ? absl::StrCat(" trees=", c.tree_nodes) : "",
                      " disable=", absl::StrFormat("%g", c.disable_threshold),
                      " kv=", std::string(KvModeName(c.kv.mode)),
                      " activations=", RequestedActivations(c.activations));
}

TuneDecision DecideTuneStep(const TuneOption& o, double speedup, double memory_ratio,
                            double accuracy, const TuneCriteria& c) {
  if (accuracy < c.accuracy) {
    return {false,
            absl::StrFormat("top-1 agreement %.3f below the budget %.3f", accuracy, c.accuracy)};
  }
  if (o.goal == TuneOption::Goal::kLatency) {
    if (speedup >= 1.0 + c.min_gain) {
      return {true, absl::StrFormat("%.2fx decode tokens/s", speedup)};
    }
    return {false, absl::StrFormat("%.2fx decode tokens/s, less than the %.2fx asked", speedup,
                                   1.0 + c.min_gain)};
  }
  if (memory_ratio <= 0) return {false, "KV bytes per token unknown for this target"};
  if (memory_ratio > 1.0 - c.min_gain) {
    return {false, absl::StrFormat("KV bytes per token x%.2f, less than the %.0f%% saving asked",
                                   memory_ratio, 100 * c.min_gain)};
  }
  if (speedup < 1.0 - c.min_gain) {
    return {false, absl::StrFormat("KV bytes per token x%.2f but %.2fx decode tokens/s",
                                   memory_ratio, speedup)};
  }
  return {true, absl::StrFormat("KV bytes per token x%.2f at %.2fx decode tokens/s", memory_ratio,
                                speedup)};
}

absl::StatusOr<TuneResult> TuneStack(const ServeConfig& base, const std::vector<TuneOption>& stack,
                                     TuneMeasurer& measurer, const TuneCriteria& criteria,
                                     const std::function<void(const std::string&)>& log) {
  if (criteria.rounds < 1 || !(criteria.min_gain >= 0 && criteria.min_gain < 1) ||
      !(criteria.accuracy >= 0 && criteria.accuracy <= 1)) {
    return absl::InvalidArgumentError("tune: rounds >= 1, min_gain in [0, 1), accuracy in [0, 1]");
  }
  auto say = [&](const std::string& line) {
    if (log) log(line);
  };
  TuneResult result;
  result.baseline = TuneBaseline(base);
  SPECNODE_ASSIGN_OR_RETURN(const TuneMeasurement reference, measurer.Measure(result.baseline));
  result.baseline_tokens_per_s = reference.tokens_per_s;
  result.baseline_kv_bytes = reference.kv_bytes_per_token;
  say(absl::StrFormat("baseline (%s): %.1f tokens/s, %.0f KV bytes/token", TuneKey(result.baseline),
                      reference.tokens_per_s, reference.kv_bytes_per_token));
  // The machine's noise: the baseline against itself, as many paired rounds as an option
  // gets. No option is kept for a gain this comparison could show by chance.
  for (int r = 0; r < criteria.rounds; ++r) {
    SPECNODE_ASSIGN_OR_RETURN(const TuneMeasurement a, measurer.Measure(result.baseline));
    SPECNODE_ASSIGN_OR_RETURN(const TuneMeasurement b, measurer.Measure(result.baseline));
    const double ratio = a.tokens_per_s > 0 ? b.tokens_per_s / a.tokens_per_s : 1.0;
    result.noise = std::max(result.noise, std::abs(ratio - 1.0));
  }
  TuneCriteria effective = criteria;
  effective.min_gain = std::min(0.5, std::max(criteria.min_gain, result.noise));
  result.min_gain = effective.min_gain;
  say(
      absl::StrFormat("noise: baseline vs itself within %.1f%% over %d rounds; options must "
                      "gain %.1f%%",
                      100 * result.noise, criteria.rounds, 100 * effective.min_gain));

  ServeConfig current = result.baseline;
  double current_accuracy = 1.0;
  for (const TuneOption& option : stack) {
    TuneStep step;
    step.option = option;
    ServeConfig candidate = current;
    SPECNODE_RETURN_IF_ERROR(ApplyTuneOption(option, &candidate));
    if (absl::StartsWith(option.key, "speculation.") && option.key != "speculation.draft" &&
        current.draft.none()) {  // alternatives too: they join a draft
      step.skipped = "no drafter kept";
    } else if (TuneKey(candidate) == TuneKey(current)) {
      step.skipped = "already the current setting";
    }
    if (!step.skipped.empty()) {
      say(absl::StrCat(option.name(), ": skipped (", step.skipped, ")"));
      result.steps.push_back(std::move(step));
      continue;
    }
    step.tried = true;
    std::vector<double> cur_tps, cand_tps, cur_kv, cand_kv, memory;
    for (int r = 0; r < criteria.rounds; ++r) {
      // Alternate which configuration runs first, so drift hits both alike.
      TuneMeasurement a, b;
      if (r % 2 == 0) {
        SPECNODE_ASSIGN_OR_RETURN(a, measurer.Measure(current));
        SPECNODE_ASSIGN_OR_RETURN(b, measurer.Measure(candidate));
      } else {
        SPECNODE_ASSIGN_OR_RETURN(b, measurer.Measure(candidate));
        SPECNODE_ASSIGN_OR_RETURN(a, measurer.Measure(current));
      }
      cur_tps.push_back(a.tokens_per_s);
      cand_tps.push_back(b.tokens_per_s);
      cur_kv.push_back(a.kv_bytes_per_token);
      cand_kv.push_back(b.kv_bytes_per_token);
      step.speedups.push_back(a.tokens_per_s > 0 ? b.tokens_per_s / a.tokens_per_s : 0);
      memory.push_back(a.kv_bytes_per_token > 0 ? b.kv_bytes_per_token / a.kv_bytes_per_token : 0);
      say(absl::StrFormat("%s round %d: %.1f vs %.1f tokens/s (x%.3f)", option.name(), r + 1,
                          b.tokens_per_s, a.tokens_per_s, step.speedups.back()));
    }
    step.current_tokens_per_s = Median(cur_tps);
    step.candidate_tokens_per_s = Median(cand_tps);
    step.current_kv_bytes = Median(cur_kv);
    step.candidate_kv_bytes = Median(cand_kv);
    step.speedup = Median(step.speedups);
    step.memory_ratio = Median(memory);
    if (option.changes_output) {
      SPECNODE_ASSIGN_OR_RETURN(step.accuracy, measurer.Agreement(candidate, reference.outputs));
    } else {
      step.accuracy = current_accuracy;
    }
    step.decision =
        DecideTuneStep(option, step.speedup, step.memory_ratio, step.accuracy, effective);
    say(absl::StrFormat("%s: %s (%s; top-1 agreement %.3f)", option.name(),
                        step.decision.keep ? "kept" : "rejected", step.decision.reason,
                        step.accuracy));
    if (step.decision.keep) {
      current = candidate;
      current_accuracy = step.accuracy;
      // A later option on the same key replaces an earlier one (self-draft after n-gram).
      std::erase_if(result.kept, [&](const TuneOption& k) { return k.key == option.key; });
      result.kept.push_back(option);
    }
    result.steps.push_back(std::move(step));
  }
  // The baseline (every switch off) plus what was kept.
  result.tuned = result.baseline;
  for (const TuneOption& k : result.kept) {
    SPECNODE_RETURN_IF_ERROR(ApplyTuneOption(k, &result.tuned));
  }
  result.tuned_accuracy = current_accuracy;
  return result;
}

absl::StatusOr<std::string> TunedYaml(const std::string& base_yaml,
                                      const std::vector<TuneOption>& kept,
                                      const std::string& model_path, const std::string& header) {
  YAML::Node root;
  try {
    root = YAML::Load(base_yaml);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("base config: ", e.what()));
  }
  if (!root.IsMap()) return absl::InvalidArgumentError("base config: not a YAML mapping");
  absl::StatusOr<ServeConfig> base = ParseServeConfig(base_yaml, "base config");
  if (!base.ok()) return base.status();
  // Every stack key gets an explicit value: the kept option's, else the baseline's (off).
  std::vector<TuneOption> settings = OffSettings(*base);
  for (const TuneOption& k : kept) {
    auto same = [&](const TuneOption& s) { return s.key == k.key; };
    auto it = std::find_if(settings.begin(), settings.end(), same);
    if (it != settings.end()) {
      it->value = k.value;
    } else {
      settings.push_back(k);
    }
  }
  if (!model_path.empty()) settings.push_back({"model.target", model_path});
  for (const TuneOption& s : settings) {
    const std::vector<std::string> path = absl::StrSplit(s.key, '.');
    if (path.size() != 2) return absl::InternalError("tune: bad key " + s.key);
    if (!root[path[0]] || !root[path[0]].IsMap()) root[path[0]] = YAML::Node(YAML::NodeType::Map);
    // Integers stay integers in the emitted YAML (k_max), strings are quoted as needed.
    int as_int = 0;
    double as_double = 0;
    if (s.key == "speculation.alternatives") {  // a list, empty when off
      YAML::Node list(YAML::NodeType::Sequence);
      for (absl::string_view v : absl::StrSplit(s.value, ',', absl::SkipEmpty())) {
        list.push_back(std::string(v));
      }
      list.SetStyle(YAML::EmitterStyle::Flow);
      root[path[0]][path[1]] = list;
    } else if (absl::SimpleAtoi(s.value, &as_int) && s.key != "model.target") {
      root[path[0]][path[1]] = as_int;
    } else if (absl::SimpleAtod(s.value, &as_double) && s.key != "model.target") {
      root[path[0]][path[1]] = as_double;
    } else {
      root[path[0]][path[1]] = s.value;
    }
  }
  YAML::Emitter out;
  out << root;
  if (!out.good()) return absl::InternalError(absl::StrCat("tune: YAML: ", out.GetLastError()));
  std::string text;
  for (absl::string_view line : absl::StrSplit(header, '\n', absl::SkipEmpty())) {
    absl::StrAppend(&text, "# ", line, "\n");
  }
  absl::StrAppend(&text, out.c_str(), "\n");
  absl::StatusOr<ServeConfig> check = ParseServeConfig(text, "tuned config");
  if (!check.ok()) {
    return absl::InternalError(
        absl::StrCat("tune: the tuned YAML does not parse: ", check.status().message()));
  }
  return text;
}

}  // namespace specnode
