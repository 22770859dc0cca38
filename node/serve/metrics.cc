#include "node/serve/metrics.h"

#include <algorithm>
#include <cmath>
#include <map>

#include "absl/strings/str_format.h"
#include "coordinator/request_error.h"

namespace specnode {

double Quantile(std::vector<double> samples, double p) {
  if (samples.empty()) return 0.0;
  std::sort(samples.begin(), samples.end());
  const size_t rank = static_cast<size_t>(std::ceil(p * samples.size()));
  return samples[std::clamp<size_t>(rank, 1, samples.size()) - 1];
}

std::string PrometheusText(
    const SchedulerSnapshot& s,
    const std::vector<std::pair<std::string, const SpecController*>>& controllers) {
  std::string out;
  auto family = [&](const char* name, const char* type, const char* help) {
    absl::StrAppendFormat(&out, "# HELP %s %s\n# TYPE %s %s\n", name, help, name, type);
  };
  family("specnode_requests_total", "counter", "Requests by outcome.");
  absl::StrAppendFormat(&out, "specnode_requests_total{outcome=\"submitted\"} %d\n", s.submitted);
  absl::StrAppendFormat(&out, "specnode_requests_total{outcome=\"completed\"} %d\n", s.completed);
  absl::StrAppendFormat(&out, "specnode_requests_total{outcome=\"cancelled\"} %d\n", s.cancelled);
  absl::StrAppendFormat(&out, "specnode_requests_total{outcome=\"rejected\"} %d\n", s.rejected);
  absl::StrAppendFormat(&out, "specnode_requests_total{outcome=\"failed\"} %d\n", s.failed);
  family("specnode_requests_shed_total", "counter",
         "Requests refused because their class sheds load and they would miss its TTFT target "
         "(also counted as rejected).");
  absl::StrAppendFormat(&out, "specnode_requests_shed_total %d\n", s.shed);
  family("specnode_queue_depth", "gauge", "Requests waiting for admission.");
  absl::StrAppendFormat(&out, "specnode_queue_depth %d\n", s.queued);
  family("specnode_active_sequences", "gauge", "Sequences running.");
  absl::StrAppendFormat(&out, "specnode_active_sequences %d\n", s.active);
  family("specnode_batch_size", "gauge", "Sequences in the last step.");
  absl::StrAppendFormat(&out, "specnode_batch_size %d\n", s.last_batch);
  family("specnode_batch_size_mean", "gauge", "Mean sequences per step.");
  absl::StrAppendFormat(&out, "specnode_batch_size_mean %g\n",
                        s.steps ? static_cast<double>(s.step_sequences) / s.steps : 0.0);
  // Unlabelled counters: one family and one sample each.
  auto counter = [&](const char* name, const char* help, int64_t value) {
    family(name, "counter", help);
    absl::StrAppendFormat(&out, "%s %d\n", name, value);
  };
  counter("specnode_steps_total", "Engine steps.", s.steps);
  family("specnode_batching_window_ms", "gauge", "Current batching window.");
  absl::StrAppendFormat(&out, "specnode_batching_window_ms %g\n", s.window_ms);
  counter("specnode_preemptions_total",
          "Sequences preempted (for KV memory or for a waiting higher SLA class).", s.preemptions);
  counter("specnode_preemptions_swapped_total",
          "Preemptions that parked the KV in the host tier instead of recomputing it.", s.swapped);
  counter("specnode_preemptions_for_class_total",
          "Preemptions that made room for a waiting request of a higher SLA class.",
          s.class_preemptions);
  counter("specnode_admission_kv_waits_total",
          "Admission rounds that held requests back because their KV would not fit.", s.kv_waits);
  family("specnode_errors_total", "counter", "Error replies by code.");
  // Every code of the one table, from the start (0 until it happens).
  std::map<std::string, int64_t> errors;
  for (const RequestErrorInfo& e : RequestErrorTable()) errors[e.wire] = 0;
  for (const auto& [code, n] : s.errors_by_code) errors[code] += n;
  for (const auto& [code, n] : errors) {
    absl::StrAppendFormat(&out, "specnode_errors_total{code=\"%s\"} %d\n", code, n);
  }
  family("specnode_ttft_ms", "gauge", "Time to first token of recent requests, per SLA class.");
  for (const auto& [sla, v] : s.ttft_ms) {
    for (double q : {0.5, 0.99}) {
      absl::StrAppendFormat(&out, "specnode_ttft_ms{sla=\"%s\",quantile=\"%g\"} %g\n", sla, q,
                            Quantile(v, q));
    }
  }
  family("specnode_tpot_ms", "gauge", "Time per output token of recent requests, per SLA class.");
  for (const auto& [sla, v] : s.tpot_ms) {
    for (double q : {0.5, 0.99}) {
      absl::StrAppendFormat(&out, "specnode_tpot_ms{sla=\"%s\",quantile=\"%g\"} %g\n", sla, q,
                            Quantile(v, q));
    }
  }
  family("specnode_spec_acceptance", "gauge", "Draft acceptance over the window, per domain.");
  std::string k_lines, mode_lines;
  for (const auto& [name, c] : controllers) {
    for (const DomainSnapshot& d : c->AllDomains()) {
      absl::StrAppendFormat(&out, "specnode_spec_acceptance{drafter=\"%s\",domain=\"%s\"} %g\n",
                            name, d.domain, d.acceptance);
      absl::StrAppendFormat(&k_lines, "specnode_spec_k{drafter=\"%s\",domain=\"%s\"} %d\n", name,
                            d.domain, d.k);
      absl::StrAppendFormat(&mode_lines,
                            "specnode_spec_mode{drafter=\"%s\",domain=\"%s\",mode=\"%s\"} 1\n",
                            name, d.domain, std::string(SpecModeName(d.mode)));
    }
  }
  family("specnode_spec_k", "gauge", "Speculation length chosen next, per domain (0 = direct).");
  out += k_lines;
  family("specnode_spec_mode", "gauge", "Controller mode per domain.");
  out += mode_lines;
  // Engine gauges ("name{labels}" -> value), one family per name.
  std::string last_family;
  for (const auto& [series, v] : s.gauges) {
    const std::string name = series.substr(0, series.find('{'));
    if (name != last_family) {
      family(name.c_str(), "gauge", "Engine gauge (see docs/protocol.md, Metrics).");
      last_family = name;
    }
    // Whole numbers (bytes, counts) exactly; %g alone would round 201326592 to 2.01327e+08.
    if (v == std::floor(v) && std::fabs(v) < 1e15) {
      absl::StrAppendFormat(&out, "%s %.0f\n", series, v);
    } else {
      absl::StrAppendFormat(&out, "%s %g\n", series, v);
    }
  }
  return out;
}

}  // namespace specnode
