// specnode spec-bench: speculative decoding per drafter and per domain against target-only
// decoding, measured side by side in one process (bench/bench_spec.py drives it and plots).
//
// For every prompt, every configuration generates in turn (interleaved, in an order rotated
// per prompt, so machine noise hits all alike): target-only and a second target-only run
// as a noise control; per drafter with a fixed K ("router off": always
// speculate); per drafter with the adaptive per-domain controller ("router on"); and, with
// several drafters, all of them as groups that the router picks between per domain.
// Controllers persist across prompts, so "router on" learns each domain as a server would.
#include <cstdio>
#include <filesystem>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"
#include "coordinator/domain_router.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/spec_controller.h"
#include "coordinator/spec_engine.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/session/model_session.h"
#include "node/session/router_config.h"
#include "node/session/workload.h"

namespace specnode {
namespace {

constexpr char kHelp[] =
    "usage: specnode spec-bench [--model PATH] --prompts FILE[,FILE...] [options]\n"
    "\n"
    "  --prompts FILES     JSONL prompt sets: one {\"domain\": D, \"prompt\": TEXT} per line\n"
    "  --drafters LIST     comma-separated drafter specs (default ngram,self:20); see\n"
    "                      `specnode generate --help` for the spec syntax\n"
    "  --per-domain N      prompts used per domain (default 8)\n"
    "  --max-tokens N      tokens generated per prompt (default 64)\n"
    "  --spec-k K          K of the fixed-K (\"router off\") runs (default 4)\n"
    "  --k-max K           the adaptive controllers' largest K (default 8)\n"
    "  --temperature T     0 = greedy (default 0); greedy runs, and sampled runs under\n"
    "                      the match rule, also check that every configuration produced\n"
    "                      the target-only tokens\n"
    "  --top-k K --top-p P --seed S  sampling parameters (default 0 = off, 1 = off, 0)\n"
    "  --acceptance RULE   match (default) or ratio: how sampled drafts are accepted\n"
    "  --tree-nodes N      also run each tree-building drafter (all but ngram) with draft\n"
    "                      trees of up to N nodes verified in one pass (\"<name> tree\n"
    "                      fixed|adaptive\"),\n"
    "                      and the router with trees on (default 0: chains only)\n"
    "  --threads N         CPU threads (default: all cores available)\n"
    "  --router-rules FILE name each prompt's domain with these rules (JSON, see\n"
    "                      bench/prompts/router-rules.json) instead of its \"domain\" field;\n"
    "                      results are still grouped by the field, and the rules' accuracy\n"
    "                      is reported\n"
    "  --raw               do not wrap prompts in the chat template\n"
    "  --ignore-eos        decode --max-tokens tokens per prompt, through end-of-generation\n"
    "                      tokens (default: a generation ends there, as it does when served;\n"
    "                      what a model writes past its end is not what users run)\n"
    "  --json              print the results as JSON on stdout (the table goes to stderr)\n"
    "  --route-log         print the router's decisions to stderr: per sequence, each\n"
    "                      drafter's expected rate and a = 1 bound at its start and at its\n"
    "                      move check, and the choice\n";

// One configuration under test: an engine with its drafters and controllers.
struct Config {
  std::string name;     // "target", "ngram:4 fixed", "ngram:4 adaptive", "router"
  std::string drafter;  // spec, or "" (target) / "all" (router)
  bool adaptive = false;
  int tree_nodes = 0;  // SpecEngineOptions::tree_nodes
  std::vector<std::unique_ptr<Drafter>> drafters;
  std::vector<std::unique_ptr<SpecController>> controllers;
  std::unique_ptr<SpeculativeEngine> engine;
};

struct Tally {
  int64_t prompts = 0, tokens = 0, passes = 0, spec_steps = 0, drafted = 0, accepted = 0;
  int64_t tree_steps = 0;
  int64_t identical = 0;
  double decode_s = 0;
  std::map<std::string, int64_t> groups;  // router: sequences per chosen drafter
  // Per sequence: its prompt's index in the run, the drafter the router chose ("" without
  // a router), decoded tokens and decode seconds: what a per-domain miss is attributed by.
  nlohmann::json sequences = nlohmann::json::array();
};

absl::Status AddDrafterGroup(Config& c, const DraftSpec& spec, ModelSession& session,
                             const KvOptions& kv, int k_max) {
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<Drafter> d,
                            MakeDrafter(spec, session.model(), session.pool(), kv));
  SpecControllerConfig cc;
  cc.k_max = k_max;
  cc.k_initial = std::min(k_max, 4);
  cc.probe_k = std::min(cc.probe_k, k_max);
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<SpecController> ctl, SpecController::Create(cc));
  c.drafters.push_back(std::move(d));
  c.controllers.push_back(std::move(ctl));
  return absl::OkStatus();
}

// Generates one prompt on c; returns the tokens and adds to the tally.
absl::StatusOr<std::vector<int32_t>> RunOne(Config& c, const WorkloadPrompt& p, SeqId id,
                                            const SamplingParams& sp, int32_t max_tokens,
                                            bool ignore_eos, Tally* t) {
  SPECNODE_ASSIGN_OR_RETURN(Generation g,
                            GenerateOne(*c.engine, p, id, sp, max_tokens, ignore_eos));
  t->decode_s += g.decode_s;
  const std::string group =
      g.group >= 0 && c.drafters.size() > 1 ? c.drafters[g.group]->name() : std::string();
  if (!group.empty()) t->groups[group]++;
  // The drafter it finished with, and how often the router moved it (SpecSeqStats).
  t->sequences.push_back({{"drafter", group},
                          {"moves", g.stats.group_moves},
                          {"tokens", static_cast<int64_t>(g.tokens.size()) - 1},
                          {"decode_s", g.decode_s}});
  t->prompts++;
  t->tokens += static_cast<int64_t>(g.tokens.size()) - 1;  // the first comes from the prefill
  t->passes += g.stats.steps;
  t->spec_steps += g.stats.spec_steps;
  t->tree_steps += g.stats.tree_steps;
  t->drafted += g.stats.drafted;
  t->accepted += g.stats.accepted;
  return std::move(g.tokens);
}

absl::Status Run(const CliArgs& args) {
  if (!args.Has("prompts")) return absl::InvalidArgumentError("--prompts is required");
  SPECNODE_ASSIGN_OR_RETURN(int64_t per_domain, args.GetInt("per-domain", 8, 1, 100000));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_tokens, args.GetInt("max-tokens", 64, 2, 1 << 16));
  SPECNODE_ASSIGN_OR_RETURN(int64_t spec_k, args.GetInt("spec-k", 4, 1, SpecController::kMaxK));
  SPECNODE_ASSIGN_OR_RETURN(int64_t k_max, args.GetInt("k-max", 8, 1, SpecController::kMaxK));
  SPECNODE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", DefaultThreads(), 1, 1024));
  SPECNODE_ASSIGN_OR_RETURN(int64_t tree_nodes, args.GetInt("tree-nodes", 0, 0, 64));
  SPECNODE_ASSIGN_OR_RETURN(const ComputeOptions compute, ComputeOptionsFromArgs(args));
  SPECNODE_ASSIGN_OR_RETURN(KvOptions kv, KvOptionsFromArgs(args));
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<ModelSession> session,
                            ModelSession::Open(args.Get("model", DefaultModelPath()),
                                               static_cast<int>(threads), false, kv, compute));
  SPECNODE_ASSIGN_OR_RETURN(
      std::vector<WorkloadPrompt> prompts,
      LoadPromptSets(*session, args.Get("prompts"), !args.Has("raw"), per_domain));
  const bool ignore_eos = args.Has("ignore-eos");
  int64_t routed_right = 0;
  if (args.Has("router-rules")) {
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<DomainRouter> router,
                              LoadRouterRules(args.Get("router-rules")));
    for (WorkloadPrompt& p : prompts) {
      p.routed_domain = router->Classify("", p.text);
      routed_right += p.routed_domain == p.domain;
    }
    std::fprintf(stderr, "router rules: %lld of %zu prompts named with their set's domain\n",
                 static_cast<long long>(routed_right), prompts.size());
  }
  SPECNODE_ASSIGN_OR_RETURN(const SamplingParams sp, SamplingFromArgs(args, SamplingParams{}));
  SPECNODE_ASSIGN_OR_RETURN(const AcceptanceRule acceptance, AcceptanceFromArgs(args));
  for (const WorkloadPrompt& p : prompts) {
    SPECNODE_RETURN_IF_ERROR(session->ValidateRequest(p.ids, max_tokens, sp));
  }

  std::vector<DraftSpec> specs;
  for (absl::string_view text :
       absl::StrSplit(args.Get("drafters", "ngram,self:20"), ',', absl::SkipEmpty())) {
    absl::StatusOr<DraftSpec> d = ParseDraftSpec(std::string(text));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--drafters: ", d.status().message()));
    if (d->none()) return absl::InvalidArgumentError("--drafters: none is not a drafter");
    specs.push_back(*d);
  }
  std::vector<std::unique_ptr<Config>> configs;
  configs.push_back(std::make_unique<Config>());
  configs.back()->name = "target";
  for (const DraftSpec& spec : specs) {
    // Chains, and trees where the drafter builds them and --tree-nodes asks.
    std::vector<int> trees = {0};
    const bool builds_trees = spec.kind != DraftSpec::Kind::kNgram;
    if (builds_trees && tree_nodes > 0) trees.push_back(tree_nodes);
    for (int tree : trees) {
      for (bool adaptive : {false, true}) {
        auto c = std::make_unique<Config>();
        c->drafter = spec.text();
        c->adaptive = adaptive;
        c->tree_nodes = tree;
        SPECNODE_RETURN_IF_ERROR(
            AddDrafterGroup(*c, spec, *session, kv, static_cast<int>(adaptive ? k_max : spec_k)));
        c->name = c->drafters[0]->name() + (tree > 0 ? " tree" : "") +
                  (adaptive ? " adaptive" : " fixed");
        configs.push_back(std::move(c));
      }
    }
  }
  // A second target-only configuration: its "speed-up" shows the measurement noise.
  configs.push_back(std::make_unique<Config>());
  configs.back()->name = "target (control)";
  if (specs.size() > 1) {
    auto c = std::make_unique<Config>();
    c->name = "router";
    c->drafter = "all";
    c->adaptive = true;
    c->tree_nodes = static_cast<int>(tree_nodes);
    for (const DraftSpec& spec : specs) {
      SPECNODE_RETURN_IF_ERROR(AddDrafterGroup(*c, spec, *session, kv, static_cast<int>(k_max)));
    }
    configs.push_back(std::move(c));
  }
  const std::vector<int32_t> eog = session->model().tokenizer().EndOfGenerationIds();
  for (auto& c : configs) {
    std::vector<DraftGroup> groups;
    for (size_t i = 0; i < c->drafters.size(); ++i) {
      groups.push_back({c->drafters[i].get(), c->controllers[i].get()});
    }
    SpecEngineOptions options;
    options.adaptive = c->adaptive;
    options.fixed_k = static_cast<int>(spec_k);
    options.tree_nodes = c->tree_nodes;
    options.acceptance = acceptance;
    options.stop_tokens.insert(eog.begin(), eog.end());
    if (args.Has("route-log")) {
      options.route_log = [](std::string_view line) {
        std::fprintf(stderr, "%.*s\n", static_cast<int>(line.size()), line.data());
      };
    }
    c->engine = std::make_unique<SpeculativeEngine>(&session->runner(), groups, options);
  }

  // Warm-up (page cache, allocator): one untimed target-only generation.
  Tally scratch;
  SPECNODE_RETURN_IF_ERROR(
      RunOne(*configs[0], prompts[0], 0, sp, static_cast<int32_t>(max_tokens), ignore_eos, &scratch)
          .status());

  std::map<std::string, std::map<std::string, Tally>> tally;  // config -> domain -> tally
  SeqId next_id = 1;
  for (size_t i = 0; i < prompts.size(); ++i) {
    const WorkloadPrompt& p = prompts[i];
    // Rotate the order per prompt so that no configuration always runs first (cold) or
    // right after another one; compare outputs once all have run.
    std::map<std::string, std::vector<int32_t>> outputs;
    for (size_t j = 0; j < configs.size(); ++j) {
      Config& c = *configs[(i + j) % configs.size()];
      Tally& t = tally[c.name][p.domain];
      SPECNODE_ASSIGN_OR_RETURN(
          outputs[c.name],
          RunOne(c, p, next_id++, sp, static_cast<int32_t>(max_tokens), ignore_eos, &t));
      t.sequences.back()["prompt"] = i;
    }
    for (auto& c : configs) {
      if (outputs[c->name] == outputs["target"]) tally[c->name][p.domain].identical++;
    }
    std::fprintf(stderr, "\rprompt %zu/%zu", i + 1, prompts.size());
  }
  std::fprintf(stderr, "\n");

  // Report: per config and domain, decode speed relative to target-only.
  nlohmann::json out;
  out["model"] = args.Get("model", DefaultModelPath());
  out["max_tokens"] = max_tokens;
  out["spec_k"] = spec_k;
  out["k_max"] = k_max;
  out["temperature"] = sp.temperature;
  out["top_k"] = sp.top_k;
  out["top_p"] = sp.top_p;
  out["seed"] = sp.seed;
  out["acceptance"] = std::string(AcceptanceRuleName(acceptance));
  out["threads"] = threads;
  out["kv_mode"] = std::string(KvModeName(kv.mode));
  out["ignore_eos"] = ignore_eos;
  out["activations"] = ActivationsName(compute);
  if (args.Has("router-rules")) {
    out["router_rules"] = args.Get("router-rules");
    out["router_rules_correct"] = routed_right;
    out["prompts"] = prompts.size();
  }
  std::fprintf(stderr, "%-22s %-10s %8s %8s %8s %8s %9s\n", "config", "domain", "accept", "acc.len",
               "tok/pass", "speedup", "identical");
  for (auto& c : configs) {
    nlohmann::json jc;
    jc["name"] = c->name;
    jc["drafter"] = c->drafter;
    jc["adaptive"] = c->adaptive;
    for (auto& [domain, t] : tally[c->name]) {
      const Tally& base = tally["target"][domain];
      const double tps = t.tokens / std::max(t.decode_s, 1e-9);
      const double base_tps = base.tokens / std::max(base.decode_s, 1e-9);
      nlohmann::json jd;
      jd["prompts"] = t.prompts;
      jd["tokens"] = t.tokens;
      jd["decode_s"] = t.decode_s;
      jd["tokens_per_s"] = tps;
      jd["speedup"] = tps / base_tps;
      jd["target_passes"] = t.passes;
      jd["spec_steps"] = t.spec_steps;
      jd["drafted"] = t.drafted;
      jd["accepted"] = t.accepted;
      jd["acceptance"] = t.drafted ? double(t.accepted) / t.drafted : 0.0;
      jd["mean_accepted_length"] = t.spec_steps ? double(t.accepted) / t.spec_steps : 0.0;
      // Draft trees: the steps that verified one, and drafts (nodes) per verifying step.
      jd["tree_steps"] = t.tree_steps;
      jd["drafts_per_spec_step"] = t.spec_steps ? double(t.drafted) / t.spec_steps : 0.0;
      jd["tokens_per_pass"] = t.passes ? double(t.tokens) / t.passes : 0.0;
      jd["identical_to_target"] = t.identical;
      if (!t.groups.empty()) jd["groups"] = t.groups;
      jd["sequences"] = t.sequences;
      for (size_t g = 0; g < c->controllers.size(); ++g) {
        // The controllers learn per routed domain; without rules that is the label.
        const DomainSnapshot s = c->controllers[g]->Snapshot(domain);
        jd["controller"][c->drafters[g]->name()] = {{"mode", std::string(SpecModeName(s.mode))},
                                                    {"k", s.k},
                                                    {"acceptance", s.acceptance},
                                                    {"proposal_rate", s.proposal_rate},
                                                    {"expected_goodput", s.expected_goodput},
                                                    {"probes", s.probes}};
      }
      jc["domains"][domain] = jd;
      for (size_t g = 0; g < c->controllers.size(); ++g) {
        // The live cost model the adaptive decisions were made with, seconds per pass.
        nlohmann::json model;
        const SpecController& ctl = *c->controllers[g];
        for (int k = 0; k <= ctl.config().k_max; ++k) {
          if (auto v = ctl.PredictVerifySeconds(k)) model["verify_s"].push_back(*v);
          // Index k like verify_s: drafting nothing (k = 0) costs nothing.
          if (auto d = ctl.PredictDraftSeconds(k)) model["draft_s"].push_back(k == 0 ? 0.0 : *d);
        }
        if (auto d = ctl.DirectSeconds()) model["direct_s"] = *d;
        jc["cost_model"][c->drafters[g]->name()] = model;
      }
      std::fprintf(stderr, "%-22s %-10s %7.1f%% %8.2f %8.2f %7.2fx %5lld/%lld\n", c->name.c_str(),
                   domain.c_str(), 100.0 * jd["acceptance"].get<double>(),
                   jd["mean_accepted_length"].get<double>(), jd["tokens_per_pass"].get<double>(),
                   tps / base_tps, static_cast<long long>(t.identical),
                   static_cast<long long>(t.prompts));
    }
    out["configs"].push_back(jc);
  }
  if (args.Has("json")) std::printf("%s\n", out.dump(1).c_str());
  return absl::OkStatus();
}

}  // namespace

int RunSpecBench(int argc, char** argv) {
  return RunModelCommand(
      "spec-bench", kHelp, argc, argv,
      {"model", "prompts", "drafters", "per-domain", "max-tokens", "spec-k", "temperature",
       "threads", "router-rules", "k-max", "top-k", "top-p", "seed", "acceptance", "tree-nodes"},
      {"raw", "json", "ignore-eos", "route-log"}, Run);
}

}  // namespace specnode
