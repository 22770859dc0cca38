// Prometheus text exposition (format 0.0.4) of the node's state, following Prometheus'
// naming conventions (base units in names: seconds, bytes; counters end in _total; every
// family once, with # HELP and # TYPE; label values escaped). Families (docs/serving.md,
// "Metrics", has the table):
//   counters   requests by outcome, shed requests, steps, preemptions (all / swapped / for a
//              class), admission KV waits, errors by code, prompt and generation tokens,
//              draft tokens proposed and accepted per domain;
//   histograms per SLA class, seconds, cumulative since start (coordinator/latency_histogram.h
//              has the buckets): time to first token, time per output token, queue time,
//              end-to-end latency;
//   gauges     queue depth, active sequences, batch size (last, mean), batching window
//              (seconds), acceptance / K / mode per drafter and domain, and the engine's
//              series (SchedulerSnapshot::gauges: KV bytes per precision class, ...; a name
//              ending in _total there is typed counter).
// Pure functions of their arguments; thread-safe.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "absl/strings/string_view.h"
#include "coordinator/scheduler.h"
#include "coordinator/spec_controller.h"

namespace specnode {

// controllers: (drafter name, its controller), may be empty. model_name (the first served
// name) non-empty adds the gateway series under vLLM's names, labelled model_name:
// vllm:num_requests_waiting, vllm:num_requests_running, vllm:kv_cache_usage_perc (a 0..1
// ratio of the engine's specnode_kv_used_bytes to specnode_kv_capacity_bytes), and
// specnode_model_info.
std::string PrometheusText(
    const SchedulerSnapshot& s,
    const std::vector<std::pair<std::string, const SpecController*>>& controllers,
    absl::string_view model_name = "");

// A label value as the text format wants it between its quotes: backslash, double quote
// and newline escaped (\\, \", \n). For code that formats series names itself
// (SchedulerSnapshot::gauges keys).
std::string EscapeLabelValue(absl::string_view value);

// A sample value: whole numbers exactly (201326592, not 2.01327e+08), others in the
// shortest form that reads back to the same double, +Inf / -Inf / NaN as Prometheus spells
// them.
std::string FormatSampleValue(double v);

}  // namespace specnode
