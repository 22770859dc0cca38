// specnode serve: the node. Loads the target, builds the drafter and the adaptive
// controller, starts the scheduler thread and serves the ZeroMQ protocol of
// docs/protocol.md until SIGINT/SIGTERM, then drains (in-flight requests finish and get
// their replies) and exits 0.
#include <signal.h>

#include <atomic>
#include <cstdio>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_format.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/scheduler.h"
#include "coordinator/spec_controller.h"
#include "coordinator/spec_engine.h"
#include "kvstore/kv_store.h"
#include "model/status_macros.h"
#include "node/cli_args.h"
#include "node/commands.h"
#include "node/frontend.h"
#include "node/metrics.h"
#include "node/model_session.h"
#include "node/router_config.h"

namespace specnode {
namespace {

constexpr char kHelp[] =
    "usage: specnode serve [--model PATH] [--bind ENDPOINT] [options]\n"
    "\n"
    "Serves the ZeroMQ protocol of docs/protocol.md until SIGINT/SIGTERM (then drains and\n"
    "exits 0).\n"
    "  --bind ENDPOINT     ROUTER endpoint (default tcp://127.0.0.1:5555)\n"
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

std::map<std::string, double> KvGauges(KvCache* cache) {
  std::map<std::string, double> g;
  const auto* store = dynamic_cast<const KvStore*>(cache);
  if (store == nullptr) return g;
  const KvUsage u = store->Usage();
  static const char* kClass[] = {"f16", "int8", "int4"};
  for (int c = 0; c < kNumKvPrecisions && c < 3; ++c) {
    g[absl::StrFormat("specnode_kv_bytes{class=\"%s\"}", kClass[c])] = u.bytes[c];
    g[absl::StrFormat("specnode_kv_tokens{class=\"%s\"}", kClass[c])] = u.tokens[c];
  }
  g["specnode_kv_capacity_bytes"] = u.capacity_bytes;
  g["specnode_kv_used_bytes"] = u.used_bytes;
  g["specnode_kv_host_bytes"] = u.host_bytes;
  return g;
}

absl::Status Run(const CliArgs& args) {
  SPECNODE_ASSIGN_OR_RETURN(int64_t threads, args.GetInt("threads", DefaultThreads(), 1, 1024));
  SPECNODE_ASSIGN_OR_RETURN(int64_t spec_k, args.GetInt("spec-k", 4, 1, SpecController::kMaxK));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_active, args.GetInt("max-active", 16, 1, 4096));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_queue, args.GetInt("max-queue", 256, 0, 1 << 20));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_tokens, args.GetInt("max-tokens", 4096, 1, 1 << 20));
  SPECNODE_ASSIGN_OR_RETURN(int64_t max_frame,
                            args.GetInt("max-frame-bytes", 1 << 20, 256, 1 << 30));
  std::unique_ptr<DomainRouter> router;
  if (args.Has("router-rules")) {
    SPECNODE_ASSIGN_OR_RETURN(router, LoadRouterRules(args.Get("router-rules")));
  } else {
    SPECNODE_ASSIGN_OR_RETURN(router, DomainRouter::Create({}));
  }
  SPECNODE_ASSIGN_OR_RETURN(KvCacheOptions kv, KvOptionsFromArgs(args));
  const std::string model_path = args.Get("model", DefaultModelPath());
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<ModelSession> session,
                            ModelSession::Open(model_path, static_cast<int>(threads), false, kv));

  std::unique_ptr<Drafter> drafter;
  std::unique_ptr<SpecController> controller;
  std::vector<DraftGroup> groups;
  const std::string draft = args.Get("draft", "ngram");
  if (draft != "none") {
    SPECNODE_ASSIGN_OR_RETURN(drafter, MakeDrafter(draft, session->model(), session->pool(), kv));
    SpecControllerConfig cc;
    cc.k_max = static_cast<int>(spec_k);
    cc.k_initial = std::min(cc.k_max, 4);
    cc.probe_k = std::min(cc.probe_k, cc.k_max);
    SPECNODE_ASSIGN_OR_RETURN(controller, SpecController::Create(cc));
    groups.push_back({drafter.get(), controller.get()});
  }
  SpecEngineOptions eo;
  const std::vector<int32_t> eog = session->model().tokenizer().EndOfGenerationIds();
  eo.stop_tokens.insert(eog.begin(), eog.end());
  SpeculativeEngine engine(&session->runner(), groups, eo);

  SchedulerOptions so;
  so.max_active = static_cast<int>(max_active);
  so.max_queue = static_cast<int>(max_queue);
  KvCache* cache = &session->cache();
  so.gauges = [cache] { return KvGauges(cache); };

  FrontendOptions fo;
  fo.endpoint = args.Get("bind", "tcp://127.0.0.1:5555");
  fo.limits.max_frame_bytes = static_cast<size_t>(max_frame);
  fo.limits.max_tokens = max_tokens;
  fo.model_name = model_path;
  std::unique_ptr<Frontend> frontend;
  Scheduler scheduler(&engine, &session->model().tokenizer(), so,
                      [&frontend](GenerationEvent ev) { frontend->OnEvent(std::move(ev)); });
  std::vector<std::pair<std::string, const SpecController*>> controllers;
  if (controller) controllers.push_back({drafter->name(), controller.get()});
  frontend = std::make_unique<Frontend>(fo, session.get(), router.get(), &scheduler,
                                        [&scheduler, &frontend, controllers] {
                                          SchedulerSnapshot s = scheduler.Snapshot();
                                          // Error replies of the front end (bad input, overloaded,
                                          // ...) and of the scheduler.
                                          for (const auto& [code, n] : frontend->error_counts())
                                            s.errors_by_code[code] += n;
                                          return PrometheusText(s, controllers);
                                        });
  SPECNODE_RETURN_IF_ERROR(frontend->Bind());

  struct sigaction sa = {};
  sa.sa_handler = OnSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  std::fprintf(stderr, "specnode serve: %s on %s (%s kernels, %lld threads, draft %s)\n",
               model_path.c_str(), fo.endpoint.c_str(), session->kernel_name().c_str(),
               static_cast<long long>(threads), drafter ? drafter->name().c_str() : "none");
  absl::Status st = frontend->Run(&g_stop);
  scheduler.Stop();
  std::fprintf(stderr, "specnode serve: %s\n", st.ok() ? "drained, exiting" : "stopped");
  return st;
}

}  // namespace

int RunServe(int argc, char** argv) {
  return RunModelCommand("serve", kHelp, argc, argv,
                         {"model", "bind", "threads", "draft", "spec-k", "router-rules",
                          "max-active", "max-queue", "max-tokens", "max-frame-bytes"},
                         {}, Run);
}

}  // namespace specnode
