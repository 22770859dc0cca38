// specnode serve --check-config (node/serve/cmd_serve_check.h): the config, the models' GGUF
// headers and, for GPU ranks, where each rank lands and which GPU it opens.
#include "node/serve/cmd_serve_check.h"

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <string>
#include <vector>
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "coordinator/domain_router.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/model_drafter.h"
#include "kvstore/cpu_page_pool.h"
#include "kvstore/kv_precision.h"
#include "kvstore/kv_store.h"
#include "model/gguf/gguf_reader.h"
#include "model/llama/llama_config.h"
#include "model/llama/llama_weights.h"
#include "model/status_macros.h"
#include "model/tokenizer/chat_template.h"
#include "model/tokenizer/tokenizer.h"
#include "node/cli/cli_args.h"
#include "node/cli/model_flags.h"
#include "node/cluster/serve_cluster.h"
#include "node/serve/cluster_config.h"
#include "node/serve/gpu_inventory.h"
#include "node/serve/gpu_layout.h"
#include "node/serve/serve_node.h"
#include "node/session/router_config.h"
#include "runtime/runner_factory.h"
#include "tensor-parallel/shard_plan.h"

namespace specnode {
namespace {

// --check-config: a model file as far as its GGUF header tells — mapped, metadata parsed,
// every tensor's name and shape checked against the config by building the weight views
// (LoadLlamaWeights; no page of weights is read, unlike LlamaModel::Load), the tokenizer.
struct ModelHeader {
  std::unique_ptr<GgufFile> file;
  LlamaConfig config;
  std::unique_ptr<Tokenizer> tokenizer;
};

absl::StatusOr<ModelHeader> OpenModelHeader(const char* role, const std::string& path,
                                            const std::string& chat_template) {
  const auto named = [&](const absl::Status& s) {
    return absl::Status(s.code(), absl::StrCat(role, " model ", path, ": ", s.message()));
  };
  ModelHeader m;
  absl::StatusOr<std::unique_ptr<GgufFile>> file = GgufFile::Open(path);
  if (!file.ok())
    return absl::Status(file.status().code(),
                        absl::StrCat(role, " model: ", file.status().message()));
  m.file = std::move(file).value();
  absl::StatusOr<LlamaConfig> config = LlamaConfig::FromGguf(*m.file);
  if (!config.ok()) return named(config.status());
  m.config = *config;
  if (absl::Status s = LoadLlamaWeights(*m.file, m.config).status(); !s.ok()) return named(s);
  absl::StatusOr<std::unique_ptr<Tokenizer>> tok = Tokenizer::FromGguf(*m.file);
  if (!tok.ok()) return named(tok.status());
  m.tokenizer = std::move(tok).value();
  if (!chat_template.empty()) m.tokenizer->ReplaceChatTemplate(chat_template);
  if (m.tokenizer->vocab_size() > m.config.vocab_size) {
    return named(absl::InvalidArgumentError(
        absl::StrCat("tokenizer has ", m.tokenizer->vocab_size(),
                     " tokens but the model's vocabulary is ", m.config.vocab_size)));
  }
  return m;
}

// What a draft needs of the target (ModelDrafter's vocabulary check, the self-draft's layer
// range, the n-gram drafter's options); *line describes the draft for the summary.
absl::Status CheckDraftSpec(const DraftSpec& d, const ModelHeader& target, std::string* line) {
  *line = d.text();
  if (d.is_lookup()) return MakeLookupDrafter(d).status();
  if (d.kind == DraftSpec::Kind::kSelf && (d.count < 1 || d.count >= target.config.n_layers)) {
    return absl::InvalidArgumentError(
        absl::StrFormat("self-draft layers must be in [1, %d) for this %d-layer target, got %d",
                        target.config.n_layers, target.config.n_layers, d.count));
  }
  if (!d.is_model()) return absl::OkStatus();
  SPECNODE_ASSIGN_OR_RETURN(const ModelHeader draft, OpenModelHeader("draft", d.path, ""));
  SPECNODE_RETURN_IF_ERROR(CheckSameVocabulary(d.path, draft.config, *draft.tokenizer,
                                               target.config, *target.tokenizer));
  *line = absl::StrFormat("%s (%s)", d.path, draft.config.Summary());
  return absl::OkStatus();
}

// The draft and its alternatives (speculation.alternatives), as CheckDraftSpec; *line lists
// them ("a + b").
absl::Status CheckDraft(const ServeConfig& cfg, const ModelHeader& target, std::string* line) {
  SPECNODE_RETURN_IF_ERROR(CheckDraftSpec(cfg.draft, target, line));
  for (const DraftSpec& d : cfg.alternatives) {
    std::string alt;
    if (absl::Status st = CheckDraftSpec(d, target, &alt); !st.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat("speculation.alternatives: ", d.text(), ": ", st.message()));
    }
    absl::StrAppend(line, " + ", alt);
  }
  return absl::OkStatus();
}

// The GPU layout of a topology with GPU ranks (node/serve/gpu_layout.h): each rank's node
// and GPU under the documented mapping, against the GPUs every node shows (this host's, or
// --gpus-per-node). Returns the summary's text ("" without GPU ranks), or
// FailedPrecondition naming the ranks that fail, with the whole layout.
absl::StatusOr<std::string> CheckGpuPlacement(const ServeConfig& cfg, const GpuCheckOptions& o) {
  const Topology& t = cfg.topology;
  if (t.single_process() || !UsesGpus(t)) return std::string();
  int per_node = t.world_size;
  std::string per_node_origin = "no --ranks-per-node and no hosts in the config: one node";
  if (o.ranks_per_node.has_value()) {
    per_node = *o.ranks_per_node;
    per_node_origin = absl::StrCat("--ranks-per-node ", per_node);
  } else if (const std::optional<int> r = RanksPerNodeFromHosts(t)) {
    per_node = *r;
    per_node_origin = "from the config's hosts";
  }
  SPECNODE_ASSIGN_OR_RETURN(const NodeGpus node, o.gpus_per_node.has_value()
                                                     ? PlannedNodeGpus(*o.gpus_per_node)
                                                     : ThisHostGpus());
  const int n_nodes = (t.world_size + per_node - 1) / per_node;
  SPECNODE_ASSIGN_OR_RETURN(
      const GpuLayout layout,
      PlanGpuLayout(t, per_node, per_node_origin, std::vector<NodeGpus>(n_nodes, node)));
  if (layout.ok()) return DescribeGpuLayout(layout, "             ");
  const std::vector<int> failing = layout.FailingRanks();
  std::string message = absl::StrFormat("%s: the GPU layout fails for rank%s %s:\n  %s", cfg.source,
                                        failing.size() == 1 ? "" : "s", RankRanges(failing),
                                        DescribeGpuLayout(layout, "  "));
  if (!o.gpus_per_node.has_value()) {
    absl::StrAppend(&message,
                    "\n  (every node is taken to show what this host shows; --gpus-per-node N "
                    "checks the layout for nodes of N GPUs each)");
  }
  return absl::FailedPreconditionError(message);
}

// The summary's compute line: one process's device and threads, or the ranks and groups.
std::string ComputeLine(const ServeConfig& cfg) {
  if (cfg.topology.single_process()) {
    return absl::StrFormat(
        "single process on %s, %d threads, activations %s", cfg.device.name(), cfg.threads,
        ActivationsName(ComputeOptions{cfg.activations, cfg.device, cfg.chat_template}));
  }
  std::string line =
      absl::StrFormat("%d ranks (mpirun -np %d)", cfg.topology.world_size, cfg.topology.world_size);
  for (const GroupTopology& g : cfg.topology.groups) {
    std::vector<int> ranks;
    for (const RankPlacement& p : g.target) ranks.push_back(p.rank);
    absl::StrAppendFormat(&line, "; group %s: draft rank %d, target ranks %s (TP %d)", g.name,
                          g.draft.rank, absl::StrJoin(ranks, ","), ranks.size());
  }
  return line;
}

// The summary's kv line: the mode (and what auto resolves to), the budget per target rank
// and what it holds at f16 / int4 and in sequences of max_len tokens.
std::string KvLine(const ServeConfig& cfg, const LlamaConfig& mc, int32_t max_len) {
  if (cfg.kv.mode == KvMode::kDense) return "dense (the f32 reference cache)";
  // KV bytes per token at f16 and int4 (K and V rows of every layer's kv heads).
  const auto per_token = [&mc](KvPrecision p) {
    return static_cast<double>(mc.n_layers) * mc.n_kv_heads * KvPairBytes(p, mc.head_dim);
  };
  const KvMode mode =
      cfg.device.is_cpu() && cfg.topology.single_process()
          ? KvStore::ResolvedMode(cfg.kv.mode, CpuPagePool::Caps(mc.head_dim, cfg.kv.rotate))
          : cfg.kv.mode;
  const std::string mode_text = absl::StrCat(
      std::string(KvModeName(cfg.kv.mode)),
      mode == cfg.kv.mode ? "" : absl::StrCat(" (", std::string(KvModeName(mode)), ")"));
  const double host_mib = cfg.kv.host_capacity_bytes / double{1 << 20};
  if (cfg.kv.memory_utilization > 0) {
    return absl::StrFormat(
        "%s, what is left of %.2f of each target rank's device memory with the model loaded "
        "(sized at start; ~%.0f bytes a token at f16, %d-token sequences), host tier %.0f MiB",
        mode_text, cfg.kv.memory_utilization, per_token(KvPrecision::kFull), max_len, host_mib);
  }
  const double cap = static_cast<double>(cfg.kv.capacity_bytes);
  return absl::StrFormat(
      "%s, %.0f MiB per target rank (~%.0f tokens at f16, ~%.0f at int4: %.1f sequences of "
      "%d tokens at f16), host tier %.0f MiB",
      mode_text, cap / (1 << 20), cap / per_token(KvPrecision::kFull),
      cap / per_token(KvPrecision::kInt4), cap / per_token(KvPrecision::kFull) / max_len, max_len,
      host_mib);
}

// The summary's http line: the endpoint serve would open (none is opened here).
std::string HttpLine(const ServeConfig& cfg, int32_t max_len) {
  if (!cfg.http_bind.has_value()) return "off";
  const char* key =
      cfg.http_api_key_env.empty() ? nullptr : std::getenv(cfg.http_api_key_env.c_str());
  return absl::StrFormat(
      "http://%s (/v1 as \"%s\", max_model_len %d; /metrics, /health; bearer key from $%s: %s)",
      cfg.http_bind->text(), absl::StrJoin(ServedModelNames(cfg), "\", \""), max_len,
      cfg.http_api_key_env, key != nullptr && *key != '\0' ? "set" : "unset, no authentication");
}

}  // namespace

absl::Status CheckConfig(const ServeConfig& cfg, const GpuCheckOptions& gpu_options) {
  // Where the ranks land needs no model: checked first, so a machine without the model
  // files still gets the layout's verdict.
  SPECNODE_ASSIGN_OR_RETURN(const std::string gpus, CheckGpuPlacement(cfg, gpu_options));
  SPECNODE_ASSIGN_OR_RETURN(const ModelHeader target,
                            OpenModelHeader("target", cfg.model, cfg.chat_template));
  const LlamaConfig& mc = target.config;
  if (cfg.topology.single_process()) {
    SPECNODE_RETURN_IF_ERROR(CheckRunnerOptions(RunnerOptionsFor(cfg), &mc));
  } else {
    // The cluster's own start-up checks, with the world size mpirun would be given.
    SPECNODE_RETURN_IF_ERROR(CheckCluster(cfg, cfg.topology.world_size));
  }
  std::string draft_line;
  SPECNODE_RETURN_IF_ERROR(CheckDraft(cfg, target, &draft_line));
  if (!cfg.draft.none()) {
    SPECNODE_RETURN_IF_ERROR(SpecController::Create(ControllerConfigFor(cfg)).status());
  }
  std::string router_line = "no rules, default domain " + cfg.default_domain;
  if (!cfg.router_rules_file.empty()) {
    SPECNODE_RETURN_IF_ERROR(LoadRouterRules(cfg.router_rules_file).status());
    router_line = cfg.router_rules_file;
  } else {
    RouterConfig rc;
    rc.default_domain = cfg.default_domain;
    SPECNODE_RETURN_IF_ERROR(DomainRouter::Create(rc).status());
  }
  // Chat requests render the template; one that cannot be rendered fails them only.
  std::string chat = cfg.chat_template.empty() ? "the file's" : "built-in (model.chat_template)";
  if (absl::Status s =
          ApplyChatTemplate(target.tokenizer->spec().chat_template, {{"user", "hi"}}, true)
              .status();
      !s.ok()) {
    chat = absl::StrCat("UNUSABLE, chat requests will fail: ", s.message());
  }
  SPECNODE_ASSIGN_OR_RETURN(const int32_t max_len, EffectiveMaxModelLen(cfg, mc.context_length));
  absl::PrintF(
      "specnode serve --check-config: %s: ok\n"
      "  model:     %s (%s, GGUF v%u, %d tensors, %.1f MiB of weights)\n"
      "  arch:      %s\n"
      "  layers:    %d, context %d tokens, vocabulary %d\n"
      "  tokenizer: %d tokens; chat template: %s\n"
      "  compute:   %s\n"
      "%s"
      "  kv:        %s\n"
      "  draft:     %s, k_max %d, acceptance %s\n"
      "  router:    %s\n"
      "  bind:      %s (ZeroMQ ROUTER)\n"
      "  http:      %s\n"
      "  metrics:   %s\n"
      "  kv events: %s\n"
      "  limits:    max_active %d, max_queue %d, max_tokens %d; drain %g s after SIGTERM\n",
      cfg.source, cfg.model, mc.name.empty() ? mc.architecture : mc.name, target.file->version(),
      static_cast<int>(target.file->tensors().size()),
      target.file->tensor_bytes() / double{1 << 20}, mc.Summary(), mc.n_layers, mc.context_length,
      mc.vocab_size, target.tokenizer->vocab_size(), chat, ComputeLine(cfg),
      gpus.empty() ? "" : absl::StrCat("  gpus:      ", gpus, "\n"), KvLine(cfg, mc, max_len),
      draft_line, cfg.k_max, std::string(AcceptanceRuleName(cfg.acceptance)), router_line, cfg.bind,
      HttpLine(cfg, max_len),
      cfg.metrics_bind.empty() ? "off" : absl::StrCat("http://", cfg.metrics_bind, "/metrics"),
      cfg.kv_events_bind.empty() ? "off" : cfg.kv_events_bind, cfg.max_active, cfg.max_queue,
      static_cast<int>(cfg.limits.max_tokens), cfg.drain_timeout_s);
  return absl::OkStatus();
}

// What a single-process node asks of its device (CheckRunnerOptions).
RunnerOptions RunnerOptionsFor(const ServeConfig& cfg) {
  RunnerOptions ro;
  ro.device = cfg.device;
  ro.kv = cfg.kv;
  ro.activations = cfg.activations;
  return ro;
}

absl::StatusOr<GpuCheckOptions> GpuCheckOptionsFromArgs(const CliArgs& args) {
  GpuCheckOptions o;
  if ((args.Has("ranks-per-node") || args.Has("gpus-per-node")) && !args.Has("check-config")) {
    return absl::InvalidArgumentError(
        "--ranks-per-node and --gpus-per-node go with --check-config (serve's ranks run where "
        "mpirun puts them, on the GPUs their node has)");
  }
  if (args.Has("ranks-per-node")) {
    SPECNODE_ASSIGN_OR_RETURN(const int64_t r, args.GetInt("ranks-per-node", 1, 1, 65536));
    o.ranks_per_node = static_cast<int>(r);
  }
  if (args.Has("gpus-per-node")) {
    SPECNODE_ASSIGN_OR_RETURN(const int64_t n, args.GetInt("gpus-per-node", 0, 0, 1024));
    o.gpus_per_node = static_cast<int>(n);
  }
  return o;
}

}  // namespace specnode
