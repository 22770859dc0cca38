// ServeNode: what `specnode serve` runs once the target is there (in this process, or
// remote ranks under mpirun): the drafters and controllers, the speculative engine, the
// scheduler, the ZeroMQ front end and the optional HTTP metrics, until SIGINT/SIGTERM,
// then the drain.
#include "node/serve/serve_node.h"

#include <signal.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cassert>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/scheduler.h"
#include "coordinator/spec_controller.h"
#include "coordinator/spec_engine.h"
#include "kvstore/kv_precision.h"
#include "model/gguf/gguf_reader.h"
#include "model/status_macros.h"
#include "nlohmann/json.hpp"
#include "node/serve/frontend.h"
#include "node/serve/http_server.h"
#include "node/serve/kv_event_publisher.h"
#include "node/serve/metrics.h"
#include "node/serve/metrics_http.h"
#include "node/serve/openai_routes.h"
#include "node/serve/startup_summary.h"
#include "node/session/router_config.h"

namespace specnode {
namespace {

std::atomic<bool> g_stop{false};

void OnSignal(int) { g_stop.store(true); }
// mpirun's teardown (Ctrl-C in its terminal, SIGINT/SIGTERM to mpirun): OpenMPI sends every
// rank SIGCONT at once, SIGTERM odls_base_sigkill_timeout (T) seconds later and SIGKILL after
// another T. Under mpirun rank 0 takes the SIGCONT as the start of it and drains within 2T.
std::atomic<bool> g_teardown{false};
void OnTeardown(int) {
  g_teardown.store(true);
  g_stop.store(true);
}

// `family`{class="f16"|"int8"|"int4"} for precision class c.
std::string KvClassSeries(const char* family, int c) {
  return absl::StrFormat("%s{class=\"%s\"}", family, KvPrecisionName(static_cast<KvPrecision>(c)));
}

// KV gauges from the targets' KV memory (a runner in this process, or a remote target's
// shards summed); nothing for a target that does not account (the dense reference).
std::map<std::string, double> KvGauges(const std::vector<ModelRunner*>& targets) {
  std::map<std::string, double> g;
  bool any = false, all_tokens = true, all_host = true, all_cache = true;
  double capacity = 0, used = 0, host = 0, cache_only = 0;
  std::array<double, kKvClasses> bytes{}, tokens{};
  for (const ModelRunner* t : targets) {
    const std::optional<ModelRunner::KvMemory> m = t->Memory();
    if (!m.has_value()) continue;
    any = true;
    capacity += static_cast<double>(m->capacity_bytes);
    used += static_cast<double>(m->used_bytes);
    for (int c = 0; c < kKvClasses; ++c) bytes[c] += static_cast<double>(m->class_bytes[c]);
    // Series a target cannot tell are left out rather than reported as zero.
    if (m->class_tokens.has_value()) {
      for (int c = 0; c < kKvClasses; ++c) tokens[c] += static_cast<double>((*m->class_tokens)[c]);
    } else {
      all_tokens = false;
    }
    if (m->cache_only_bytes.has_value()) {
      cache_only += static_cast<double>(*m->cache_only_bytes);
    } else {
      all_cache = false;
    }
    if (m->host_bytes.has_value()) {
      host += static_cast<double>(*m->host_bytes);
    } else {
      all_host = false;
    }
  }
  if (!any) return g;
  for (int c = 0; c < kKvClasses; ++c) {
    g[KvClassSeries("specnode_kv_bytes", c)] = bytes[c];
    if (all_tokens) g[KvClassSeries("specnode_kv_tokens", c)] = tokens[c];
  }
  g["specnode_kv_capacity_bytes"] = capacity;  // every target rank's, summed
  g["specnode_kv_used_bytes"] = used;
  if (all_host) g["specnode_kv_host_bytes"] = host;
  // Of used: the prefix cache's pages that no request holds (evictable on demand).
  if (all_cache) g["specnode_kv_prefix_cache_only_bytes"] = cache_only;
  return g;
}

// The scheduler thread is stuck in the engine (Scheduler::StopWithin abandoned it, every
// request answered): it cannot be joined, and the engine, the scheduler and the targets it
// is inside cannot be destroyed under it, so returning (destructors) could hang or crash.
// The process ends here instead: std::quick_exit, which runs no destructors and no atexit
// handlers (only at_quick_exit ones; the node registers none), exit status 1 as for any
// error (systemd restarts it; under mpirun the job ends: rank 0 left without MPI_Finalize).
// `logged`: the front end has already logged the status (it abandoned the thread itself).
[[noreturn]] void ExitWithStuckScheduler(const absl::Status& st, bool logged) {
  if (!logged) std::fprintf(stderr, "specnode serve: %s\n", std::string(st.message()).c_str());
  std::fprintf(stderr,
               "specnode serve: stopped, exiting without joining the stuck scheduler thread\n");
  std::fflush(nullptr);
  std::quick_exit(1);
}

KvCacheEvent AllBlocksCleared() {
  KvCacheEvent e;
  e.kind = KvCacheEvent::Kind::kAllBlocksCleared;
  return e;
}

// The engine's groups: a drafter (made here unless the group brought one) and a controller
// for each group that drafts (a controller learns its own group's costs).
struct EngineGroups {
  std::vector<std::unique_ptr<SpecController>> owned;
  std::vector<std::unique_ptr<Drafter>> alternatives;  // speculation.alternatives' drafters
  std::vector<DraftGroup> groups;  // empty: one group without a drafter, target-only decoding
  std::vector<std::pair<std::string, const SpecController*>> controllers;  // for metrics
  std::string draft_name = "none";
};

absl::StatusOr<EngineGroups> MakeEngineGroups(const ServeConfig& cfg, ModelSession* session,
                                              std::vector<ServeGroup>& serve_groups) {
  EngineGroups e;
  for (ServeGroup& g : serve_groups) {
    if (g.drafter == nullptr && !cfg.draft.none()) {
      SPECNODE_ASSIGN_OR_RETURN(g.drafter,
                                MakeDrafter(cfg.draft, session->model(), session->pool(), cfg.kv));
    }
    if (g.drafter == nullptr) {
      e.groups.push_back({nullptr, nullptr, g.target});
      continue;
    }
    // The group's drafter, then its alternatives on the same target (the router picks per
    // domain among them).
    std::vector<Drafter*> drafters = {g.drafter.get()};
    for (const DraftSpec& spec : cfg.alternatives) {
      SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<Drafter> alt,
                                MakeDrafter(spec, session->model(), session->pool(), cfg.kv));
      drafters.push_back(alt.get());
      e.alternatives.push_back(std::move(alt));
    }
    for (Drafter* d : drafters) {
      SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<SpecController> controller,
                                SpecController::Create(ControllerConfigFor(cfg)));
      e.groups.push_back({d, controller.get(), g.target});
      e.controllers.push_back(
          {serve_groups.size() == 1 ? d->name() : g.name + "/" + d->name(), controller.get()});
      e.owned.push_back(std::move(controller));
    }
    e.draft_name = g.drafter->name();
    for (size_t i = 1; i < drafters.size(); ++i) e.draft_name += " + " + drafters[i]->name();
  }
  if (e.groups.size() == 1 && e.groups[0].drafter == nullptr) e.groups.clear();
  return e;
}

SpecEngineOptions EngineOptionsFor(const ServeConfig& cfg, ModelSession* session) {
  SpecEngineOptions eo;
  eo.acceptance = cfg.acceptance;
  eo.tree_nodes = cfg.tree_nodes;
  eo.trees_always = cfg.trees_always;
  const std::vector<int32_t> eog = session->model().tokenizer().EndOfGenerationIds();
  eo.stop_tokens.insert(eog.begin(), eog.end());
  eo.pool = session->pool();  // sampling of a batch's sequences in parallel
  eo.prefix_cache = cfg.kv.prefix_cache;
  return eo;
}

// Every group's target, each once.
std::vector<ModelRunner*> DistinctTargets(const std::vector<ServeGroup>& serve_groups) {
  std::vector<ModelRunner*> targets;
  for (const ServeGroup& g : serve_groups) {
    if (std::find(targets.begin(), targets.end(), g.target) == targets.end()) {
      targets.push_back(g.target);
    }
  }
  return targets;
}

// The scheduler's gauges: KV over every target; with several groups, each group's live
// sequences and sequences started. `engine` must outlive the scheduler.
std::function<std::map<std::string, double>()> GaugesFor(
    const std::vector<ServeGroup>& serve_groups, bool per_group, const SpeculativeEngine* engine) {
  std::vector<std::string> group_names;
  if (per_group) {
    for (const ServeGroup& g : serve_groups) group_names.push_back(g.name);
  }
  return [group_names, targets = DistinctTargets(serve_groups), engine] {
    std::map<std::string, double> g = KvGauges(targets);
    const std::vector<int> live = engine->GroupLoads();
    const std::vector<int64_t> started = engine->GroupStarts();
    for (size_t i = 0; i < group_names.size() && i < live.size(); ++i) {
      const std::string label = absl::StrFormat("{group=\"%s\"}", EscapeLabelValue(group_names[i]));
      g["specnode_group_active_sequences" + label] = live[i];
      g["specnode_group_sequences_started_total" + label] = static_cast<double>(started[i]);
    }
    return g;
  };
}

FrontendOptions FrontendOptionsFor(const ServeConfig& cfg, std::vector<RankInfo> ranks,
                                   MetricsExchange* metrics_exchange) {
  FrontendOptions fo;
  fo.endpoint = cfg.bind;
  fo.limits = cfg.limits;
  fo.drain_timeout_s = cfg.drain_timeout_s;
  fo.teardown = &g_teardown;
  // Under OpenMPI's mpirun only (0: no teardown handling): the SIGCONT-first teardown is
  // its own, so not InMpiJob(), which also counts PMI launchers.
  fo.teardown_drain_s =
      std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr ? MpirunTeardownWindowS() : 0.0;
  fo.model_name = cfg.model;
  fo.curve_secret_key = cfg.curve_secret_key;
  fo.ranks = std::move(ranks);
  if (!cfg.metrics_bind.empty() || cfg.http_bind.has_value()) {
    fo.metrics_exchange = metrics_exchange;
  }
  return fo;
}

// KV events: the target's prefix cache, as vLLM publishes its own (kv_event_publisher.h),
// listening to `target`'s cache (the caller detaches it before the publisher goes).
absl::StatusOr<std::unique_ptr<KvEventPublisher>> StartKvEvents(
    const ServeConfig& cfg, const std::vector<ModelRunner*>& targets) {
  if (!cfg.kv.prefix_cache) {
    return absl::InvalidArgumentError(
        "serve.kv_events_bind reports the prefix cache's events, and kv.prefix_cache is false");
  }
  if (targets.size() != 1) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "serve.kv_events_bind: %d groups with distinct targets; KV events describe one "
        "prefix cache per endpoint",
        targets.size()));
  }
  KvEventPublisherOptions ko;
  ko.endpoint = cfg.kv_events_bind;
  ko.replay_endpoint = cfg.kv_events_replay_bind;
  ko.topic = cfg.kv_events_topic;
  ko.encoding = cfg.kv_events_encoding;
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<KvEventPublisher> kv_events,
                            KvEventPublisher::Start(ko));
  if (absl::Status st = targets[0]->SetKvEventListener(kv_events.get()); !st.ok()) {
    return absl::FailedPreconditionError(absl::StrCat("serve.kv_events_bind: ", st.message()));
  }
  // A (re)started node has an empty cache: a router that knew an earlier one forgets it.
  kv_events->OnKvCacheEvent(AllBlocksCleared());
  return kv_events;
}

// GET /health: 200 "ok", or 503 "draining" / "failed", with the load and the uptime.
std::function<HealthReply()> HealthFor(const Scheduler* scheduler, std::string name) {
  const auto started = std::chrono::steady_clock::now();
  return [scheduler, started, name = std::move(name)] {
    const SchedulerSnapshot s = scheduler->Snapshot();
    const char* status = !scheduler->Failure().ok() ? "failed"
                         : scheduler->Draining()    ? "draining"
                                                    : "ok";
    const double uptime =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    const nlohmann::json j = {{"status", status},
                              {"model", name},
                              {"active", s.active},
                              {"queued", s.queued},
                              {"uptime_s", uptime}};
    return HealthReply{std::string(status) == "ok" ? 200 : 503,
                       j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace),
                       std::nullopt};
  };
}

// The HTTP listeners: the metrics port and the OpenAI API (each optional). Members in the
// order that stops the servers before the service their handlers call.
struct HttpFrontDoors {
  std::unique_ptr<OpenAiService> service;
  std::unique_ptr<HttpServer> metrics;
  std::unique_ptr<HttpServer> api;
};

absl::Status StartHttp(const ServeConfig& cfg, HttpServerOptions ho, Scheduler* scheduler,
                       ModelSession* session, const DomainRouter* router, ErrorCounter* errors,
                       int64_t max_model_len, HttpFrontDoors* doors) {
  if (!cfg.metrics_bind.empty()) {
    HttpServerOptions mo = ho;
    SPECNODE_ASSIGN_OR_RETURN(mo.address, ParseMetricsAddress(cfg.metrics_bind));
    mo.threads = 2;
    mo.name = "metrics endpoint";
    SPECNODE_ASSIGN_OR_RETURN(doors->metrics, HttpServer::Start(mo));
  }
  if (!cfg.http_bind.has_value()) return absl::OkStatus();
  OpenAiServiceOptions ao;
  ao.model_names = ServedModelNames(cfg);
  ao.limits = cfg.limits;
  ao.max_model_len = max_model_len;
  doors->service = std::make_unique<OpenAiService>(ao, scheduler, &session->model().tokenizer(),
                                                   router, errors);
  ho.address = *cfg.http_bind;
  ho.name = "HTTP API endpoint";
  ho.threads = cfg.http_threads;
  ho.max_body_bytes = static_cast<size_t>(cfg.http_max_body_bytes);
  if (const char* key =
          cfg.http_api_key_env.empty() ? nullptr : std::getenv(cfg.http_api_key_env.c_str());
      key != nullptr) {
    ho.api_key = key;
  }
  ho.routes = [service = doors->service.get()](HttpRouter& r) { service->Register(r); };
  SPECNODE_ASSIGN_OR_RETURN(doors->api, HttpServer::Start(ho));
  return absl::OkStatus();
}

// SIGINT/SIGTERM start the drain; under mpirun, its teardown's SIGCONT too (OnTeardown).
void InstallStopSignals(bool mpirun_teardown) {
  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  if (mpirun_teardown) {
    struct sigaction tear = {};
    tear.sa_handler = OnTeardown;
    sigemptyset(&tear.sa_mask);
    sigaction(SIGCONT, &tear, nullptr);
  }
}

// The start-up lines: what serves where, the config, and each optional endpoint.
void LogServing(const ServeConfig& cfg, const std::string& compute, const std::string& draft_name,
                const FrontendOptions& fo, size_t n_groups, const HttpFrontDoors& doors,
                const KvEventPublisher* kv_events) {
  std::fprintf(
      stderr, "specnode serve: %s on %s (%s, draft %s%s)\n", cfg.model.c_str(),
      fo.endpoint.c_str(), compute.c_str(), draft_name.c_str(),
      fo.ranks.empty() ? ""
      : n_groups == 1
          ? absl::StrFormat(", target on %d ranks", fo.ranks.size() - 1).c_str()
          : absl::StrFormat(", %d groups on %d ranks", n_groups, fo.ranks.size() - 1).c_str());
  std::fprintf(stderr, "specnode serve: config %s\n", cfg.source.c_str());
  if (doors.metrics != nullptr) {
    std::fprintf(stderr, "specnode serve: metrics on http://%s:%d/metrics\n",
                 doors.metrics->options().address.host.c_str(), doors.metrics->port());
  }
  if (doors.api != nullptr) {
    std::fprintf(stderr,
                 "specnode serve: OpenAI API on http://%s:%d/v1 (model \"%s\"%s), metrics and "
                 "health on the same port\n",
                 doors.api->options().address.host.c_str(), doors.api->port(),
                 absl::StrJoin(ServedModelNames(cfg), "\", \"").c_str(),
                 doors.api->options().api_key.empty() ? ", no API key" : ", bearer key required");
  }
  if (kv_events != nullptr) {
    std::fprintf(stderr, "specnode serve: KV events on %s%s%s\n", kv_events->endpoint().c_str(),
                 kv_events->replay_endpoint().empty() ? "" : ", replay on ",
                 kv_events->replay_endpoint().c_str());
  }
}

// The summary line: start time, weights, and what the KV budget holds at the served length.
void LogCapacity(const ServeConfig& cfg, ModelSession* session, const ModelRunner& target,
                 int32_t max_model_len) {
  StartupFigures f;
  f.ready_s = ProcessAgeS();
  f.weight_bytes = static_cast<int64_t>(session->model().file().tensor_bytes());
  f.kv = target.Memory();
  f.sequence_room = target.Room(max_model_len);
  f.max_model_len = max_model_len;
  f.max_active = cfg.max_active;
  std::fprintf(stderr, "specnode serve: %s\n", StartupSummary(f).c_str());
}

}  // namespace

std::vector<std::string> ServedModelNames(const ServeConfig& cfg) {
  if (!cfg.served_model_names.empty()) return cfg.served_model_names;
  std::string name = cfg.model.substr(cfg.model.find_last_of('/') + 1);
  if (name.size() > 5 && name.ends_with(".gguf")) name.resize(name.size() - 5);
  return {name};
}

absl::StatusOr<int32_t> EffectiveMaxModelLen(const ServeConfig& cfg, int32_t context_length) {
  if (cfg.max_model_len == 0) return context_length;
  if (cfg.max_model_len > context_length) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "serve.max_model_len (--max-model-len) %d is longer than the model's context length %d",
        cfg.max_model_len, context_length));
  }
  return cfg.max_model_len;
}

double MpirunSigkillTimeoutS() {
  const char* env = std::getenv("OMPI_MCA_odls_base_sigkill_timeout");
  return env != nullptr ? std::atof(env) : 1.0;  // OpenMPI's default
}

double MpirunTeardownWindowS() { return std::max(0.1, 2.0 * MpirunSigkillTimeoutS() - 1.0); }

absl::Status ServeNode(const ServeConfig& cfg, ModelSession* session,
                       std::vector<ServeGroup>& serve_groups, std::vector<RankInfo> ranks) {
  assert(!serve_groups.empty());
  std::unique_ptr<DomainRouter> router;
  if (!cfg.router_rules_file.empty()) {
    SPECNODE_ASSIGN_OR_RETURN(router, LoadRouterRules(cfg.router_rules_file));
  } else {
    RouterConfig rc;
    rc.default_domain = cfg.default_domain;
    SPECNODE_ASSIGN_OR_RETURN(router, DomainRouter::Create(rc));
  }
  ModelRunner* target = serve_groups[0].target;
  SPECNODE_ASSIGN_OR_RETURN(EngineGroups groups, MakeEngineGroups(cfg, session, serve_groups));
  SpecEngineOptions eo = EngineOptionsFor(cfg, session);
  SPECNODE_ASSIGN_OR_RETURN(eo.max_model_len, EffectiveMaxModelLen(cfg, target->max_positions()));
  SpeculativeEngine engine(target, groups.groups, std::move(eo));
  SchedulerOptions so = cfg.sla;
  so.max_tokens = cfg.limits.max_tokens;
  so.gauges = GaugesFor(serve_groups, groups.groups.size() > 1, &engine);

  // Declared before the frontend and the HTTP servers: both use it until they are gone.
  MetricsExchange metrics_exchange;
  HttpFrontDoors doors;
  const FrontendOptions fo = FrontendOptionsFor(cfg, std::move(ranks), &metrics_exchange);
  std::unique_ptr<Frontend> frontend;
  Scheduler scheduler(&engine, &session->model().tokenizer(), so,
                      [&frontend](GenerationEvent ev) { frontend->OnEvent(std::move(ev)); });
  frontend = std::make_unique<Frontend>(
      fo, session, router.get(), &scheduler,
      [&scheduler, &frontend, c = groups.controllers, model_name = ServedModelNames(cfg)[0]] {
        SchedulerSnapshot s = scheduler.Snapshot();
        // Error replies of the front end (bad input, overloaded, ...) and of the scheduler.
        for (const auto& [code, n] : frontend->errors().Counts()) s.errors_by_code[code] += n;
        return PrometheusText(s, c, model_name);
      });
  SPECNODE_RETURN_IF_ERROR(frontend->Bind());
  // Declared after the engine (which the targets' caches report through); `detach` after
  // it, so that on every way out the listener is detached before the publisher goes.
  const std::vector<ModelRunner*> targets = DistinctTargets(serve_groups);
  std::unique_ptr<KvEventPublisher> kv_events;
  struct DetachListener {
    ModelRunner* target = nullptr;
    ~DetachListener() {
      if (target != nullptr) (void)target->SetKvEventListener(nullptr);
    }
  } detach;
  if (!cfg.kv_events_bind.empty()) {
    SPECNODE_ASSIGN_OR_RETURN(kv_events, StartKvEvents(cfg, targets));
    detach.target = targets[0];
  }
  HttpServerOptions ho;
  ho.metrics = &metrics_exchange;
  ho.errors = &frontend->errors();
  ho.health = HealthFor(&scheduler, ServedModelNames(cfg)[0]);
  SPECNODE_RETURN_IF_ERROR(StartHttp(cfg, ho, &scheduler, session, router.get(),
                                     &frontend->errors(), engine.limits().context_length, &doors));
  InstallStopSignals(fo.teardown_drain_s > 0);
  // The target's backend when it runs here; a remote target's ranks are listed.
  LogServing(cfg,
             target == &session->runner() ? session->kernel_name()
                                          : session->runner().backend().Describe(),
             groups.draft_name, fo, serve_groups.size(), doors, kv_events.get());
  LogCapacity(cfg, session, *target, engine.limits().context_length);

  absl::Status st = frontend->Run(&g_stop);
  // The scheduler first: Stop ends every request still running (the drain cut, a lost
  // target), so the HTTP handlers waiting for them return and the servers can join them.
  // Bounded: a thread stuck in the engine is abandoned, its requests answered `unavailable`
  // (Run has usually done this already, at the drain cut; then this returns at once).
  const absl::Status stopped =
      scheduler.StopWithin(std::chrono::duration<double>(fo.stop_wait_s));
  const bool run_abandoned = st == stopped;  // Run's drain cut gave up on the thread
  if (st.ok()) st = stopped;
  doors.metrics.reset();  // before the frontend it asks for renders
  doors.api.reset();
  if (kv_events != nullptr) {
    if (stopped.ok()) {  // not under a thread that may still be in the target
      (void)targets[0]->SetKvEventListener(nullptr);
      detach.target = nullptr;
    }
    // The cache goes with the process: routers drop this node's blocks.
    kv_events->OnKvCacheEvent(AllBlocksCleared());
    (void)kv_events->Flush(std::chrono::milliseconds(1000));
    if (stopped.ok()) kv_events.reset();
  }
  frontend.reset();  // closes the socket (lingering up to 0.5 s so the last replies leave)
  if (!stopped.ok()) ExitWithStuckScheduler(stopped, run_abandoned);
  std::fprintf(stderr, "specnode serve: %s\n", st.ok() ? "drained, exiting" : "stopped");
  return st;
}

}  // namespace specnode
