// The YAML cluster config of `specnode serve --config` (cluster-configs/*.yaml, schema in
// docs/configs.md), parsed once at start-up into a read-only ServeConfig that the rest of
// the node only reads. Every error names the file, line and key; unknown keys are errors.
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "coordinator/acceptance.h"
#include "coordinator/draft_spec.h"
#include "coordinator/scheduler.h"
#include "coordinator/spec_controller.h"
#include "kvstore/kv_options.h"
#include "model/llama/device.h"
#include "node/serve/http_address.h"
#include "node/serve/kv_event_publisher.h"
#include "node/serve/protocol.h"

namespace specnode {

// Where the roles of one job run (TensorRT-LLM's WorldConfig): built once from the
// config's `topology`, read-only afterwards. A group is one draft rank plus a
// tensor-parallel target over `target_ranks`; ranks are MPI ranks of the job, numbered
// 0..world_size-1, rank 0 being the coordinator (front end + router + the first draft).
// Every rank holds one role, except rank 0, which may also hold the draft of further
// groups (an n-gram or self draft always runs there; a draft model file may run on a rank
// of its own, node/serve_cluster.h).
struct RankPlacement {
  int rank = 0;
  Device device;     // parsed where the YAML names it
  // Optional: the node the rank is meant to run on. mpirun's hostfile and --map-by decide;
  // `serve --check-config` compares the names with that mapping (gpu_layout.h).
  std::string host;
};
struct GroupTopology {
  std::string name;
  RankPlacement draft;
  std::vector<RankPlacement> target;  // TP size = target.size()
};
struct Topology {
  std::vector<GroupTopology> groups;
  int world_size = 1;  // number of ranks the layout needs (mpirun -np)
  // Longest wait, in seconds, for a target rank's answer to a step (and for the target
  // ranks' collectives); beyond it the rank counts as failed. topology.timeout_s.
  double timeout_s = 5.0;
  bool single_process() const { return world_size == 1; }
};

// vLLM's default API port: `serve` answers the OpenAI API there unless told otherwise.
inline constexpr int kDefaultHttpPort = 8000;

struct ServeConfig {
  std::string source = "(defaults)";        // file name, for messages
  std::string model = "default";            // "default" = DefaultModelPath()
  int threads = 0;                          // 0 = DefaultThreads()
  // model.activations: int16 | int8 (every CPU rank); unset: the device's own (a GPU
  // refuses a set value).
  std::optional<ActQuant> activations;
  // model.device: cpu | cuda:N — the target of a single-process node (with a topology,
  // each rank's device is in topology.groups).
  Device device;
  // model.chat_template: chatml | llama3 | zephyr | gemma, as the built-in template's text
  // (BuiltinChatTemplate) replacing the model file's; empty: the file's own.
  std::string chat_template;
  std::string bind = "tcp://127.0.0.1:5555";
  int max_active = 16;
  // serve.drain_timeout_s: after SIGINT/SIGTERM, running requests get this long to finish;
  // whatever is left then ends with a terminal `cancelled` reply and the node exits 0.
  double drain_timeout_s = 30.0;
  int max_queue = 256;
  ProtocolLimits limits;
  std::string curve_secret_key;
  // HTTP Prometheus endpoint "IPV4:PORT" (GET /metrics, /health only; http_server.h); "" = off.
  std::string metrics_bind;
  // serve.http_bind: the OpenAI-compatible API with /metrics and /health (http_server.h),
  // parsed ("PORT" = 127.0.0.1:PORT); unset ("off" or "" in the file) = off. On by default
  // on vLLM's port 8000, loopback only: the API has no key unless serve.http_api_key_env's
  // variable is set, so exposing it (--host 0.0.0.0) is the user's explicit choice.
  std::optional<HttpAddress> http_bind = HttpAddress{"127.0.0.1", kDefaultHttpPort};
  // serve.http_api_key_env: the environment variable holding the API key /v1 routes require
  // as "Authorization: Bearer KEY" (unset or empty variable: no auth). The key itself stays
  // out of config files.
  std::string http_api_key_env = "SPECNODE_API_KEY";
  int64_t http_max_body_bytes = 4 << 20;  // serve.http_max_body_bytes
  int http_threads = 512;                 // serve.http_threads: concurrent HTTP requests
  // serve.served_model_name (a name or a list; flag --served-model-name A [B ...]): the
  // model ids /v1/models lists and a request's `model` may name, the first being the one
  // answered when a request names none and the metrics' model_name label; empty = the model
  // file's name without ".gguf" (ServedModelNames, serve_node.h).
  std::vector<std::string> served_model_names;
  // serve.max_model_len (flag --max-model-len): the longest sequence (prompt + completion,
  // in tokens) a request may take; 0 = the target's context length. Larger than that
  // context is refused at load; /v1/models reports it.
  int max_model_len = 0;
  // serve.kv_events_bind: ZeroMQ PUB endpoint for the prefix cache's KV events in vLLM's
  // format (kv_event_publisher.h); "" = off. kv_events_replay_bind: the ROUTER endpoint
  // answering replay requests ("" = no replay). kv_events_topic: the PUB topic frame.
  std::string kv_events_bind, kv_events_replay_bind, kv_events_topic;
  // serve.kv_events_encoding: array (vLLM <= 0.23's tagged arrays, the default) | map.
  KvEventEncoding kv_events_encoding = KvEventEncoding::kArray;
  DraftSpec draft;  // speculation.draft, parsed (coordinator/draft_spec.h); default ngram
  // speculation.alternatives: more drafters for every group, on the group's target; the
  // router chooses among them and `draft` per domain (docs/speculative.md "Router"). Never
  // "none"; with a topology only prompt lookup (ngram[:N]), which needs no weights on the
  // coordinator.
  std::vector<DraftSpec> alternatives;
  int k_max = 4;
  // speculation.tree_nodes: > 0 lets a tree-building drafter (suffix, recycle, a draft model)
  // propose draft trees of up to this many nodes, verified in one pass
  // (SpecEngineOptions::tree_nodes).
  int tree_nodes = 0;
  // speculation.tree_choice: "measured" (false, default) verifies a tree only where its
  // measured gain pays for its rows (coordinator/tree_gain.h); "always" (true) verifies every
  // tree (SpecEngineOptions::trees_always).
  bool trees_always = false;
  double free_threshold = 0.6, disable_threshold = 0.4;
  int probe_every = 32;
  // speculation.acceptance: how sampled drafts are accepted (coordinator/acceptance.h).
  AcceptanceRule acceptance = AcceptanceRule::kMatch;
  std::string router_rules_file;
  std::string default_domain = "default";
  KvOptions kv;  // the kv: section, typed (kvstore/kv_options.h)
  SchedulerOptions sla;  // classes, default class, window fraction (max_* copied in)
  Topology topology;     // absent in the config: one group, everything in this process
};

// speculation.alternatives from a comma-separated list (the --draft-alternatives flag):
// each a drafter spec, never "none"; under a multi-rank `topology` only ngram[:N].
// InvalidArgument naming the offending entry.
absl::StatusOr<std::vector<DraftSpec>> ParseAlternatives(std::string_view list,
                                                         const Topology& topology);

// Alternatives join a draft: InvalidArgument when speculation.alternatives is set while
// speculation.draft is none.
absl::Status CheckAlternatives(const ServeConfig& cfg);

// Parses YAML text (`source` names it in errors). InvalidArgument like
// "local.yaml:12: serve.max_active: expected an integer in [1, 4096]".
absl::StatusOr<ServeConfig> ParseServeConfig(const std::string& yaml_text,
                                             const std::string& source);
absl::StatusOr<ServeConfig> LoadServeConfig(const std::string& path);

// The served names' rules (config and --served-model-name alike): each non-empty, at most
// 256 bytes, no whitespace or control characters, no name twice. InvalidArgument naming the
// offending name.
absl::Status CheckServedModelNames(const std::vector<std::string>& names);

// The adaptive controller a config's `speculation` section asks for (k range, thresholds,
// probing); everything else at SpecControllerConfig's defaults.
SpecControllerConfig ControllerConfigFor(const ServeConfig& c);

// cluster-configs/local-cpu.yaml, compiled into the binary.
extern const char kEmbeddedLocalCpuConfig[];

}  // namespace specnode
