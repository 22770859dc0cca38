// specnode serve: the node's command line. Reads the config (--config FILE, else the
// embedded cluster-configs/local-cpu.yaml) with flags applied on top, then serves: in this
// process (ServeNode, serve_node.h), or under mpirun with a multi-rank config as the
// cluster's rank 0 or a shard rank (node/cluster/serve_cluster.h); --check-config checks
// instead (node/serve/cmd_serve_check.h).
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/status_macros.h"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/cluster/serve_cluster.h"
#include "node/serve/cluster_config.h"
#include "node/serve/cmd_serve_check.h"
#include "node/serve/config_keys.h"
#include "node/serve/loading_listeners.h"
#include "node/serve/metrics_http.h"
#include "node/serve/serve_node.h"
#include "node/session/model_session.h"
#include "runtime/runner_factory.h"

namespace specnode {
namespace {

// The defaults printed are ServeConfig's own (the embedded local-cpu.yaml states the same;
// a test keeps the two equal).
std::string Help() {
  const ServeConfig d;
  return absl::StrFormat(
      "usage: specnode serve [--config FILE.yaml] [--model PATH] [--bind ENDPOINT] [options]\n"
      "       specnode serve --check-config [--config FILE.yaml] [--model PATH] [options]\n"
      "\n"
      "Serves the OpenAI API (docs/openai-api.md) and the ZeroMQ protocol (docs/protocol.md)\n"
      "until SIGINT/SIGTERM (then drains and exits 0). Settings come from --config\n"
      "(cluster-configs/, schema in docs/configs.md; default: the embedded\n"
      "cluster-configs/local-cpu.yaml); flags override it. Under mpirun with a multi-rank\n"
      "config, rank 0 serves and ranks 1..T run the tensor-parallel target, e.g.\n"
      "  mpirun -np 4 --mca odls_base_sigkill_timeout 16 specnode serve \\\n"
      "      --config cluster-configs/mpirun-cpu-tp3.yaml\n"
      "(the sigkill timeout gives a SIGTERM'd node time to drain; docs/serving.md,\n"
      "\"Cluster (mpirun)\").\n"
      "  --config FILE       YAML cluster config\n"
      "  --model PATH        target GGUF (default: $SPECNODE_MODEL or the fetch-model cache)\n"
      "  --bind ENDPOINT     ZeroMQ ROUTER endpoint (default %s)\n"
      "  --metrics-bind A    HTTP Prometheus endpoint IPV4:PORT (GET /metrics, /health),\n"
      "                      e.g. 127.0.0.1:9464; keep it on loopback (default: off)\n"
      "  --host H, --port P  the OpenAI-compatible API (/v1/chat/completions,\n"
      "                      /v1/completions, /v1/models) with /metrics and /health, beside\n"
      "                      the ZeroMQ endpoint (default %s; --host 0.0.0.0\n"
      "                      exposes it); API key from $SPECNODE_API_KEY\n"
      "                      (serve.http_api_key_env names another variable)\n"
      "  --http-bind A       the same as one setting: HOST:PORT, PORT (on 127.0.0.1) or off\n"
      "  --served-model-name NAME [NAME ...]\n"
      "                      model ids /v1/models lists and requests may name; the first is\n"
      "                      the metrics' model_name label (default: the file's name)\n"
      "  --max-model-len N   longest prompt + completion in tokens (default: the model's\n"
      "                      context; above it is refused at load)\n"
      "  --kv-events-bind E  ZeroMQ PUB endpoint for KV events in vLLM's format, e.g.\n"
      "                      tcp://127.0.0.1:5557 (default: off)\n"
      "  --kv-events-replay-bind E, --kv-events-topic T, --kv-events-encoding array|map\n"
      "                      the KV events' replay endpoint, topic frame and layout\n"
      "  --drain-timeout-s S after SIGTERM, how long running requests may finish (default %g)\n"
      "  --http-api-key-env VAR  environment variable holding the API's bearer key\n"
      "  --http-max-body-bytes N, --http-threads N  the API's body limit and connections\n"
      "  --threads N         CPU threads (default: all cores available)\n"
      "  --draft SPEC        drafter: ngram[:N], suffix[:N], recycle[:N], self:L, a GGUF path, or "
      "none\n"
      "                      (default %s)\n"
      "  --draft-alternatives LIST  more drafters (comma-separated specs, e.g. ngram) the\n"
      "                      router chooses among with --draft per domain (default none)\n"
      "  --spec-k K          largest speculation length (default %d)\n"
      "  --tree-nodes N      draft trees of up to N nodes (suffix, recycle, a draft model's\n"
      "                      runners-up), verified in one pass where they pay (default 0)\n"
      "  --acceptance RULE   sampled drafts: match (a seed's text does not depend on the\n"
      "                      drafter) or ratio (min(1, p/q) test) (default %s)\n"
      "  --router-rules FILE JSON rules naming a request's domain from its prompt\n"
      "  --default-domain D  the domain of a prompt no rule names (default %s)\n"
      "  --max-active N      sequences running at once (default %d)\n"
      "  --max-queue N       waiting requests before `overloaded` (default %d)\n"
      "  --max-tokens N      largest max_tokens a request may ask (default %d)\n"
      "  --max-frame-bytes N largest accepted frame (default %d)\n"
      "  --check-config      check the config as serve would, then the target's (and a draft\n"
      "                      model's) GGUF header: architecture, tensor shapes, vocabulary,\n"
      "                      device, TP fit; print a summary and exit 0, or the error and 1.\n"
      "                      Loads no weights, binds no socket, needs no mpirun. With GPU\n"
      "                      ranks in topology.groups it also places each rank on its node\n"
      "                      and GPU as mpirun --map-by ppr:R:node would (rank r on node r / R,\n"
      "                      local rank r %% R) against the GPUs this host's CUDA runtime shows\n"
      "                      (CUDA_VISIBLE_DEVICES applied; every node taken to be alike): a\n"
      "                      missing cuda:N, two ranks of a node on one GPU, or a topology host\n"
      "                      on the wrong node fails, naming the ranks (docs/serving.md)\n"
      "  --ranks-per-node R  with --check-config: R ranks per node, as mpirun --map-by\n"
      "                      ppr:R:node (default: what the config's hosts imply, else every\n"
      "                      rank on one node)\n"
      "  --gpus-per-node N   with --check-config: nodes of N GPUs each (CUDA_VISIBLE_DEVICES\n"
      "                      still applies) instead of this host's: checks a GPU layout from a\n"
      "                      machine without those GPUs\n"
      "  --print-flag-table  print which flag sets each YAML key (docs/configs.md) and exit\n"
      "  --print-config      print every key's value after the config and the flags, and exit\n",
      d.bind, (d.http_bind.has_value() ? d.http_bind->text() : std::string("off")).c_str(),
      d.drain_timeout_s, d.draft.text(), d.k_max,
      std::string(AcceptanceRuleName(d.acceptance)).c_str(), d.default_domain, d.max_active,
      d.max_queue, d.limits.max_tokens, d.limits.max_frame_bytes);
}

// The OpenAI API's flags over the config: --http-bind (HOST:PORT, PORT or "off") first,
// then --host and --port (vLLM's), each replacing its half of the address (the API is
// turned on by either, at 127.0.0.1 / 8000 for the half not given); --served-model-name
// (one or more names) and --max-model-len.
absl::Status ApplyHttpFlags(const CliArgs& args, ServeConfig* c) {
  if (args.Has("http-bind")) {
    absl::StatusOr<std::optional<HttpAddress>> a = ParseHttpBind(args.Get("http-bind"));
    if (!a.ok())
      return absl::InvalidArgumentError(absl::StrCat("--http-bind: ", a.status().message()));
    c->http_bind = *a;
  }
  if (args.Has("host") || args.Has("port")) {
    HttpAddress addr = c->http_bind.value_or(HttpAddress{"127.0.0.1", kDefaultHttpPort});
    if (args.Has("host")) {
      absl::StatusOr<HttpAddress> h = ParseHttpAddress(absl::StrCat(args.Get("host"), ":0"));
      if (!h.ok())
        return absl::InvalidArgumentError(absl::StrCat("--host: ", h.status().message()));
      addr.host = h->host;
    }
    if (args.Has("port")) {
      SPECNODE_ASSIGN_OR_RETURN(int64_t port, args.GetInt("port", addr.port, 0, 65535));
      addr.port = static_cast<int>(port);
    }
    c->http_bind = addr;
  }
  if (args.Has("served-model-name")) {
    c->served_model_names = args.GetList("served-model-name");
    if (absl::Status st = CheckServedModelNames(c->served_model_names); !st.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("--served-model-name: ", st.message()));
    }
  }
  if (args.Has("max-model-len")) {
    SPECNODE_ASSIGN_OR_RETURN(int64_t n, args.GetInt("max-model-len", 0, 0, 1 << 24));
    c->max_model_len = static_cast<int>(n);
  }
  return absl::OkStatus();
}

// The flags of the serve keys a first hour rarely needs (config_keys.h has the whole map).
absl::Status ApplyMoreServeFlags(const CliArgs& args, ServeConfig* c) {
  if (args.Has("drain-timeout-s")) {
    SPECNODE_ASSIGN_OR_RETURN(c->drain_timeout_s,
                              args.GetDouble("drain-timeout-s", c->drain_timeout_s, 0, 3600));
  }
  if (args.Has("http-api-key-env")) c->http_api_key_env = args.Get("http-api-key-env");
  if (args.Has("http-max-body-bytes")) {
    SPECNODE_ASSIGN_OR_RETURN(c->http_max_body_bytes,
                              args.GetInt("http-max-body-bytes", 0, 1024, 1 << 30));
  }
  if (args.Has("http-threads")) {
    SPECNODE_ASSIGN_OR_RETURN(int64_t n, args.GetInt("http-threads", 0, 1, 4096));
    c->http_threads = static_cast<int>(n);
  }
  if (args.Has("kv-events-replay-bind")) {
    c->kv_events_replay_bind = args.Get("kv-events-replay-bind");
  }
  if (args.Has("kv-events-topic")) c->kv_events_topic = args.Get("kv-events-topic");
  if (args.Has("kv-events-encoding")) {
    const std::string e = args.Get("kv-events-encoding");
    const std::optional<KvEventEncoding> encoding = ParseKvEventEncoding(e);
    if (!encoding.has_value()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--kv-events-encoding: expected array (vLLM <= 0.23's layout) or map, got \"", e, "\""));
    }
    c->kv_events_encoding = *encoding;
  }
  if (args.Has("default-domain")) c->default_domain = args.Get("default-domain");
  return absl::OkStatus();
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
  SPECNODE_RETURN_IF_ERROR(set_int("tree-nodes", 0, 64, &c.tree_nodes));
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
  SPECNODE_RETURN_IF_ERROR(ApplyHttpFlags(args, &c));
  SPECNODE_RETURN_IF_ERROR(ApplyMoreServeFlags(args, &c));
  if (args.Has("kv-events-bind")) c.kv_events_bind = args.Get("kv-events-bind");
  if (args.Has("draft")) {
    absl::StatusOr<DraftSpec> d = ParseDraftSpec(args.Get("draft"));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--draft: ", d.status().message()));
    c.draft = *d;
  }
  if (args.Has("draft-alternatives")) {
    SPECNODE_ASSIGN_OR_RETURN(c.alternatives,
                              ParseAlternatives(args.Get("draft-alternatives"), c.topology));
  }
  if (args.Has("acceptance")) {
    SPECNODE_ASSIGN_OR_RETURN(c.acceptance, AcceptanceFromArgs(args));
  }
  if (args.Has("router-rules")) c.router_rules_file = args.Get("router-rules");
  if (args.Has("activations")) {
    SPECNODE_ASSIGN_OR_RETURN(c.activations, ActQuantFromArgs(args));
  }
  if (args.Has("chat-template")) {
    SPECNODE_ASSIGN_OR_RETURN(c.chat_template, ChatTemplateFromArgs(args));
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
  SPECNODE_RETURN_IF_ERROR(CheckAlternatives(c));  // the config's and the flags' together
  if (c.model == "default") c.model = DefaultModelPath();
  if (c.threads == 0) c.threads = DefaultThreads();
  return c;
}

absl::Status Run(const CliArgs& args) {
  if (args.Has("print-flag-table")) {
    std::fputs(ConfigKeysMarkdown().c_str(), stdout);
    return absl::OkStatus();
  }
  SPECNODE_ASSIGN_OR_RETURN(const ServeConfig cfg, ConfigFromArgs(args));
  if (args.Has("print-config")) {
    std::fputs(ConfigValues(cfg).c_str(), stdout);
    return absl::OkStatus();
  }
  SPECNODE_ASSIGN_OR_RETURN(const GpuCheckOptions gpu_options, GpuCheckOptionsFromArgs(args));
  if (args.Has("check-config")) return CheckConfig(cfg, gpu_options);
  if (NeedsCluster(cfg)) return RunServeCluster(cfg);
  // What the device is asked for is refused before the model is named as loading.
  SPECNODE_RETURN_IF_ERROR(CheckRunnerOptions(RunnerOptionsFor(cfg)));
  // Health answers "loading" (503) on the HTTP addresses while the weights load.
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<LoadingListeners> loading,
                            LoadingListeners::Start(cfg));
  // A progress bar on a terminal; a log (a file, journald) gets the line and the summary.
  const bool tty = isatty(STDERR_FILENO) != 0;
  std::fprintf(stderr, "specnode serve: loading %s on %s\n", cfg.model.c_str(),
               cfg.device.name().c_str());
  SPECNODE_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelSession> session,
      ModelSession::Open(cfg.model, cfg.threads, tty, cfg.kv,
                         ComputeOptions{cfg.activations, cfg.device, cfg.chat_template}));
  std::vector<ServeGroup> groups(1);
  groups[0].name = "local";
  groups[0].target = &session->runner();
  loading->Stop();  // ServeNode binds the addresses again, serving
  return ServeNode(cfg, session.get(), groups, {});
}

}  // namespace

int RunServe(int argc, char** argv) {
  return RunModelCommand("serve", Help(), argc, argv,
                         {"config",
                          "model",
                          "bind",
                          "metrics-bind",
                          "http-bind",
                          "host",
                          "port",
                          "max-model-len",
                          "kv-events-bind",
                          "threads",
                          "draft",
                          "draft-alternatives",
                          "spec-k",
                          "tree-nodes",
                          "acceptance",
                          "router-rules",
                          "max-active",
                          "max-queue",
                          "max-tokens",
                          "max-frame-bytes",
                          "ranks-per-node",
                          "gpus-per-node",
                          "drain-timeout-s",
                          "http-api-key-env",
                          "http-max-body-bytes",
                          "http-threads",
                          "kv-events-replay-bind",
                          "kv-events-topic",
                          "kv-events-encoding",
                          "default-domain"},
                         {"check-config", "print-flag-table", "print-config"}, Run,
                         {"served-model-name"});
}

}  // namespace specnode
