// specnode serve: the node's command line. Reads the config (--config FILE, else the
// embedded cluster-configs/local-cpu.yaml) with flags applied on top, then serves: in this
// process (ServeNode, serve_node.h), or under mpirun with a multi-rank config as the
// cluster's rank 0 or a shard rank (node/cluster/serve_cluster.h). --check-config checks
// instead: the config, the models' GGUF headers and, for GPU ranks, where each rank lands
// and which GPU it opens (node/serve/gpu_layout.h).
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
#include "absl/strings/str_join.h"
#include "coordinator/domain_router.h"
#include "coordinator/drafter_factory.h"
#include "coordinator/model_drafter.h"
#include "coordinator/spec_controller.h"
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
#include "node/cli/commands.h"
#include "node/cli/model_flags.h"
#include "node/cluster/serve_cluster.h"
#include "node/serve/cluster_config.h"
#include "node/serve/config_keys.h"
#include "node/serve/gpu_inventory.h"
#include "node/serve/gpu_layout.h"
#include "node/serve/loading_listeners.h"
#include "node/serve/metrics_http.h"
#include "node/serve/serve_node.h"
#include "node/session/model_session.h"
#include "node/session/router_config.h"
#include "runtime/runner_factory.h"
#include "tensor-parallel/shard_plan.h"

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
      "  --tree-nodes N      draft trees of up to N nodes from a suffix or recycle drafter,\n"
      "                      verified in one pass where they measure faster (default 0)\n"
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

}  // namespace

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

// --check-config's GPU layout flags, parsed.
struct GpuCheckOptions {
  std::optional<int> ranks_per_node;  // --ranks-per-node R: mpirun --map-by ppr:R:node
  std::optional<int> gpus_per_node;   // --gpus-per-node N: nodes of N GPUs, not this host's
};

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
  std::string message =
      absl::StrFormat("%s: the GPU layout fails for rank%s %s:\n  %s", cfg.source,
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
  std::string line = absl::StrFormat("%d ranks (mpirun -np %d)", cfg.topology.world_size,
                                     cfg.topology.world_size);
  for (const GroupTopology& g : cfg.topology.groups) {
    std::vector<int> ranks;
    for (const RankPlacement& p : g.target) ranks.push_back(p.rank);
    absl::StrAppendFormat(&line, "; group %s: draft rank %d, target ranks %s (TP %d)", g.name,
                          g.draft.rank, absl::StrJoin(ranks, ","), ranks.size());
  }
  return line;
}

// What a single-process node asks of its device (CheckRunnerOptions).
RunnerOptions RunnerOptionsFor(const ServeConfig& cfg) {
  RunnerOptions ro;
  ro.device = cfg.device;
  ro.kv = cfg.kv;
  ro.activations = cfg.activations;
  return ro;
}

// The summary's kv line: the mode (and what auto resolves to), the budget per target rank
// and what it holds at f16 / int4 and in sequences of max_len tokens.
std::string KvLine(const ServeConfig& cfg, const LlamaConfig& mc, int32_t max_len) {
  if (cfg.kv.mode == KvMode::kDense) return "dense (the f32 reference cache)";
  // KV bytes per token at f16 and int4 (K and V rows of every layer's kv heads).
  const auto per_token = [&mc](KvPrecision p) {
    return 2.0 * mc.n_layers * mc.n_kv_heads * KvRowBytes(p, mc.head_dim);
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
      static_cast<int>(target.file->tensors().size()), target.file->tensor_bytes() / double{1 << 20},
      mc.Summary(),
      mc.n_layers, mc.context_length, mc.vocab_size, target.tokenizer->vocab_size(), chat,
      ComputeLine(cfg), gpus.empty() ? "" : absl::StrCat("  gpus:      ", gpus, "\n"),
      KvLine(cfg, mc, max_len),
      draft_line, cfg.k_max, std::string(AcceptanceRuleName(cfg.acceptance)), router_line,
      cfg.bind, HttpLine(cfg, max_len),
      cfg.metrics_bind.empty() ? "off" : absl::StrCat("http://", cfg.metrics_bind, "/metrics"),
      cfg.kv_events_bind.empty() ? "off" : cfg.kv_events_bind, cfg.max_active, cfg.max_queue,
      static_cast<int>(cfg.limits.max_tokens), cfg.drain_timeout_s);
  return absl::OkStatus();
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
