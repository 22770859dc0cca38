#include "node/serve/cluster_config.h"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "model/cpu/act_quant.h"
#include "model/tokenizer/chat_template.h"
#include "node/serve/config_keys.h"
#include "node/serve/metrics_http.h"

namespace specnode {
namespace {

// tcp://HOST:PORT (HOST may be * for every interface), ipc://PATH or inproc://NAME.
bool ValidZmqEndpoint(const std::string& e) {
  for (const char* scheme : {"ipc://", "inproc://"}) {
    if (e.rfind(scheme, 0) == 0) return e.size() > std::string(scheme).size();
  }
  if (e.rfind("tcp://", 0) != 0) return false;
  const size_t colon = e.rfind(':');
  int port = 0;
  return colon > 6 && absl::SimpleAtoi(e.substr(colon + 1), &port) && port >= 0 && port <= 65535;
}

// Reads typed values out of a YAML tree, turning every problem into a status that names
// the file, the line and the dotted key.
#define CFG_TRY_INNER(expr) \
  do {                        \
    absl::Status _s = (expr); \
    if (!_s.ok()) return _s;  \
  } while (0)

class Reader {
 public:
  explicit Reader(std::string source) : source_(std::move(source)) {}

  absl::Status Error(const YAML::Node& at, const std::string& key, const std::string& what) {
    const int line = at.IsDefined() && at.Mark().line >= 0 ? at.Mark().line + 1 : 0;
    return absl::InvalidArgumentError(absl::StrCat(source_, ":", line, ": ", key, ": ", what));
  }

  // A mapping whose keys are all in `allowed` (absent = empty mapping), each at most once
  // (YAML parsers keep the first of duplicate keys silently; here it is an error).
  absl::Status Section(const YAML::Node& node, const std::string& key,
                       const std::set<std::string>& allowed) {
    if (!node.IsDefined() || node.IsNull()) return absl::OkStatus();
    if (!node.IsMap()) return Error(node, key, "expected a mapping");
    std::set<std::string> seen;
    for (const auto& kv : node) {
      const std::string k = kv.first.as<std::string>();
      const std::string dotted = key.empty() ? k : key + "." + k;
      if (!allowed.count(k)) return Error(kv.first, dotted, "unknown key");
      if (!seen.insert(k).second) return Error(kv.first, dotted, "duplicate key");
    }
    return absl::OkStatus();
  }

  absl::Status Int(const YAML::Node& parent, const std::string& section, const char* name,
                   int64_t lo, int64_t hi, int* out) {
    if (!parent.IsDefined() || !parent.IsMap()) return absl::OkStatus();
    const YAML::Node n = parent[name];
    if (!n.IsDefined() || n.IsNull()) return absl::OkStatus();
    int64_t v;
    if (!n.IsScalar() || !YAML::convert<int64_t>::decode(n, v) || v < lo || v > hi) {
      return Error(n, section + "." + name,
                   absl::StrCat("expected an integer in [", lo, ", ", hi, "]"));
    }
    *out = static_cast<int>(v);
    return absl::OkStatus();
  }

  absl::Status Double(const YAML::Node& parent, const std::string& section, const char* name,
                      double lo, double hi, double* out) {
    if (!parent.IsDefined() || !parent.IsMap()) return absl::OkStatus();
    const YAML::Node n = parent[name];
    if (!n.IsDefined() || n.IsNull()) return absl::OkStatus();
    double v;
    if (!n.IsScalar() || !YAML::convert<double>::decode(n, v) || !(v >= lo && v <= hi)) {
      return Error(n, section + "." + name,
                   absl::StrCat("expected a number in [", lo, ", ", hi, "]"));
    }
    *out = v;
    return absl::OkStatus();
  }

  absl::Status Bool(const YAML::Node& parent, const std::string& section, const char* name,
                    bool* out) {
    if (!parent.IsDefined() || !parent.IsMap()) return absl::OkStatus();
    const YAML::Node n = parent[name];
    if (!n.IsDefined() || n.IsNull()) return absl::OkStatus();
    bool v;
    if (!n.IsScalar() || !YAML::convert<bool>::decode(n, v)) {
      return Error(n, section + "." + name, "expected true or false");
    }
    *out = v;
    return absl::OkStatus();
  }

  // A string key turned into a typed value by `parse` (a StatusOr<T> of the text): absent or
  // null leaves *out unchanged; the parser's error is reported at the key's file and line.
  template <class T, class ParseFn>
  absl::Status Parsed(const YAML::Node& parent, const std::string& section, const char* name,
                      ParseFn parse, T* out) {
    if (!parent.IsDefined() || !parent.IsMap()) return absl::OkStatus();
    if (!parent[name].IsDefined() || parent[name].IsNull()) return absl::OkStatus();
    std::string text;
    CFG_TRY_INNER(String(parent, section, name, &text));
    absl::StatusOr<T> v = parse(text);
    if (!v.ok())
      return Error(parent[name], section + "." + name, std::string(v.status().message()));
    *out = *v;
    return absl::OkStatus();
  }

  absl::Status Device(const YAML::Node& parent, const std::string& section, const char* name,
                      specnode::Device* out) {
    std::string text;
    CFG_TRY_INNER(String(parent, section, name, &text));
    if (text.empty()) return absl::OkStatus();
    absl::StatusOr<specnode::Device> d = ParseDevice(text);
    if (!d.ok()) return Error(parent[name], section + "." + name, std::string(d.status().message()));
    *out = *d;
    return absl::OkStatus();
  }

  // A string or a sequence of strings (absent: `out` unchanged).
  absl::Status Strings(const YAML::Node& parent, const std::string& section, const char* name,
                       std::vector<std::string>* out) {
    if (!parent.IsDefined() || !parent.IsMap()) return absl::OkStatus();
    const YAML::Node n = parent[name];
    if (!n.IsDefined() || n.IsNull()) return absl::OkStatus();
    out->clear();
    if (n.IsScalar()) {
      out->push_back(n.as<std::string>());
      return absl::OkStatus();
    }
    if (!n.IsSequence()) return Error(n, section + "." + name, "expected a string or a list");
    for (const YAML::Node& e : n) {
      if (!e.IsScalar()) return Error(e, section + "." + name, "expected a list of strings");
      out->push_back(e.as<std::string>());
    }
    return absl::OkStatus();
  }

  absl::Status String(const YAML::Node& parent, const std::string& section, const char* name,
                      std::string* out) {
    if (!parent.IsDefined() || !parent.IsMap()) return absl::OkStatus();
    const YAML::Node n = parent[name];
    if (!n.IsDefined() || n.IsNull()) return absl::OkStatus();
    if (!n.IsScalar()) return Error(n, section + "." + name, "expected a string");
    *out = n.as<std::string>();
    return absl::OkStatus();
  }

 private:
  std::string source_;
};

#define CFG_TRY(expr)          \
  do {                         \
    absl::Status _st = (expr); \
    if (!_st.ok()) return _st; \
  } while (0)

// table_key: the placement's rows in config_keys.h ("topology.groups[].draft", or
// "topology.groups[].target[]").
absl::Status ParsePlacement(Reader& r, const YAML::Node& n, const std::string& key,
                            std::string_view table_key, RankPlacement* out) {
  CFG_TRY(r.Section(n, key, ConfigKeysUnder(table_key)));
  if (!n.IsDefined() || !n.IsMap() || !n["rank"].IsDefined()) {
    return r.Error(n, key + ".rank", "required");
  }
  CFG_TRY(r.Int(n, key, "rank", 0, 65535, &out->rank));
  CFG_TRY(r.Device(n, key, "device", &out->device));
  CFG_TRY(r.String(n, key, "host", &out->host));
  return absl::OkStatus();
}

// topology: {timeout_s, groups: [{name, draft: {rank, device, host},
//                                  target: [{rank, device, host}...]}]}
absl::Status ParseTopology(Reader& r, const YAML::Node& t, Topology* out) {
  if (!t.IsDefined() || t.IsNull()) return absl::OkStatus();
  CFG_TRY(r.Section(t, "topology", ConfigKeysUnder("topology")));
  CFG_TRY(r.Double(t, "topology", "timeout_s", 0.1, 3600, &out->timeout_s));
  const YAML::Node groups = t["groups"];
  if (!groups.IsDefined() || !groups.IsSequence() || groups.size() == 0) {
    return r.Error(groups.IsDefined() ? groups : t, "topology.groups",
                   "expected a non-empty list of groups");
  }
  std::set<int> ranks;
  std::set<std::string> names;
  for (size_t i = 0; i < groups.size(); ++i) {
    const std::string key = absl::StrCat("topology.groups[", i, "]");
    const YAML::Node g = groups[i];
    CFG_TRY(r.Section(g, key, ConfigKeysUnder("topology.groups[]")));
    GroupTopology gt;
    gt.name = absl::StrCat("group", i);
    CFG_TRY(r.String(g, key, "name", &gt.name));
    if (!names.insert(gt.name).second) return r.Error(g, key + ".name", "duplicate group name");
    CFG_TRY(ParsePlacement(r, g["draft"], key + ".draft", "topology.groups[].draft", &gt.draft));
    const YAML::Node target = g["target"];
    if (!target.IsDefined() || !target.IsSequence() || target.size() == 0) {
      return r.Error(target.IsDefined() ? target : g, key + ".target",
                     "expected a non-empty list of target ranks (its length is the TP size)");
    }
    for (size_t j = 0; j < target.size(); ++j) {
      RankPlacement p;
      CFG_TRY(ParsePlacement(r, target[j], absl::StrCat(key, ".target[", j, "]"),
                             "topology.groups[].target[]", &p));
      gt.target.push_back(p);
    }
    std::vector<const RankPlacement*> placed = {&gt.draft};
    for (const RankPlacement& p : gt.target) placed.push_back(&p);
    for (const RankPlacement* p : placed) {
      // Rank 0 (the coordinator) may hold the draft of several groups.
      const bool shared_draft = p == &gt.draft && p->rank == 0 && i > 0;
      if (!ranks.insert(p->rank).second && !shared_draft) {
        return r.Error(g, key, absl::StrCat("rank ", p->rank, " is placed twice"));
      }
    }
    out->groups.push_back(std::move(gt));
  }
  if (*ranks.begin() != 0 || *ranks.rbegin() != static_cast<int>(ranks.size()) - 1) {
    return r.Error(
        t, "topology",
        absl::StrCat("ranks must be exactly 0..", ranks.size() - 1, " (one MPI rank per role)"));
  }
  if (out->groups[0].draft.rank != 0) {
    return r.Error(t, "topology.groups[0].draft.rank",
                   "rank 0 is the coordinator and holds the first group's draft");
  }
  out->world_size = static_cast<int>(ranks.size());
  return absl::OkStatus();
}

// serve.served_model_name (a name or a list) or its older name serve.model_name (not both),
// checked by CheckServedModelNames with the key's line.
absl::Status ReadServedModelNames(Reader& r, const YAML::Node& serve,
                                  std::vector<std::string>* names) {
  if (serve.IsDefined() && serve.IsMap() && serve["served_model_name"].IsDefined() &&
      serve["model_name"].IsDefined()) {
    return r.Error(serve["model_name"], "serve.model_name",
                   "is the older name of serve.served_model_name; give one of them");
  }
  for (const char* key : {"served_model_name", "model_name"}) {
    CFG_TRY(r.Strings(serve, "serve", key, names));
  }
  if (absl::Status st = CheckServedModelNames(*names); !st.ok()) {
    const char* key = serve["model_name"].IsDefined() ? "model_name" : "served_model_name";
    return r.Error(serve[key], absl::StrCat("serve.", key), std::string(st.message()));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<DraftSpec>> ParseAlternatives(std::string_view list,
                                                         const Topology& topology) {
  std::vector<DraftSpec> out;
  for (absl::string_view text :
       absl::StrSplit(absl::string_view(list.data(), list.size()), ',', absl::SkipWhitespace())) {
    absl::StatusOr<DraftSpec> d = ParseDraftSpec(std::string(absl::StripAsciiWhitespace(text)));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat(text, ": ", d.status().message()));
    if (d->none()) return absl::InvalidArgumentError("none is not a drafter");
    if (!topology.single_process() && !d->is_lookup()) {
      return absl::InvalidArgumentError(
          absl::StrCat(text,
                       ": with a topology only model-free drafters (ngram[:N], suffix[:N], "
                       "recycle[:N]) may be an "
                       "alternative"));
    }
    out.push_back(*d);
  }
  return out;
}

absl::Status CheckAlternatives(const ServeConfig& cfg) {
  if (cfg.draft.none() && !cfg.alternatives.empty()) {
    return absl::InvalidArgumentError(
        "speculation.alternatives needs a speculation.draft (it is none): the router chooses "
        "among the draft and its alternatives; make one of them the draft");
  }
  return absl::OkStatus();
}

namespace {

absl::StatusOr<ServeConfig> Parse(const YAML::Node& root, const std::string& source) {
  Reader r(source);
  ServeConfig c;
  c.source = source;
  CFG_TRY(r.Section(root, "", ConfigKeysUnder("")));
  if (root["version"].IsDefined()) {
    int version = 0;
    CFG_TRY(r.Int(root, "", "version", 1, 1, &version));
  }
  CFG_TRY(ParseTopology(r, root["topology"], &c.topology));
  const YAML::Node model = root["model"];
  CFG_TRY(r.Section(model, "model", ConfigKeysUnder("model")));
  CFG_TRY(r.String(model, "model", "target", &c.model));
  CFG_TRY(r.Int(model, "model", "threads", 0, 1024, &c.threads));
  std::string activations;
  CFG_TRY(r.String(model, "model", "activations", &activations));
  if (!activations.empty()) {
    ActQuant act;
    if (!ParseActQuant(activations, &act)) {
      return r.Error(model["activations"], "model.activations",
                     "expected int16 or int8, got \"" + activations + "\"");
    }
    c.activations = act;
  }
  CFG_TRY(r.Device(model, "model", "device", &c.device));
  std::string chat_template;
  CFG_TRY(r.String(model, "model", "chat_template", &chat_template));
  if (!chat_template.empty()) {
    absl::StatusOr<std::string> t = BuiltinChatTemplate(chat_template);
    if (!t.ok()) {
      return r.Error(model["chat_template"], "model.chat_template",
                     std::string(t.status().message()));
    }
    c.chat_template = *std::move(t);
  }
  if (!c.device.is_cpu() && root["topology"].IsDefined()) {
    return r.Error(model["device"], "model.device",
                   "applies to a single-process node; with a topology, set each rank's device "
                   "in topology.groups");
  }

  const YAML::Node serve = root["serve"];
  CFG_TRY(r.Section(serve, "serve", ConfigKeysUnder("serve")));
  CFG_TRY(r.String(serve, "serve", "bind", &c.bind));
  CFG_TRY(r.Int(serve, "serve", "max_active", 1, 4096, &c.max_active));
  CFG_TRY(r.Int(serve, "serve", "max_queue", 0, 1 << 20, &c.max_queue));
  int max_tokens = static_cast<int>(c.limits.max_tokens);
  CFG_TRY(r.Int(serve, "serve", "max_tokens", 1, 1 << 20, &max_tokens));
  c.limits.max_tokens = max_tokens;
  int frame = static_cast<int>(c.limits.max_frame_bytes);
  CFG_TRY(r.Int(serve, "serve", "max_frame_bytes", 256, 1 << 30, &frame));
  c.limits.max_frame_bytes = static_cast<size_t>(frame);
  CFG_TRY(r.Double(serve, "serve", "drain_timeout_s", 0, 3600, &c.drain_timeout_s));
  CFG_TRY(r.String(serve, "serve", "curve_secret_key", &c.curve_secret_key));
  CFG_TRY(r.String(serve, "serve", "metrics_bind", &c.metrics_bind));
  if (!c.metrics_bind.empty() && !ValidateMetricsAddress(c.metrics_bind).ok()) {
    return r.Error(serve["metrics_bind"], "serve.metrics_bind",
                   "expected IPV4:PORT (e.g. 127.0.0.1:9464) or \"\"");
  }
  std::string http_bind = c.http_bind.has_value() ? c.http_bind->text() : "off";
  CFG_TRY(r.String(serve, "serve", "http_bind", &http_bind));
  absl::StatusOr<std::optional<HttpAddress>> api = ParseHttpBind(http_bind);
  if (!api.ok())
    return r.Error(serve["http_bind"], "serve.http_bind", std::string(api.status().message()));
  c.http_bind = *api;
  CFG_TRY(r.String(serve, "serve", "http_api_key_env", &c.http_api_key_env));
  int body = static_cast<int>(c.http_max_body_bytes);
  CFG_TRY(r.Int(serve, "serve", "http_max_body_bytes", 1024, 1 << 30, &body));
  c.http_max_body_bytes = body;
  CFG_TRY(r.Int(serve, "serve", "http_threads", 1, 4096, &c.http_threads));
  CFG_TRY(ReadServedModelNames(r, serve, &c.served_model_names));
  CFG_TRY(r.Int(serve, "serve", "max_model_len", 0, 1 << 24, &c.max_model_len));
  for (const char* key : {"kv_events_bind", "kv_events_replay_bind"}) {
    std::string* out =
        std::string(key) == "kv_events_bind" ? &c.kv_events_bind : &c.kv_events_replay_bind;
    CFG_TRY(r.String(serve, "serve", key, out));
    if (!out->empty() && !ValidZmqEndpoint(*out)) {
      return r.Error(serve[key], absl::StrCat("serve.", key),
                     "expected a ZeroMQ endpoint (tcp://HOST:PORT, ipc://PATH) or \"\"");
    }
  }
  if (!c.kv_events_replay_bind.empty() && c.kv_events_bind.empty()) {
    return r.Error(serve["kv_events_replay_bind"], "serve.kv_events_replay_bind",
                   "needs serve.kv_events_bind (replay serves what that endpoint published)");
  }
  CFG_TRY(r.String(serve, "serve", "kv_events_topic", &c.kv_events_topic));
  std::string encoding;
  CFG_TRY(r.String(serve, "serve", "kv_events_encoding", &encoding));
  if (!encoding.empty()) {
    const std::optional<KvEventEncoding> e = ParseKvEventEncoding(encoding);
    if (!e.has_value()) {
      return r.Error(serve["kv_events_encoding"], "serve.kv_events_encoding",
                     "expected array (vLLM <= 0.23's layout) or map (later vLLM)");
    }
    c.kv_events_encoding = *e;
  }
  if (!c.curve_secret_key.empty() && c.curve_secret_key.size() != 40) {
    return r.Error(serve, "serve.curve_secret_key", "expected a 40-character Z85 key");
  }

  const YAML::Node spec = root["speculation"];
  CFG_TRY(r.Section(spec, "speculation", ConfigKeysUnder("speculation")));
  std::string draft;
  CFG_TRY(r.String(spec, "speculation", "draft", &draft));
  if (spec.IsDefined() && spec.IsMap() && spec["draft"].IsDefined() && !spec["draft"].IsNull()) {
    absl::StatusOr<DraftSpec> d = ParseDraftSpec(draft);
    if (!d.ok()) return r.Error(spec["draft"], "speculation.draft", std::string(d.status().message()));
    c.draft = *d;
  }
  std::vector<std::string> alternatives;
  CFG_TRY(r.Strings(spec, "speculation", "alternatives", &alternatives));
  if (!alternatives.empty()) {
    absl::StatusOr<std::vector<DraftSpec>> alts =
        ParseAlternatives(absl::StrJoin(alternatives, ","), c.topology);
    if (!alts.ok()) {
      return r.Error(spec["alternatives"], "speculation.alternatives",
                     std::string(alts.status().message()));
    }
    c.alternatives = *std::move(alts);
    if (c.draft.none()) {  // CheckAlternatives, with the key's line
      return r.Error(spec["alternatives"], "speculation.alternatives",
                     "needs a speculation.draft, which is none");
    }
  }
  CFG_TRY(r.Int(spec, "speculation", "k_max", 1, 64, &c.k_max));
  CFG_TRY(r.Int(spec, "speculation", "tree_nodes", 0, 64, &c.tree_nodes));
  std::string tree_choice;
  CFG_TRY(r.String(spec, "speculation", "tree_choice", &tree_choice));
  if (!tree_choice.empty()) {
    if (tree_choice != "measured" && tree_choice != "always") {
      return r.Error(spec["tree_choice"], "speculation.tree_choice",
                     "expected measured or always, got \"" + tree_choice + "\"");
    }
    c.trees_always = tree_choice == "always";
  }
  CFG_TRY(r.Double(spec, "speculation", "free_threshold", 0, 1, &c.free_threshold));
  CFG_TRY(r.Double(spec, "speculation", "disable_threshold", 0, 1, &c.disable_threshold));
  if (c.disable_threshold > c.free_threshold) {
    return r.Error(spec, "speculation.disable_threshold", "must be <= free_threshold");
  }
  CFG_TRY(r.Int(spec, "speculation", "probe_every", 1, 1 << 20, &c.probe_every));
  std::string acceptance;
  CFG_TRY(r.String(spec, "speculation", "acceptance", &acceptance));
  if (!acceptance.empty()) {
    absl::StatusOr<AcceptanceRule> rule = ParseAcceptanceRule(acceptance);
    if (!rule.ok()) {
      return r.Error(spec["acceptance"], "speculation.acceptance",
                     std::string(rule.status().message()));
    }
    c.acceptance = *rule;
  }

  const YAML::Node router = root["router"];
  CFG_TRY(r.Section(router, "router", ConfigKeysUnder("router")));
  CFG_TRY(r.String(router, "router", "rules_file", &c.router_rules_file));
  CFG_TRY(r.String(router, "router", "default_domain", &c.default_domain));

  const YAML::Node kv = root["kv"];
  CFG_TRY(r.Section(kv, "kv", ConfigKeysUnder("kv")));
  CFG_TRY(r.Parsed(kv, "kv", "mode", &ParseKvMode, &c.kv.mode));
  int capacity_mb = static_cast<int>(c.kv.capacity_bytes >> 20);
  CFG_TRY(r.Int(kv, "kv", "capacity_mb", 1, 1 << 24, &capacity_mb));
  c.kv.capacity_bytes = static_cast<int64_t>(capacity_mb) << 20;
  // A fraction of the device's memory instead (kvstore/kv_budget.h); 0 = capacity_mb.
  CFG_TRY(r.Double(kv, "kv", "memory_utilization", 0, 1, &c.kv.memory_utilization));
  // The swap tier that preemption parks KV in (0 = none: preempted requests recompute).
  int host_mb = static_cast<int>(c.kv.host_capacity_bytes >> 20);
  CFG_TRY(r.Int(kv, "kv", "host_capacity_mb", 0, 1 << 24, &host_mb));
  c.kv.host_capacity_bytes = static_cast<int64_t>(host_mb) << 20;
  CFG_TRY(r.Int(kv, "kv", "page_tokens", 1, 4096, &c.kv.page_tokens));
  CFG_TRY(r.Int(kv, "kv", "sink_tokens", 0, 1 << 20, &c.kv.sink_tokens));
  CFG_TRY(r.Int(kv, "kv", "window_tokens", 1, 1 << 20, &c.kv.window_tokens));
  double thr = c.kv.critical_threshold;
  CFG_TRY(r.Double(kv, "kv", "critical_threshold", 0, 1e6, &thr));
  c.kv.critical_threshold = static_cast<float>(thr);
  double cold = c.kv.cold_threshold;
  CFG_TRY(r.Double(kv, "kv", "cold_threshold", 0, 1e6, &cold));
  c.kv.cold_threshold = static_cast<float>(cold);
  int budget = static_cast<int>(c.kv.bytes_per_token);
  CFG_TRY(r.Int(kv, "kv", "bytes_per_token", 0, 1 << 30, &budget));
  c.kv.bytes_per_token = budget;
  if (budget > 0 && c.kv.mode != KvMode::kMixed && c.kv.mode != KvMode::kAuto) {
    return r.Error(kv["bytes_per_token"], "kv.bytes_per_token",
                   absl::StrCat("a byte budget needs kv.mode mixed (or auto), not ",
                                std::string(KvModeName(c.kv.mode))));
  }
  CFG_TRY(r.Parsed(kv, "kv", "budget_rank", &ParseKvBudgetRank, &c.kv.budget_rank));
  if (cold > 0 && cold > thr) {
    return r.Error(kv["cold_threshold"], "kv.cold_threshold",
                   "must be <= kv.critical_threshold (a token is cold or critical)");
  }
  CFG_TRY(r.Int(kv, "kv", "mass_sample_every", 1, 1 << 20, &c.kv.mass_sample_every));
  CFG_TRY(r.Int(kv, "kv", "demote_every", 1, 1 << 20, &c.kv.demote_every));
  // Sliding-window eviction (lossy) when set: tokens older than this many, except sinks.
  int evict_window = 0;
  CFG_TRY(r.Int(kv, "kv", "evict_window", 0, 1 << 24, &evict_window));
  if (evict_window > 0) {
    c.kv.evict = true;
    c.kv.evict_window = evict_window;
    if (evict_window < c.kv.window_tokens) {
      return r.Error(kv["evict_window"], "kv.evict_window", "must be >= kv.window_tokens");
    }
  }
  if (kv.IsDefined() && kv.IsMap() && kv["rotate"].IsDefined() && !kv["rotate"].IsNull()) {
    bool rotate = true;
    CFG_TRY(r.Bool(kv, "kv", "rotate", &rotate));
    c.kv.rotate = rotate;
  }
  CFG_TRY(r.Bool(kv, "kv", "prefix_cache", &c.kv.prefix_cache));
  if (!c.kv.prefix_cache && !c.kv_events_bind.empty()) {
    return r.Error(kv["prefix_cache"], "kv.prefix_cache",
                   "is false, and serve.kv_events_bind reports the prefix cache's events");
  }

  const YAML::Node sla = root["sla"];
  CFG_TRY(r.Section(sla, "sla", ConfigKeysUnder("sla")));
  CFG_TRY(r.String(sla, "sla", "default", &c.sla.default_class));
  CFG_TRY(r.Double(sla, "sla", "window_fraction", 0, 1, &c.sla.window_fraction));
  if (sla.IsDefined() && sla.IsMap() && sla["classes"].IsDefined()) {
    const YAML::Node classes = sla["classes"];
    if (!classes.IsSequence() || classes.size() == 0) {
      return r.Error(classes, "sla.classes", "expected a non-empty list");
    }
    c.sla.classes.clear();
    std::set<std::string> names;
    for (size_t i = 0; i < classes.size(); ++i) {
      const std::string key = absl::StrCat("sla.classes[", i, "]");
      const YAML::Node e = classes[i];
      CFG_TRY(r.Section(e, key, ConfigKeysUnder("sla.classes[]")));
      SlaClass cls;
      CFG_TRY(r.String(e, key, "name", &cls.name));
      if (cls.name.empty()) return r.Error(e, key + ".name", "required");
      if (!names.insert(cls.name).second) return r.Error(e, key + ".name", "duplicate class");
      CFG_TRY(r.Double(e, key, "ttft_p99_ms", 1, 1e7, &cls.ttft_p99_ms));
      CFG_TRY(r.Double(e, key, "tpot_p99_ms", 1, 1e7, &cls.tpot_p99_ms));
      CFG_TRY(r.Int(e, key, "priority", 0, 100, &cls.priority));
      CFG_TRY(r.Bool(e, key, "shed", &cls.shed));
      c.sla.classes.push_back(cls);
    }
  }
  bool found = false;
  for (const SlaClass& cls : c.sla.classes) found |= cls.name == c.sla.default_class;
  if (!found) {
    const YAML::Node at =
        sla.IsDefined() && sla.IsMap() && sla["default"].IsDefined() ? sla["default"] : root;
    return r.Error(at, "sla.default", "names no class in sla.classes");
  }
  c.sla.max_active = c.max_active;
  c.sla.max_queue = c.max_queue;
  return c;
}

}  // namespace

absl::StatusOr<ServeConfig> ParseServeConfig(const std::string& yaml_text,
                                             const std::string& source) {
  try {
    const YAML::Node root = YAML::Load(yaml_text);
    if (!root.IsDefined() || root.IsNull()) return Parse(YAML::Node(YAML::NodeType::Map), source);
    return Parse(root, source);
  } catch (const YAML::Exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(source, ":", e.mark.line + 1, ": not valid YAML: ", e.msg));
  }
}

absl::StatusOr<ServeConfig> LoadServeConfig(const std::string& path) {
  std::error_code ec;
  if (std::filesystem::is_directory(path, ec)) {
    return absl::InvalidArgumentError(
        absl::StrCat("config ", path, " is a directory, not a YAML file"));
  }
  std::ifstream in(path);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open config file ", path));
  std::stringstream text;
  text << in.rdbuf();
  return ParseServeConfig(text.str(), path);
}

absl::Status CheckServedModelNames(const std::vector<std::string>& names) {
  std::set<std::string> seen;
  for (const std::string& n : names) {
    if (n.empty()) return absl::InvalidArgumentError("a served model name is empty");
    if (n.size() > 256) return absl::InvalidArgumentError("a served model name is over 256 bytes");
    for (unsigned char ch : n) {
      if (ch <= ' ' || ch == 0x7f) {
        return absl::InvalidArgumentError(
            absl::StrCat("the served model name '", n, "' has whitespace or a control character"));
      }
    }
    if (!seen.insert(n).second) {
      return absl::InvalidArgumentError(
          absl::StrCat("the served model name '", n, "' is given twice"));
    }
  }
  return absl::OkStatus();
}

SpecControllerConfig ControllerConfigFor(const ServeConfig& c) {
  SpecControllerConfig cc;
  cc.k_max = c.k_max;
  cc.k_initial = std::min(cc.k_max, 4);
  cc.probe_k = std::min(cc.probe_k, cc.k_max);
  cc.free_threshold = c.free_threshold;
  cc.disable_threshold = c.disable_threshold;
  cc.probe_every = c.probe_every;
  return cc;
}

}  // namespace specnode
