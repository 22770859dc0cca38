// specnode serve: the node's command line. Reads the config (--config FILE, else the
// embedded cluster-configs/local-cpu.yaml) with flags applied on top, then serves: in this
// process (ServeNode, serve_node.h), or under mpirun with a multi-rank config as the
// cluster's rank 0 or a shard rank (node/cluster/serve_cluster.h).
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/spec_controller.h"
#include "model/status_macros.h"
#include "node/cli/cli_args.h"
#include "node/cli/commands.h"
#include "node/cluster/serve_cluster.h"
#include "node/serve/cluster_config.h"
#include "node/serve/metrics_http.h"
#include "node/serve/serve_node.h"
#include "node/cli/model_flags.h"
#include "node/session/model_session.h"

namespace specnode {
namespace {

// The defaults printed are ServeConfig's own (the embedded local-cpu.yaml states the same;
// a test keeps the two equal).
std::string Help() {
  const ServeConfig d;
  return absl::StrFormat(
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
      "  --bind ENDPOINT     ROUTER endpoint (default %s)\n"
      "  --metrics-bind A    HTTP Prometheus endpoint IPV4:PORT (GET /metrics, /health),\n"
      "                      e.g. 127.0.0.1:9464; keep it on loopback (default: off)\n"
      "  --threads N         CPU threads (default: all cores available)\n"
      "  --draft SPEC        drafter: ngram[:N], self:L, a GGUF path, or none (default %s)\n"
      "  --spec-k K          largest speculation length (default %d)\n"
      "  --acceptance RULE   sampled drafts: match (a seed's text does not depend on the\n"
      "                      drafter) or ratio (min(1, p/q) test) (default %s)\n"
      "  --router-rules FILE JSON rules naming a request's domain from its prompt\n"
      "  --max-active N      sequences running at once (default %d)\n"
      "  --max-queue N       waiting requests before `overloaded` (default %d)\n"
      "  --max-tokens N      largest max_tokens a request may ask (default %d)\n"
      "  --max-frame-bytes N largest accepted frame (default %d)\n",
      d.bind, d.draft.text(), d.k_max, std::string(AcceptanceRuleName(d.acceptance)).c_str(),
      d.max_active, d.max_queue, d.limits.max_tokens, d.limits.max_frame_bytes);
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
  if (c.model == "default") c.model = DefaultModelPath();
  if (c.threads == 0) c.threads = DefaultThreads();
  return c;
}

}  // namespace

namespace {

absl::Status Run(const CliArgs& args) {
  SPECNODE_ASSIGN_OR_RETURN(const ServeConfig cfg, ConfigFromArgs(args));
  if (NeedsCluster(cfg)) return RunServeCluster(cfg);
  SPECNODE_ASSIGN_OR_RETURN(
      std::unique_ptr<ModelSession> session,
      ModelSession::Open(cfg.model, cfg.threads, false, cfg.kv,
                         ComputeOptions{cfg.activations, cfg.device, cfg.chat_template}));
  std::vector<ServeGroup> groups(1);
  groups[0].name = "local";
  groups[0].target = &session->runner();
  return ServeNode(cfg, session.get(), groups, {});
}

}  // namespace

int RunServe(int argc, char** argv) {
  return RunModelCommand(
      "serve", Help(), argc, argv,
      {"config", "model", "bind", "metrics-bind", "threads", "draft", "spec-k", "acceptance",
       "router-rules", "max-active", "max-queue", "max-tokens", "max-frame-bytes"},
      {}, Run);
}

}  // namespace specnode
