// specnode tune: tries a serve config's optimisations one at a time against a measured
// baseline on a prompt workload and writes the tuned config (node/tuner.h, docs/tune.md).
//
// Measurements run in this process, as `spec-bench` does: one ModelSession per (KV mode,
// activations) pair and one adaptive controller per configuration, kept across rounds so a
// configuration is measured warm, as in a server that has been running; drafters are
// fresh on every pass (see EngineMeasurer::Measure).
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/spec_controller.h"
#include "coordinator/spec_engine.h"
#include "model/llama/sampling.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"
#include "node/cli/cli_args.h"
#include "node/serve/cluster_config.h"
#include "node/cli/commands.h"
#include "node/session/model_session.h"
#include "node/tune/tuner.h"
#include "node/session/workload.h"

namespace specnode {
namespace {

constexpr char kHelp[] =
    "usage: specnode tune [--config FILE.yaml] [--model PATH] --prompts FILE[,FILE...]\n"
    "                     --out TUNED.yaml [options]\n"
    "\n"
    "Measures the config with every optimisation off (no drafter, f16 KV, int16\n"
    "activations), then tries each optimisation on top of those kept so far: the n-gram\n"
    "drafter, a self-draft, k_max 8, int8 activations, mixed-precision KV. One is kept\n"
    "when it brings --min-gain (decode tokens/s, or KV bytes per token for the KV mode)\n"
    "and the target's top-1 agreement with the baseline's greedy output stays >=\n"
    "--accuracy. Writes the config with the kept settings and a JSON report (docs/tune.md).\n"
    "\n"
    "  --config FILE       base config (default: the embedded cluster-configs/local-cpu.yaml);\n"
    "                      a single-process config (no topology)\n"
    "  --model PATH        target GGUF (default: the config's model.target); written into\n"
    "                      the tuned config when given\n"
    "  --prompts FILES     JSONL prompt sets, {\"domain\": D, \"prompt\": TEXT} per line\n"
    "                      (e.g. bench/prompts/*.jsonl): the workload to tune for\n"
    "  --per-domain N      prompts per domain (default 2)\n"
    "  --max-tokens N      tokens generated per prompt (default 64)\n"
    "  --rounds N          paired measurements per option (default 3)\n"
    "  --min-gain X        relative gain an option must bring (default 0.03)\n"
    "  --accuracy X        least top-1 agreement with the baseline (default 0.97)\n"
    "  --threads N         CPU threads (default: the config's model.threads)\n"
    "  --raw               do not wrap prompts in the chat template\n"
    "  --out FILE          the tuned YAML\n"
    "  --report FILE       the JSON report (default: print it on stdout)\n";

// Controllers per configuration over sessions per (KV mode, activations).
class EngineMeasurer final : public TuneMeasurer {
 public:
  explicit EngineMeasurer(int32_t max_tokens) : max_tokens_(max_tokens) {}

  // Loads the workload (encoded with the tokenizer of `baseline`'s session, the session the
  // baseline measurement then uses) and checks every prompt fits the context. Returns the
  // model's layer count.
  absl::StatusOr<int> Prepare(const ServeConfig& baseline, const std::string& files, bool chat,
                              int64_t per_domain) {
    SPECNODE_ASSIGN_OR_RETURN(ModelSession * s, Session(baseline));
    SPECNODE_ASSIGN_OR_RETURN(prompts_, LoadPromptSets(*s, files, chat, per_domain));
    for (const WorkloadPrompt& p : prompts_) {
      SPECNODE_RETURN_IF_ERROR(s->ValidateRequest(p.ids, max_tokens_));
    }
    return s->model().config().n_layers;
  }

  absl::StatusOr<TuneMeasurement> Measure(const ServeConfig& c) override {
    SPECNODE_ASSIGN_OR_RETURN(Setup * setup, GetSetup(c));
    // A fresh drafter (and engine) per pass: the n-gram drafter's domain history would
    // otherwise hold this very workload's outputs from the previous pass and predict them
    // perfectly, which no server sees. The controller stays: acceptance and timings learnt
    // on earlier passes are what a running server has.
    // The draft, then its alternatives (the router chooses per domain), one controller each.
    std::vector<DraftGroup> groups;
    std::vector<std::unique_ptr<Drafter>> drafters;
    if (!c.draft.none()) {
      std::vector<DraftSpec> specs = {c.draft};
      specs.insert(specs.end(), c.alternatives.begin(), c.alternatives.end());
      for (size_t i = 0; i < specs.size(); ++i) {
        SPECNODE_ASSIGN_OR_RETURN(
            std::unique_ptr<Drafter> d,
            MakeDrafter(specs[i], setup->session->model(), setup->session->pool(), c.kv));
        groups.push_back({d.get(), setup->controllers[i].get()});
        drafters.push_back(std::move(d));
      }
    }
    SpecEngineOptions eo;
    eo.acceptance = c.acceptance;
    const std::vector<int32_t> eog = setup->session->model().tokenizer().EndOfGenerationIds();
    eo.stop_tokens.insert(eog.begin(), eog.end());
    SpeculativeEngine engine(&setup->session->runner(), groups, eo);
    TuneMeasurement m;
    double decode_s = 0, kv_bytes = 0, kv_positions = 0;
    int64_t tokens = 0;
    SamplingParams greedy;
    greedy.temperature = 0;
    if (!setup->warm) {
      // A configuration's first pass would pay for page faults on a new session's weights
      // and KV pages: one untimed target-only generation first (not through `engine`, whose
      // drafter would then remember the prompt's output).
      SpeculativeEngine plain(&setup->session->runner(), {}, eo);
      SPECNODE_RETURN_IF_ERROR(GenerateOne(plain, prompts_[0], next_id_++, greedy, max_tokens_,
                                           /*ignore_eos=*/false)
                                   .status());
      setup->warm = true;
    }
    for (const WorkloadPrompt& p : prompts_) {
      SPECNODE_ASSIGN_OR_RETURN(Generation g,
                                GenerateOne(engine, p, next_id_++, greedy, max_tokens_,
                                            /*ignore_eos=*/false, &setup->session->runner()));
      decode_s += g.decode_s;
      tokens += static_cast<int64_t>(g.tokens.size()) - 1;  // the first is the prefill's
      if (g.kv_bytes) {
        kv_bytes += static_cast<double>(*g.kv_bytes);
        kv_positions += g.kv_positions;
      }
      m.outputs.push_back(std::move(g.tokens));
    }
    m.tokens_per_s = decode_s > 0 ? tokens / decode_s : 0;
    m.kv_bytes_per_token = kv_positions > 0 ? kv_bytes / kv_positions : 0;
    return m;
  }

  absl::StatusOr<double> Agreement(const ServeConfig& c,
                                   const std::vector<std::vector<int32_t>>& reference) override {
    SPECNODE_ASSIGN_OR_RETURN(ModelSession * s, Session(c));
    ModelRunner& runner = s->runner();
    int64_t match = 0, total = 0;
    std::vector<float> logits;
    for (size_t i = 0; i < prompts_.size() && i < reference.size(); ++i) {
      const std::vector<int32_t>& ref = reference[i];
      if (ref.empty()) continue;
      const SeqId seq = next_id_++;
      // Teacher-forced: the prompt, then each reference token, one decode step at a time,
      // so the cache ages (and, in mixed mode, demotes) as it does while generating.
      BatchEntry e{seq, prompts_[i].ids, false};
      absl::Status st = runner.Forward(std::span<const BatchEntry>(&e, 1), &logits);
      for (size_t j = 0; st.ok(); ++j) {
        match += ArgMax(logits) == ref[j];
        ++total;
        if (j + 1 >= ref.size()) break;
        e.tokens = std::span<const int32_t>(&ref[j], 1);
        st = runner.Forward(std::span<const BatchEntry>(&e, 1), &logits);
      }
      runner.Free(seq);
      SPECNODE_RETURN_IF_ERROR(st);
    }
    return total > 0 ? static_cast<double>(match) / total : 1.0;
  }

 private:
  struct Setup {
    ModelSession* session = nullptr;
    // One per drafter (the draft, then its alternatives); none without a drafter.
    std::vector<std::unique_ptr<SpecController>> controllers;
    bool warm = false;
  };

  absl::StatusOr<ModelSession*> Session(const ServeConfig& c) {
    const std::string tune_key = TuneKey(c);
    const std::string key = tune_key.substr(tune_key.find(" kv="));  // kv mode + activations
    auto it = sessions_.find(key);
    if (it != sessions_.end()) return it->second.get();
    SPECNODE_ASSIGN_OR_RETURN(
        std::unique_ptr<ModelSession> s,
        ModelSession::Open(c.model, c.threads, false, c.kv,
                           ComputeOptions{c.activations, c.device, c.chat_template}));
    ModelSession* raw = s.get();
    sessions_[key] = std::move(s);
    return raw;
  }

  absl::StatusOr<Setup*> GetSetup(const ServeConfig& c) {
    const std::string key = TuneKey(c);
    auto it = setups_.find(key);
    if (it != setups_.end()) return it->second.get();
    auto setup = std::make_unique<Setup>();
    SPECNODE_ASSIGN_OR_RETURN(setup->session, Session(c));
    const size_t drafters = c.draft.none() ? 0 : 1 + c.alternatives.size();
    for (size_t i = 0; i < drafters; ++i) {
      SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<SpecController> controller,
                                SpecController::Create(ControllerConfigFor(c)));
      setup->controllers.push_back(std::move(controller));
    }
    Setup* raw = setup.get();
    setups_[key] = std::move(setup);
    return raw;
  }

  std::vector<WorkloadPrompt> prompts_;
  int32_t max_tokens_;
  SeqId next_id_ = 1;
  std::map<std::string, std::unique_ptr<ModelSession>> sessions_;
  std::map<std::string, std::unique_ptr<Setup>> setups_;
};

// Fails now rather than after minutes of measuring when `path` cannot be written; leaves
// no file behind.
absl::Status CheckWritable(const std::string& path) {
  std::error_code ec;
  const bool existed = std::filesystem::exists(path, ec);
  {
    std::ofstream f(path, std::ios::app);
    if (!f) return absl::InvalidArgumentError(absl::StrCat("cannot write ", path));
  }
  if (!existed) std::filesystem::remove(path, ec);
  return absl::OkStatus();
}

nlohmann::json StepJson(const TuneStep& s) {
  nlohmann::json j;
  j["option"] = s.option.name();
  j["goal"] = s.option.goal == TuneOption::Goal::kLatency ? "latency" : "memory";
  j["changes_output"] = s.option.changes_output;
  j["tried"] = s.tried;
  if (!s.tried) {
    j["skipped"] = s.skipped;
    return j;
  }
  j["speedups"] = s.speedups;
  j["speedup"] = s.speedup;
  j["tokens_per_s"] = {{"current", s.current_tokens_per_s},
                       {"candidate", s.candidate_tokens_per_s}};
  j["kv_bytes_per_token"] = {{"current", s.current_kv_bytes}, {"candidate", s.candidate_kv_bytes}};
  j["memory_ratio"] = s.memory_ratio;
  j["top1_agreement"] = s.accuracy;
  j["kept"] = s.decision.keep;
  j["reason"] = s.decision.reason;
  return j;
}

absl::Status Run(const CliArgs& args) {
  if (!args.Has("prompts")) return absl::InvalidArgumentError("--prompts is required");
  if (!args.Has("out")) return absl::InvalidArgumentError("--out is required");
  SPECNODE_RETURN_IF_ERROR(CheckWritable(args.Get("out")));
  if (args.Has("report")) SPECNODE_RETURN_IF_ERROR(CheckWritable(args.Get("report")));
  SPECNODE_ASSIGN_OR_RETURN(int64_t per_domain, args.GetInt("per-domain", 2, 1, 100000));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_tokens, args.GetInt("max-tokens", 64, 2, 1 << 16));
  TuneCriteria criteria;
  SPECNODE_ASSIGN_OR_RETURN(int64_t rounds, args.GetInt("rounds", 3, 1, 100));
  criteria.rounds = static_cast<int>(rounds);
  SPECNODE_ASSIGN_OR_RETURN(criteria.min_gain, args.GetDouble("min-gain", 0.03, 0.0, 0.99));
  SPECNODE_ASSIGN_OR_RETURN(criteria.accuracy, args.GetDouble("accuracy", 0.97, 0.0, 1.0));

  // The base config and the text it came from (the tuned YAML keeps its other keys).
  std::string base_text = kEmbeddedLocalCpuConfig;
  std::string source = "(embedded local-cpu.yaml)";
  if (args.Has("config")) {
    source = args.Get("config");
    std::ifstream in(source);
    if (!in) return absl::NotFoundError(absl::StrCat("cannot open ", source));
    std::stringstream ss;
    ss << in.rdbuf();
    base_text = ss.str();
  }
  SPECNODE_ASSIGN_OR_RETURN(ServeConfig base, ParseServeConfig(base_text, source));
  if (!base.topology.single_process()) {
    return absl::InvalidArgumentError(
        absl::StrCat(source,
                     ": tune measures in one process; tune a single-process config (no topology) "
                     "with the same model and copy the tuned speculation / kv / model keys"));
  }
  if (args.Has("model")) base.model = args.Get("model");
  if (base.model == "default") base.model = DefaultModelPath();
  SPECNODE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", base.threads, 0, 1024));
  base.threads = threads == 0 ? DefaultThreads() : static_cast<int>(threads);

  EngineMeasurer measurer(static_cast<int32_t>(max_tokens));
  SPECNODE_ASSIGN_OR_RETURN(
      const int n_layers,
      measurer.Prepare(TuneBaseline(base), args.Get("prompts"), !args.Has("raw"), per_domain));
  const std::vector<TuneOption> stack = DefaultTuneStack(base, n_layers);
  SPECNODE_ASSIGN_OR_RETURN(TuneResult result,
                            TuneStack(base, stack, measurer, criteria, [](const std::string& line) {
                              std::fprintf(stderr, "tune: %s\n", line.c_str());
                            }));

  std::vector<std::string> kept_names, rejected;
  for (const TuneOption& k : result.kept) kept_names.push_back(k.name());
  for (const TuneStep& s : result.steps) {
    if (s.tried && !s.decision.keep) rejected.push_back(s.option.name());
  }
  std::time_t now = std::time(nullptr);
  char date[32];
  std::strftime(date, sizeof date, "%Y-%m-%d %H:%M", std::localtime(&now));
  const std::string header =
      absl::StrCat("specnode tune, ", date, ", from ", source, " on ", base.model, "\n",
                   "kept: ", kept_names.empty() ? "nothing" : absl::StrJoin(kept_names, ", "), "\n",
                   "rejected: ", rejected.empty() ? "nothing" : absl::StrJoin(rejected, ", "), "\n",
                   "(comments of the base config are not kept; the report has the measurements)");
  SPECNODE_ASSIGN_OR_RETURN(
      const std::string yaml,
      TunedYaml(base_text, result.kept, args.Has("model") ? base.model : "", header));
  {
    std::ofstream out(args.Get("out"));
    out << yaml;
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", args.Get("out")));
  }

  nlohmann::json report;
  report["base_config"] = source;
  report["model"] = base.model;
  report["device"] = base.device.name();
  report["threads"] = base.threads;
  report["criteria"] = {{"min_gain", criteria.min_gain},
                        {"accuracy", criteria.accuracy},
                        {"rounds", criteria.rounds}};
  report["workload"] = {
      {"prompts", args.Get("prompts")}, {"per_domain", per_domain}, {"max_tokens", max_tokens}};
  report["noise"] = {{"baseline_vs_itself", result.noise}, {"min_gain_applied", result.min_gain}};
  report["baseline"] = {{"settings", TuneKey(result.baseline)},
                        {"tokens_per_s", result.baseline_tokens_per_s},
                        {"kv_bytes_per_token", result.baseline_kv_bytes}};
  for (const TuneStep& s : result.steps) report["steps"].push_back(StepJson(s));
  report["tuned"] = {{"settings", TuneKey(result.tuned)},
                     {"kept", kept_names},
                     {"top1_agreement", result.tuned_accuracy},
                     {"config", args.Get("out")}};
  if (args.Has("report")) {
    std::ofstream out(args.Get("report"));
    out << report.dump(1) << "\n";
    if (!out) return absl::InternalError(absl::StrCat("cannot write ", args.Get("report")));
  } else {
    std::printf("%s\n", report.dump(1).c_str());
  }
  std::fprintf(stderr, "tune: wrote %s (%s)\n", args.Get("out").c_str(),
               TuneKey(result.tuned).c_str());
  return absl::OkStatus();
}

}  // namespace

int RunTune(int argc, char** argv) {
  auto args = CliArgs::Parse(argc, argv,
                             {"config", "model", "prompts", "per-domain", "max-tokens", "rounds",
                              "min-gain", "accuracy", "threads", "out", "report"},
                             {"raw", "help"});
  if (!args.ok()) {
    std::fprintf(stderr, "specnode tune: %s\n%s", std::string(args.status().message()).c_str(),
                 kHelp);
    return 2;
  }
  if (args->Has("help")) {
    std::printf("%s", kHelp);
    return 0;
  }
  absl::Status s = Run(*args);
  if (!s.ok()) {
    std::fprintf(stderr, "specnode tune: %s\n", std::string(s.message()).c_str());
    return 1;
  }
  return 0;
}

}  // namespace specnode
