// specnode serve: the node. Loads the target, builds the drafter and the adaptive
// controller, starts the scheduler thread and serves the ZeroMQ protocol of
// docs/protocol.md until SIGINT/SIGTERM, then drains (in-flight requests finish and get
// their replies) and exits 0. Multi-rank configs under mpirun go to serve_cluster.h, whose
// rank 0 comes back here (ServeNode) with a remote target.
#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/scheduler.h"
#include "coordinator/spec_controller.h"
#include "coordinator/spec_engine.h"
#include "kvstore/kv_precision.h"
#include "model/status_macros.h"
#include "node/cli_args.h"
#include "node/cluster_config.h"
#include "node/commands.h"
#include "node/frontend.h"
#include "node/metrics.h"
#include "node/model_session.h"
#include "node/router_config.h"
#include "node/serve_cluster.h"

namespace specnode {
namespace {

constexpr char kHelp[] =
    "usage: specnode serve [--config FILE.yaml] [--model PATH] [--bind ENDPOINT] [options]\n"
    "\n"
    "Serves the ZeroMQ protocol of docs/protocol.md until SIGINT/SIGTERM (then drains and\n"
    "exits 0). Settings come from --config (cluster-configs/, schema in docs/configs.md;\n"
    "default: the embedded cluster-configs/local-cpu.yaml); flags override it.\n"
    "Under mpirun with a multi-rank config, rank 0 serves and ranks 1..T run the\n"
    "tensor-parallel target, e.g. mpirun -np 4 specnode serve --config\n"
    "cluster-configs/mpirun-cpu-tp3.yaml (docs/serving.md, \"Cluster (mpirun)\").\n"
    "  --config FILE       YAML cluster config\n"
    "  --model PATH        target GGUF (default: $SPECNODE_MODEL or the fetch-model cache)\n"
    "  --bind ENDPOINT     ROUTER endpoint (default tcp://127.0.0.1:5555)\n"
    "  --metrics-bind A    HTTP Prometheus endpoint IPV4:PORT (GET /metrics, /health),\n"
    "                      e.g. 127.0.0.1:9464; keep it on loopback (default: off)\n"
    "  --threads N         CPU threads (default: all cores available)\n"
    "  --draft SPEC        drafter: ngram[:N], self:L, a GGUF path, or none (default ngram)\n"
    "  --spec-k K          largest speculation length (default 4)\n"
    "  --router-rules FILE JSON rules naming a request's domain from its prompt\n"
    "  --max-active N      sequences running at once (default 16)\n"
    "  --max-queue N       waiting requests before `overloaded` (default 256)\n"
    "  --max-tokens N      largest max_tokens a request may ask (default 4096)\n"
    "  --max-frame-bytes N largest accepted frame (default 1048576)\n";

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }

// `family`{class="f16"|"int8"|"int4"} for precision class c.
std::string KvClassSeries(const char* family, int c) {
  return absl::StrFormat("%s{class=\"%s\"}", family, KvPrecisionName(static_cast<KvPrecision>(c)));
}

// KV gauges from the targets' KV memory (a runner in this process, or a remote target's
// shards summed); nothing for a target that does not account (the dense reference).
std::map<std::string, double> KvGauges(const std::vector<ModelRunner*>& targets) {
  std::map<std::string, double> g;
  bool any = false;
  double capacity = 0, used = 0, host = 0;
  std::array<double, kKvClasses> bytes{}, tokens{};
  for (const ModelRunner* t : targets) {
    const std::optional<ModelRunner::KvMemory> m = t->Memory();
    if (!m.has_value()) continue;
    any = true;
    capacity += static_cast<double>(m->capacity_bytes);
    used += static_cast<double>(m->used_bytes);
    host += static_cast<double>(m->host_bytes);
    for (int c = 0; c < kKvClasses; ++c) {
      bytes[c] += static_cast<double>(m->class_bytes[c]);
      tokens[c] += static_cast<double>(m->class_tokens[c]);
    }
  }
  if (!any) return g;
  for (int c = 0; c < kKvClasses; ++c) {
    g[KvClassSeries("specnode_kv_bytes", c)] = bytes[c];
    g[KvClassSeries("specnode_kv_tokens", c)] = tokens[c];
  }
  g["specnode_kv_capacity_bytes"] = capacity;  // every target rank's, summed
  g["specnode_kv_used_bytes"] = used;
  g["specnode_kv_host_bytes"] = host;
  return g;
}

// The config (--config FILE, else the embedded local-cpu.yaml) with command-line flags
// applied on top.
absl::StatusOr<ServeConfig> ConfigFromArgs(const CliArgs& args) {
  SPECNODE_ASSIGN_OR_RETURN(ServeConfig c,
                            args.Has("config")
                                ? LoadServeConfig(args.Get("config"))
                                : ParseServeConfig(kEmbeddedLocalCpuConfig, "local-cpu.yaml"));
  auto set_int = [&args](const char* flag, int lo, int hi, int* out) -> absl::Status {
    if (!args.Has(flag)) return absl::OkStatus();
    SPECNODE_ASSIGN_OR_RETURN(int64_t v, args.GetInt(flag, *out, lo, hi));
    *out = static_cast<int>(v);
    return absl::OkStatus();
  };
  SPECNODE_RETURN_IF_ERROR(set_int("threads", 1, 1024, &c.threads));
  SPECNODE_RETURN_IF_ERROR(set_int("spec-k", 1, SpecController::kMaxK, &c.k_max));
  SPECNODE_RETURN_IF_ERROR(set_int("max-active", 1, 4096, &c.max_active));
  SPECNODE_RETURN_IF_ERROR(set_int("max-queue", 0, 1 << 20, &c.max_queue));
  int max_tokens = static_cast<int>(c.limits.max_tokens);
  SPECNODE_RETURN_IF_ERROR(set_int("max-tokens", 1, 1 << 20, &max_tokens));
  c.limits.max_tokens = max_tokens;
  int frame = static_cast<int>(c.limits.max_frame_bytes);
  SPECNODE_RETURN_IF_ERROR(set_int("max-frame-bytes", 256, 1 << 30, &frame));
  c.limits.max_frame_bytes = static_cast<size_t>(frame);
  if (args.Has("model")) c.model = args.Get("model");
  if (args.Has("bind")) c.bind = args.Get("bind");
  if (args.Has("metrics-bind")) {
    c.metrics_bind = args.Get("metrics-bind");
    SPECNODE_RETURN_IF_ERROR(ValidateMetricsAddress(c.metrics_bind));
  }
  if (args.Has("draft")) {
    absl::StatusOr<DraftSpec> d = ParseDraftSpec(args.Get("draft"));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--draft: ", d.status().message()));
    c.draft = *d;
  }
  if (args.Has("router-rules")) c.router_rules_file = args.Get("router-rules");
  if (args.Has("activations")) {
    SPECNODE_ASSIGN_OR_RETURN(c.activations, ActQuantFromArgs(args));
  }
  if (args.Has("device")) {
    SPECNODE_ASSIGN_OR_RETURN(const ComputeOptions compute, ComputeOptionsFromArgs(args));
    c.device = compute.device;
    if (!c.device.is_cpu() && !c.topology.single_process()) {
      return absl::InvalidArgumentError(
          "--device applies to a single-process node; with a topology, set each rank's device "
          "in topology.groups");
    }
  }
  // --kv-* flags override single fields of the config's `kv:` section.
  SPECNODE_RETURN_IF_ERROR(ApplyKvFlags(args, &c.kv));
  c.sla.max_active = c.max_active;
  c.sla.max_queue = c.max_queue;
  if (c.model == "default") c.model = DefaultModelPath();
  if (c.threads == 0) c.threads = DefaultThreads();
  return c;
}

}  // namespace

absl::Status ServeNode(const ServeConfig& cfg, ModelSession* session,
                       std::vector<ServeGroup>& serve_groups, std::vector<RankInfo> ranks) {
  assert(!serve_groups.empty());
  RouterConfig rc;
  rc.default_domain = cfg.default_domain;
  std::unique_ptr<DomainRouter> router;
  if (!cfg.router_rules_file.empty()) {
    SPECNODE_ASSIGN_OR_RETURN(router, LoadRouterRules(cfg.router_rules_file));
  } else {
    SPECNODE_ASSIGN_OR_RETURN(router, DomainRouter::Create(rc));
  }
  const std::string& model_path = cfg.model;
  ModelRunner* target = serve_groups[0].target;

  // One drafter and controller per group (a controller learns its own group's costs).
  std::vector<std::unique_ptr<SpecController>> controllers_owned;
  std::vector<DraftGroup> groups;
  std::vector<std::pair<std::string, const SpecController*>> controllers;  // for metrics
  std::string draft_name = "none";
  for (ServeGroup& g : serve_groups) {
    if (g.drafter == nullptr && !cfg.draft.none()) {
      SPECNODE_ASSIGN_OR_RETURN(g.drafter,
                                MakeDrafter(cfg.draft, session->model(), session->pool(), cfg.kv));
    }
    if (g.drafter == nullptr) {
      groups.push_back({nullptr, nullptr, g.target});
      continue;
    }
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<SpecController> controller,
                              SpecController::Create(ControllerConfigFor(cfg)));
    groups.push_back({g.drafter.get(), controller.get(), g.target});
    draft_name = g.drafter->name();
    controllers.push_back(
        {serve_groups.size() == 1 ? draft_name : g.name + "/" + draft_name, controller.get()});
    controllers_owned.push_back(std::move(controller));
  }
  // One group without a drafter: plain target-only decoding.
  if (groups.size() == 1 && groups[0].drafter == nullptr) groups.clear();
  SpecEngineOptions eo;
  const std::vector<int32_t> eog = session->model().tokenizer().EndOfGenerationIds();
  eo.stop_tokens.insert(eog.begin(), eog.end());
  eo.pool = session->pool();  // sampling of a batch's sequences in parallel
  SpeculativeEngine engine(target, groups, eo);

  SchedulerOptions so = cfg.sla;
  so.max_tokens = cfg.limits.max_tokens;
  // KV gauges over every group's target (each counted once); with several groups, each
  // group's live sequences and sequences started.
  std::vector<std::string> group_names;
  std::vector<ModelRunner*> targets;
  for (const ServeGroup& g : serve_groups) {
    if (groups.size() > 1) group_names.push_back(g.name);
    if (std::find(targets.begin(), targets.end(), g.target) == targets.end()) {
      targets.push_back(g.target);
    }
  }
  so.gauges = [group_names, targets, &engine] {
    std::map<std::string, double> g = KvGauges(targets);
    const std::vector<int> live = engine.GroupLoads();
    const std::vector<int64_t> started = engine.GroupStarts();
    for (size_t i = 0; i < group_names.size() && i < live.size(); ++i) {
      const std::string label = absl::StrFormat("{group=\"%s\"}", group_names[i]);
      g["specnode_group_active_sequences" + label] = live[i];
      g["specnode_group_started_sequences" + label] = static_cast<double>(started[i]);
    }
    return g;
  };

  // Declared before the frontend and the HTTP server: both use it until they are gone.
  MetricsExchange metrics_exchange;
  std::unique_ptr<MetricsHttpServer> metrics_http;
  FrontendOptions fo;
  fo.endpoint = cfg.bind;
  fo.limits = cfg.limits;
  fo.model_name = model_path;
  fo.curve_secret_key = cfg.curve_secret_key;
  fo.ranks = std::move(ranks);
  if (!cfg.metrics_bind.empty()) fo.metrics_exchange = &metrics_exchange;
  std::unique_ptr<Frontend> frontend;
  Scheduler scheduler(&engine, &session->model().tokenizer(), so,
                      [&frontend](GenerationEvent ev) { frontend->OnEvent(std::move(ev)); });
  frontend = std::make_unique<Frontend>(fo, session, router.get(), &scheduler,
                                        [&scheduler, &frontend, controllers] {
                                          SchedulerSnapshot s = scheduler.Snapshot();
                                          // Error replies of the front end (bad input, overloaded,
                                          // ...) and of the scheduler.
                                          for (const auto& [code, n] : frontend->error_counts())
                                            s.errors_by_code[code] += n;
                                          return PrometheusText(s, controllers);
                                        });
  SPECNODE_RETURN_IF_ERROR(frontend->Bind());
  if (!cfg.metrics_bind.empty()) {
    SPECNODE_ASSIGN_OR_RETURN(metrics_http,
                              MetricsHttpServer::Start(cfg.metrics_bind, &metrics_exchange));
  }

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  // The target's backend when it runs here; a remote target's ranks are listed below.
  const std::string compute =
      target == &session->runner() ? session->kernel_name() : session->runner().backend().Describe();
  std::fprintf(
      stderr, "specnode serve: %s on %s (%s, draft %s%s)\n",
      model_path.c_str(), fo.endpoint.c_str(), compute.c_str(), draft_name.c_str(),
      fo.ranks.empty() ? ""
      : serve_groups.size() == 1
          ? absl::StrFormat(", target on %d ranks", fo.ranks.size() - 1).c_str()
          : absl::StrFormat(", %d groups on %d ranks", serve_groups.size(), fo.ranks.size() - 1)
                .c_str());
  std::fprintf(stderr, "specnode serve: config %s\n", cfg.source.c_str());
  if (metrics_http != nullptr) {
    const std::string host = cfg.metrics_bind.substr(0, cfg.metrics_bind.rfind(':'));
    std::fprintf(stderr, "specnode serve: metrics on http://%s:%d/metrics\n", host.c_str(),
                 metrics_http->port());
  }
  absl::Status st = frontend->Run(&g_stop);
  metrics_http.reset();  // before the frontend it asks for renders
  scheduler.Stop();
  frontend.reset();  // closes the socket (lingering up to 0.5 s so the last replies leave)
  std::fprintf(stderr, "specnode serve: %s\n", st.ok() ? "drained, exiting" : "stopped");
  return st;
}

namespace {

absl::Status Run(const CliArgs& args) {
  SPECNODE_ASSIGN_OR_RETURN(const ServeConfig cfg, ConfigFromArgs(args));
  if (NeedsCluster(cfg)) return RunServeCluster(cfg);
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<ModelSession> session,
                            ModelSession::Open(cfg.model, cfg.threads, false, cfg.kv,
                                               ComputeOptions{cfg.activations, cfg.device}));
  std::vector<ServeGroup> groups(1);
  groups[0].name = "local";
  groups[0].target = &session->runner();
  return ServeNode(cfg, session.get(), groups, {});
}

}  // namespace

int RunServe(int argc, char** argv) {
  return RunModelCommand(
      "serve", kHelp, argc, argv,
      {"config", "model", "bind", "metrics-bind", "threads", "draft", "spec-k", "router-rules",
       "max-active", "max-queue", "max-tokens", "max-frame-bytes"},
      {}, Run);
}

}  // namespace specnode
