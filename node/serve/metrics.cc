#include "node/serve/metrics.h"

#include <charconv>
#include <cmath>
#include <map>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/latency_histogram.h"
#include "coordinator/request_error.h"

namespace specnode {

std::string EscapeLabelValue(absl::string_view value) {
  std::string out;
  out.reserve(value.size());
  for (char c : value) {
    switch (c) {
      case '\\':
        out += "\\\\";
        break;
      case '"':
        out += "\\\"";
        break;
      case '\n':
        out += "\\n";
        break;
      default:
        out += c;
    }
  }
  return out;
}

std::string FormatSampleValue(double v) {
  if (std::isnan(v)) return "NaN";
  if (std::isinf(v)) return v > 0 ? "+Inf" : "-Inf";
  if (v == std::floor(v) && std::fabs(v) < 1e15) return absl::StrFormat("%.0f", v);
  char buf[32];
  const auto [end, ec] = std::to_chars(buf, buf + sizeof(buf), v);  // shortest round trip
  return std::string(buf, end);
}

namespace {

// One label pair, its value escaped: key="value".
std::string Label(absl::string_view key, absl::string_view value) {
  return absl::StrCat(key, "=\"", EscapeLabelValue(value), "\"");
}

class Exposition {
 public:
  // # HELP and # TYPE of a family (each family is written once, its samples right after).
  void Family(absl::string_view name, absl::string_view type, absl::string_view help) {
    absl::StrAppend(&out_, "# HELP ", name, " ", help, "\n# TYPE ", name, " ", type, "\n");
  }
  // labels: already formatted pairs joined by commas ("" = none).
  void Sample(absl::string_view name, absl::string_view labels, absl::string_view value) {
    if (labels.empty()) {
      absl::StrAppend(&out_, name, " ", value, "\n");
    } else {
      absl::StrAppend(&out_, name, "{", labels, "} ", value, "\n");
    }
  }
  void Sample(absl::string_view name, absl::string_view labels, int64_t value) {
    Sample(name, labels, absl::StrCat(value));
  }
  void Sample(absl::string_view name, absl::string_view labels, double value) {
    Sample(name, labels, FormatSampleValue(value));
  }
  void Counter(absl::string_view name, absl::string_view help, int64_t value) {
    Family(name, "counter", help);
    Sample(name, "", value);
  }
  // A counter family with one sample per key of `by`, labelled `key`.
  void LabelledCounter(absl::string_view name, absl::string_view help, absl::string_view key,
                       const std::map<std::string, int64_t>& by) {
    Family(name, "counter", help);
    for (const auto& [value, n] : by) Sample(name, Label(key, value), n);
  }
  void Gauge(absl::string_view name, absl::string_view help, double value) {
    Family(name, "gauge", help);
    Sample(name, "", value);
  }
  // A histogram family with one series per SLA class; `pick` selects the histogram.
  template <typename Pick>
  void Histogram(absl::string_view name, absl::string_view help,
                 const std::map<std::string, SchedulerSnapshot::SlaLatency>& by_sla, Pick pick) {
    Family(name, "histogram", help);
    const std::string bucket = absl::StrCat(name, "_bucket");
    const std::string sum = absl::StrCat(name, "_sum");
    const std::string count = absl::StrCat(name, "_count");
    for (const auto& [sla, lat] : by_sla) {
      const LatencyHistogram& h = pick(lat);
      const std::string sla_label = Label("sla", sla);
      const std::vector<int64_t> cumulative = h.CumulativeCounts();
      for (size_t i = 0; i < cumulative.size(); ++i) {
        Sample(bucket, absl::StrCat(sla_label, ",le=\"", FormatSampleValue(h.bounds()[i]), "\""),
               cumulative[i]);
      }
      Sample(bucket, absl::StrCat(sla_label, ",le=\"+Inf\""), h.count());
      Sample(sum, sla_label, h.sum());
      Sample(count, sla_label, h.count());
    }
  }
  void Raw(absl::string_view lines) { absl::StrAppend(&out_, lines); }
  std::string Take() { return std::move(out_); }

 private:
  std::string out_;
};

// Help of the engine series the node sets (node/serve/serve_node.cc); others get a generic
// one.
absl::string_view EngineSeriesHelp(absl::string_view name) {
  static const std::map<absl::string_view, absl::string_view> kHelp = {
      {"specnode_kv_bytes", "KV cache bytes held, per precision class (f16, int8, int4)."},
      {"specnode_kv_tokens", "Tokens whose KV is held, per precision class."},
      {"specnode_kv_capacity_bytes", "KV cache capacity in bytes, every target rank summed."},
      {"specnode_kv_used_bytes", "KV cache bytes in use, every target rank summed."},
      {"specnode_kv_host_bytes", "KV bytes parked in the host swap tier."},
      {"specnode_kv_prefix_cache_only_bytes",
       "Of the used KV bytes, the prefix cache's pages no request holds (evicted on demand)."},
      {"specnode_group_active_sequences", "Sequences running, per draft group."},
      {"specnode_group_sequences_started_total", "Sequences started since start, per draft group."},
  };
  auto it = kHelp.find(name);
  return it != kHelp.end() ? it->second : "Engine series (see docs/serving.md, Metrics).";
}

// The inference gateway's model-server protocol (Gateway API Inference Extension, llm-d)
// under vLLM's names, labelled with the served model: the endpoint picker's default flags
// (--total-queued-requests-metric, --total-running-requests-metric,
// --kv-cache-usage-percentage-metric) read these as they read a vLLM server's.
void GatewaySeries(const SchedulerSnapshot& s, absl::string_view model_name, Exposition& e) {
  const std::string label = Label("model_name", model_name);
  e.Family("vllm:num_requests_waiting", "gauge",
           "Requests waiting for admission (specnode_queue_depth, vLLM's name).");
  e.Sample("vllm:num_requests_waiting", label, int64_t{s.queued});
  e.Family("vllm:num_requests_running", "gauge",
           "Sequences running (specnode_active_sequences, vLLM's name).");
  e.Sample("vllm:num_requests_running", label, int64_t{s.active});
  const auto gauge = [&s](const char* name) {
    auto it = s.gauges.find(name);
    return it == s.gauges.end() ? 0.0 : it->second;
  };
  const double capacity = gauge("specnode_kv_capacity_bytes");
  e.Family("vllm:kv_cache_usage_perc", "gauge",
           "KV cache in use as a fraction of its capacity, 0 to 1 (1 = full; vLLM's name).");
  e.Sample("vllm:kv_cache_usage_perc", label,
           capacity > 0 ? gauge("specnode_kv_used_bytes") / capacity : 0.0);
  e.Family("specnode_model_info", "gauge", "The served model's name (always 1).");
  e.Sample("specnode_model_info", label, int64_t{1});
}

}  // namespace

std::string PrometheusText(
    const SchedulerSnapshot& s,
    const std::vector<std::pair<std::string, const SpecController*>>& controllers,
    absl::string_view model_name) {
  Exposition e;
  if (!model_name.empty()) GatewaySeries(s, model_name, e);
  e.Family("specnode_requests_total", "counter", "Requests by outcome.");
  for (const auto& [outcome, n] : {std::pair<const char*, int64_t>{"submitted", s.submitted},
                                   {"completed", s.completed},
                                   {"cancelled", s.cancelled},
                                   {"rejected", s.rejected},
                                   {"failed", s.failed}}) {
    e.Sample("specnode_requests_total", Label("outcome", outcome), n);
  }
  e.Counter("specnode_requests_shed_total",
            "Requests refused because their class sheds load and they would miss its TTFT "
            "target (also counted as rejected).",
            s.shed);
  e.Gauge("specnode_queue_depth", "Requests waiting for admission.", s.queued);
  e.Gauge("specnode_active_sequences", "Sequences running.", s.active);
  e.Gauge("specnode_batch_size", "Sequences in the last step.", s.last_batch);
  e.Gauge("specnode_batch_size_mean", "Mean sequences per step since start.",
          s.steps ? static_cast<double>(s.step_sequences) / s.steps : 0.0);
  e.Counter("specnode_steps_total", "Engine steps.", s.steps);
  e.Gauge("specnode_batching_window_seconds",
          "Current batching window: how long a lone arrival waits for batch mates.",
          s.window_ms / 1e3);
  e.Counter("specnode_preemptions_total",
            "Sequences preempted (for KV memory or for a waiting higher SLA class).",
            s.preemptions);
  e.Counter("specnode_preemptions_swapped_total",
            "Preemptions that parked the KV in the host tier instead of recomputing it.",
            s.swapped);
  e.Counter("specnode_preemptions_for_class_total",
            "Preemptions that made room for a waiting request of a higher SLA class.",
            s.class_preemptions);
  e.Counter("specnode_admission_kv_waits_total",
            "Admission rounds that held requests back because their KV would not fit.", s.kv_waits);
  // Every code of the one table, from the start (0 until it happens).
  std::map<std::string, int64_t> errors;
  for (const RequestErrorInfo& info : RequestErrorTable()) errors[info.wire] = 0;
  for (const auto& [code, n] : s.errors_by_code) errors[code] += n;
  e.LabelledCounter("specnode_errors_total", "Error replies by code.", "code", errors);

  e.Counter("specnode_prompt_tokens_total",
            "Prompt tokens of requests that ended (completed or cancelled).", s.prompt_tokens);
  e.Counter("specnode_prefix_cache_hit_tokens_total",
            "Of the prompt tokens, those taken from the prefix cache instead of prefilled.",
            s.cached_prompt_tokens);
  e.Counter("specnode_generation_tokens_total",
            "Tokens generated for requests that ended (completed or cancelled).",
            s.generation_tokens);
  e.LabelledCounter("specnode_spec_draft_tokens_total",
                    "Draft tokens proposed for requests that ended, per domain.", "domain",
                    s.drafted_by_domain);
  e.LabelledCounter("specnode_spec_accepted_tokens_total",
                    "Draft tokens the target accepted for requests that ended, per domain.",
                    "domain", s.accepted_by_domain);

  using Lat = SchedulerSnapshot::SlaLatency;
  e.Histogram("specnode_time_to_first_token_seconds",
              "Time from arrival to the first token of completed requests, per SLA class.",
              s.latency, [](const Lat& l) -> const LatencyHistogram& { return l.ttft; });
  e.Histogram("specnode_time_per_output_token_seconds",
              "Mean time per output token after the first of completed requests, per SLA "
              "class.",
              s.latency, [](const Lat& l) -> const LatencyHistogram& { return l.tpot; });
  e.Histogram("specnode_request_queue_time_seconds",
              "Time from arrival to first scheduled of completed requests, per SLA class.",
              s.latency, [](const Lat& l) -> const LatencyHistogram& { return l.queue; });
  e.Histogram("specnode_e2e_request_latency_seconds",
              "Time from arrival to the end of completed requests, per SLA class.", s.latency,
              [](const Lat& l) -> const LatencyHistogram& { return l.e2e; });

  std::string acceptance, k, mode;
  for (const auto& [name, c] : controllers) {
    for (const DomainSnapshot& d : c->AllDomains()) {
      const std::string labels =
          absl::StrCat(Label("drafter", name), ",", Label("domain", d.domain));
      absl::StrAppend(&acceptance, "specnode_spec_acceptance{", labels, "} ",
                      FormatSampleValue(d.acceptance), "\n");
      absl::StrAppend(&k, "specnode_spec_k{", labels, "} ", d.k, "\n");
      absl::StrAppend(&mode, "specnode_spec_mode{", labels, ",",
                      Label("mode", std::string(SpecModeName(d.mode))), "} 1\n");
    }
  }
  e.Family("specnode_spec_acceptance", "gauge",
           "Draft acceptance rate over the controller's window, per drafter and domain.");
  e.Raw(acceptance);
  e.Family("specnode_spec_k", "gauge",
           "Speculation length chosen next, per drafter and domain (0 = direct decoding).");
  e.Raw(k);
  e.Family("specnode_spec_mode", "gauge", "Controller mode per drafter and domain (1 = current).");
  e.Raw(mode);

  // Engine series ("name{labels}" -> value), grouped by family name (sorting by series
  // alone could split a family: "a_b{" sorts after "a_bc").
  std::map<std::string, std::vector<std::pair<std::string, double>>> engine;
  for (const auto& [series, v] : s.gauges)
    engine[series.substr(0, series.find('{'))].push_back({series, v});
  for (const auto& [name, series] : engine) {
    const bool counter = name.size() > 6 && name.ends_with("_total");
    e.Family(name, counter ? "counter" : "gauge", EngineSeriesHelp(name));
    for (const auto& [line, v] : series) e.Raw(absl::StrCat(line, " ", FormatSampleValue(v), "\n"));
  }
  return e.Take();
}

}  // namespace specnode
