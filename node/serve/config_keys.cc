#include "node/serve/config_keys.h"

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "coordinator/acceptance.h"
#include "node/serve/cluster_config.h"

namespace specnode {
namespace {

std::string N(int64_t v) { return std::to_string(v); }
std::string D(double v) { return absl::StrCat(v); }
std::string Join(const std::vector<std::string>& names) {
  return names.empty() ? "(the file's name)" : absl::StrJoin(names, ",");
}

constexpr char kLayout[] = "a list of groups: YAML only (cluster-configs/)";
constexpr char kClasses[] = "a list of classes: YAML only";

constexpr ConfigKey kKeys[] = {
    {"version", "", "the schema's version (1)", nullptr},
    {"model.target", "--model", "", +[](const ServeConfig& c) { return c.model; }},
    {"model.threads", "--threads", "", +[](const ServeConfig& c) { return N(c.threads); }},
    {"model.activations", "--activations", "",
     +[](const ServeConfig& c) {
       return !c.activations                      ? std::string("unset")
              : *c.activations == ActQuant::kInt8 ? std::string("int8")
                                                  : std::string("int16");
     }},
    {"model.device", "--device", "", +[](const ServeConfig& c) { return c.device.name(); }},
    {"model.chat_template", "--chat-template", "",
     +[](const ServeConfig& c) {
       return c.chat_template.empty() ? std::string("the file's")
                                      : "built in, " + N(c.chat_template.size()) + " bytes";
     }},
    {"serve.bind", "--bind", "", +[](const ServeConfig& c) { return c.bind; }},
    {"serve.max_active", "--max-active", "", +[](const ServeConfig& c) { return N(c.max_active); }},
    {"serve.max_queue", "--max-queue", "", +[](const ServeConfig& c) { return N(c.max_queue); }},
    {"serve.max_tokens", "--max-tokens", "",
     +[](const ServeConfig& c) { return N(c.limits.max_tokens); }},
    {"serve.max_frame_bytes", "--max-frame-bytes", "",
     +[](const ServeConfig& c) { return N(c.limits.max_frame_bytes); }},
    {"serve.drain_timeout_s", "--drain-timeout-s", "",
     +[](const ServeConfig& c) { return D(c.drain_timeout_s); }},
    {"serve.curve_secret_key", "", "a secret: kept off command lines, which `ps` shows",
     +[](const ServeConfig& c) {
       return c.curve_secret_key.empty() ? std::string("off") : std::string("set");
     }},
    {"serve.metrics_bind", "--metrics-bind", "",
     +[](const ServeConfig& c) { return c.metrics_bind; }},
    {"serve.http_bind", "--http-bind", "`--host` and `--port` set its halves (vLLM's flags)",
     +[](const ServeConfig& c) {
       return c.http_bind.has_value() ? c.http_bind->text() : std::string("off");
     }},
    {"serve.http_api_key_env", "--http-api-key-env", "",
     +[](const ServeConfig& c) { return c.http_api_key_env; }},
    {"serve.http_max_body_bytes", "--http-max-body-bytes", "",
     +[](const ServeConfig& c) { return N(c.http_max_body_bytes); }},
    {"serve.http_threads", "--http-threads", "",
     +[](const ServeConfig& c) { return N(c.http_threads); }},
    {"serve.served_model_name", "--served-model-name", "several names: `--served-model-name A B`",
     +[](const ServeConfig& c) { return Join(c.served_model_names); }},
    {"serve.model_name", "--served-model-name", "the older spelling of served_model_name"},
    {"serve.max_model_len", "--max-model-len", "",
     +[](const ServeConfig& c) { return N(c.max_model_len); }},
    {"serve.kv_events_bind", "--kv-events-bind", "",
     +[](const ServeConfig& c) { return c.kv_events_bind; }},
    {"serve.kv_events_replay_bind", "--kv-events-replay-bind", "",
     +[](const ServeConfig& c) { return c.kv_events_replay_bind; }},
    {"serve.kv_events_topic", "--kv-events-topic", "",
     +[](const ServeConfig& c) { return c.kv_events_topic; }},
    {"serve.kv_events_encoding", "--kv-events-encoding", "",
     +[](const ServeConfig& c) {
       return c.kv_events_encoding == KvEventEncoding::kMap ? std::string("map")
                                                            : std::string("array");
     }},
    {"speculation.draft", "--draft", "", +[](const ServeConfig& c) { return c.draft.text(); }},
    {"speculation.alternatives", "--draft-alternatives",
     "comma-separated: `ngram` or `ngram,self:8`",
     +[](const ServeConfig& c) {
       std::vector<std::string> texts;
       for (const DraftSpec& d : c.alternatives) texts.push_back(d.text());
       return texts.empty() ? std::string("(none)") : absl::StrJoin(texts, ",");
     }},
    {"speculation.k_max", "--spec-k", "", +[](const ServeConfig& c) { return N(c.k_max); }},
    {"speculation.tree_nodes", "--tree-nodes", "",
     +[](const ServeConfig& c) { return N(c.tree_nodes); }},
    {"speculation.tree_choice", "", "how trees are chosen over chains: YAML only",
     +[](const ServeConfig& c) { return std::string(c.trees_always ? "always" : "measured"); }},
    {"speculation.free_threshold", "", "the controller's bands: YAML only (`specnode tune`)",
     +[](const ServeConfig& c) { return D(c.free_threshold); }},
    {"speculation.disable_threshold", "", "the controller's bands: YAML only (`specnode tune`)",
     +[](const ServeConfig& c) { return D(c.disable_threshold); }},
    {"speculation.probe_every", "", "the controller's probing: YAML only (`specnode tune`)",
     +[](const ServeConfig& c) { return N(c.probe_every); }},
    {"speculation.acceptance", "--acceptance", "",
     +[](const ServeConfig& c) { return std::string(AcceptanceRuleName(c.acceptance)); }},
    {"router.rules_file", "--router-rules", "",
     +[](const ServeConfig& c) { return c.router_rules_file; }},
    {"router.default_domain", "--default-domain", "",
     +[](const ServeConfig& c) { return c.default_domain; }},
    {"kv.mode", "--kv-mode", "",
     +[](const ServeConfig& c) { return std::string(KvModeName(c.kv.mode)); }},
    {"kv.capacity_mb", "--kv-capacity-mb", "",
     +[](const ServeConfig& c) { return N(c.kv.capacity_bytes >> 20); }},
    {"kv.memory_utilization", "--gpu-memory-utilization", "vLLM's name",
     +[](const ServeConfig& c) { return D(c.kv.memory_utilization); }},
    {"kv.host_capacity_mb", "--kv-host-capacity-mb", "",
     +[](const ServeConfig& c) { return N(c.kv.host_capacity_bytes >> 20); }},
    {"kv.page_tokens", "--kv-page-tokens", "",
     +[](const ServeConfig& c) { return N(c.kv.page_tokens); }},
    {"kv.sink_tokens", "--kv-sinks", "", +[](const ServeConfig& c) { return N(c.kv.sink_tokens); }},
    {"kv.window_tokens", "--kv-window", "",
     +[](const ServeConfig& c) { return N(c.kv.window_tokens); }},
    {"kv.critical_threshold", "--kv-critical-threshold", "",
     +[](const ServeConfig& c) { return D(c.kv.critical_threshold); }},
    {"kv.cold_threshold", "--kv-cold-threshold", "",
     +[](const ServeConfig& c) { return D(c.kv.cold_threshold); }},
    {"kv.bytes_per_token", "--kv-bytes-per-token", "",
     +[](const ServeConfig& c) { return N(c.kv.bytes_per_token); }},
    {"kv.budget_rank", "--kv-budget-rank", "",
     +[](const ServeConfig& c) { return std::string(KvBudgetRankName(c.kv.budget_rank)); }},
    {"kv.mass_sample_every", "--kv-sample-every", "",
     +[](const ServeConfig& c) { return N(c.kv.mass_sample_every); }},
    {"kv.demote_every", "--kv-demote-every", "",
     +[](const ServeConfig& c) { return N(c.kv.demote_every); }},
    {"kv.evict_window", "--kv-evict-window", "",
     +[](const ServeConfig& c) { return c.kv.evict ? N(c.kv.evict_window) : std::string("off"); }},
    {"kv.rotate", "--kv-no-rotate", "sets false; true is the default where it applies",
     +[](const ServeConfig& c) {
       return !c.kv.rotate   ? std::string("unset")
              : *c.kv.rotate ? std::string("true")
                             : std::string("false");
     }},
    {"kv.prefix_cache", "--kv-no-prefix-cache", "sets false (the default is true)",
     +[](const ServeConfig& c) {
       return c.kv.prefix_cache ? std::string("true") : std::string("false");
     }},
    {"sla.default", "", kClasses, +[](const ServeConfig& c) { return c.sla.default_class; }},
    {"sla.window_fraction", "", kClasses,
     +[](const ServeConfig& c) { return D(c.sla.window_fraction); }},
    {"sla.classes[].name", "", kClasses, nullptr},
    {"sla.classes[].ttft_p99_ms", "", kClasses, nullptr},
    {"sla.classes[].tpot_p99_ms", "", kClasses, nullptr},
    {"sla.classes[].priority", "", kClasses, nullptr},
    {"sla.classes[].shed", "", kClasses, nullptr},
    {"topology.timeout_s", "", kLayout,
     +[](const ServeConfig& c) { return D(c.topology.timeout_s); }},
    {"topology.groups[].name", "", kLayout, nullptr},
    {"topology.groups[].draft.rank", "", kLayout, nullptr},
    {"topology.groups[].draft.device", "", kLayout, nullptr},
    {"topology.groups[].draft.host", "", kLayout, nullptr},
    {"topology.groups[].target[].rank", "", kLayout, nullptr},
    {"topology.groups[].target[].device", "", kLayout, nullptr},
    {"topology.groups[].target[].host", "", kLayout, nullptr},
};

}  // namespace

std::span<const ConfigKey> ConfigKeys() { return kKeys; }

std::set<std::string> ConfigKeysUnder(std::string_view prefix) {
  std::set<std::string> names;
  for (const ConfigKey& k : kKeys) {
    std::string_view rest = k.key;
    if (!prefix.empty()) {
      if (!rest.starts_with(prefix) || rest.size() <= prefix.size() || rest[prefix.size()] != '.') {
        continue;
      }
      rest.remove_prefix(prefix.size() + 1);
    }
    std::string_view name = rest.substr(0, rest.find('.'));
    if (name.ends_with("[]")) name.remove_suffix(2);
    names.emplace(name);
  }
  return names;
}

std::string ConfigValues(const ServeConfig& config) {
  std::string out;
  for (const ConfigKey& k : kKeys) {
    if (k.value != nullptr) out += std::string(k.key) + ": " + k.value(config) + "\n";
  }
  return out;
}

std::string ConfigKeysMarkdown() {
  std::string out = "| YAML key | flag | note |\n|---|---|---|\n";
  for (const ConfigKey& k : kKeys) {
    const std::string flag = k.flag.empty() ? "—" : "`" + std::string(k.flag) + "`";
    out += "| `" + std::string(k.key) + "` | " + flag + " | " + std::string(k.note) + " |\n";
  }
  return out;
}

}  // namespace specnode
