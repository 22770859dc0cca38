// The Prometheus exposition (node/serve/metrics.h) of snapshots with known contents: the
// histogram lines (cumulative buckets, +Inf == _count, _sum), the counters and gauges,
// label escaping, the format's structure (every family once, with HELP and TYPE, its
// samples together), and `promtool check metrics` on a populated snapshot (skipped, saying
// why, without promtool: Debian's `prometheus` package, scripts/setup).
#include "node/serve/metrics.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "coordinator/latency_histogram.h"
#include "coordinator/spec_controller.h"
#include "tests/support/temp_file.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

TEST(LatencyHistogramTest, BucketsAreUpperBoundInclusiveAndCumulative) {
  static constexpr double kBounds[] = {0.1, 1, 10};
  LatencyHistogram h(kBounds);
  for (double s : {0.05, 0.1, 0.5, 1.0, 20.0, -3.0}) h.Observe(s);
  EXPECT_EQ(h.CumulativeCounts(), (std::vector<int64_t>{3, 5, 5}));  // -3 counts as 0
  EXPECT_EQ(h.count(), 6);
  EXPECT_DOUBLE_EQ(h.sum(), 0.05 + 0.1 + 0.5 + 1.0 + 20.0);
  EXPECT_EQ(h.bounds().size(), 3u);
}

TEST(LatencyHistogramTest, NodeBucketSetsIncrease) {
  for (std::span<const double> b :
       {std::span<const double>(kTtftBucketsS), std::span<const double>(kTpotBucketsS),
        std::span<const double>(kRequestBucketsS)}) {
    for (size_t i = 1; i < b.size(); ++i) EXPECT_LT(b[i - 1], b[i]);
  }
  EXPECT_EQ(kTtftBucketsS[0], 0.001);
  EXPECT_EQ(std::size(kTtftBucketsS), 22u);
}

TEST(MetricsTest, EscapesLabelValuesAndFormatsValues) {
  EXPECT_EQ(EscapeLabelValue("a\"b\\c\nd"), "a\\\"b\\\\c\\nd");
  EXPECT_EQ(EscapeLabelValue("plain"), "plain");
  EXPECT_EQ(FormatSampleValue(201326592), "201326592");
  EXPECT_EQ(FormatSampleValue(0.0125), "0.0125");
  EXPECT_EQ(FormatSampleValue(0.1 + 0.2), "0.30000000000000004");  // round-trips
  EXPECT_EQ(FormatSampleValue(1.0 / 0.0), "+Inf");
  EXPECT_EQ(FormatSampleValue(-1.0 / 0.0), "-Inf");
  EXPECT_EQ(FormatSampleValue(std::nan("")), "NaN");
}

// A snapshot as a busy node's: two classes with latencies, tokens, errors, engine gauges.
SchedulerSnapshot Populated() {
  SchedulerSnapshot s;
  s.queued = 2;
  s.active = 3;
  s.submitted = 9;
  s.completed = 5;
  s.cancelled = 1;
  s.rejected = 1;
  s.failed = 1;
  s.preemptions = 4;
  s.swapped = 1;
  s.class_preemptions = 2;
  s.kv_waits = 3;
  s.shed = 1;
  s.steps = 40;
  s.step_sequences = 100;
  s.last_batch = 3;
  s.window_ms = 12.5;
  // Binary-exact values, so the sums print exactly.
  SchedulerSnapshot::SlaLatency& in = s.latency["interactive"];
  for (double t : {0.0078125, 0.5, 0.5, 4096.0}) in.ttft.Observe(t);  // 4096 s: above 2560
  for (double t : {0.00390625, 0.125}) in.tpot.Observe(t);
  in.queue.Observe(0.0);
  in.e2e.Observe(1.5);
  s.latency["batch"];  // a class without requests yet: every bucket 0
  s.prompt_tokens = 120;
  s.generation_tokens = 64;
  s.drafted_by_domain = {{"code", 40}, {"default", 8}};
  s.accepted_by_domain = {{"code", 30}, {"default", 2}};
  s.errors_by_code = {{"overloaded", 1}, {"bad_request", 2}};
  s.gauges = {{"specnode_kv_bytes{class=\"f16\"}", 201326592},
              {"specnode_kv_bytes{class=\"int8\"}", 1024},
              {"specnode_kv_bytes{class=\"int4\"}", 0},
              // Sorted as strings, specnode_example_other lies between the two
              // specnode_example series: the family must still be written once.
              {"specnode_example", 1},
              {"specnode_example_other", 2},
              {"specnode_example{k=\"v\"}", 3},
              {"specnode_kv_used_bytes", 201327616},
              {"specnode_kv_capacity_bytes", 805310464},
              {"specnode_group_active_sequences{group=\"a\"}", 2},
              {"specnode_example_events_total", 5}};
  return s;
}

std::unique_ptr<SpecController> ControllerWithDomains() {
  auto c = SpecController::Create(SpecControllerConfig{});
  EXPECT_TRUE(c.ok()) << c.status();
  for (const char* domain : {"code", "default"}) {
    for (int i = 0; i < 4; ++i) EXPECT_TRUE((*c)->RecordStep(domain, 4, 3).ok());
  }
  return std::move(*c);
}

std::vector<std::string> Split(const std::string& text) {
  return absl::StrSplit(text, '\n', absl::SkipEmpty());
}

std::set<std::string> Lines(const std::string& text) {
  std::set<std::string> out;
  for (const std::string& l : Split(text)) out.insert(l);
  return out;
}

TEST(MetricsTest, HistogramLinesAreCumulativeWithInfEqualToCount) {
  const std::string text = PrometheusText(Populated(), {});
  const std::set<std::string> lines = Lines(text);
  const std::string ttft = "specnode_time_to_first_token_seconds";
  EXPECT_TRUE(lines.count("# TYPE " + ttft + " histogram")) << text;
  const std::string in = "{sla=\"interactive\",le=";
  for (const auto& [le, n] : std::vector<std::pair<std::string, int>>{{"0.001", 0},
                                                                      {"0.005", 0},
                                                                      {"0.01", 1},
                                                                      {"0.25", 1},
                                                                      {"0.5", 3},  // le inclusive
                                                                      {"0.75", 3},
                                                                      {"2560", 3},
                                                                      {"+Inf", 4}}) {
    const std::string line = absl::StrCat(ttft, "_bucket", in, "\"", le, "\"} ", n);
    EXPECT_TRUE(lines.count(line)) << line << "\n" << text;
  }
  EXPECT_TRUE(lines.count(ttft + "_sum{sla=\"interactive\"} 4097.0078125")) << text;
  EXPECT_TRUE(lines.count(ttft + "_count{sla=\"interactive\"} 4")) << text;
  // Every bucket of every class's TTFT: one line per bound and +Inf.
  int buckets = 0;
  for (const std::string& l : lines) buckets += l.starts_with(ttft + "_bucket{sla=\"batch\"");
  EXPECT_EQ(buckets, static_cast<int>(std::size(kTtftBucketsS)) + 1);
  EXPECT_TRUE(lines.count(ttft + "_bucket{sla=\"batch\",le=\"+Inf\"} 0"));
  EXPECT_TRUE(lines.count(ttft + "_count{sla=\"batch\"} 0"));
  EXPECT_TRUE(lines.count(ttft + "_sum{sla=\"batch\"} 0"));

  const std::string tpot = "specnode_time_per_output_token_seconds";
  EXPECT_TRUE(lines.count(tpot + "_bucket{sla=\"interactive\",le=\"0.001\"} 0"));
  EXPECT_TRUE(lines.count(tpot + "_bucket{sla=\"interactive\",le=\"0.005\"} 1"));
  EXPECT_TRUE(lines.count(tpot + "_bucket{sla=\"interactive\",le=\"0.15\"} 2"));
  EXPECT_TRUE(lines.count(tpot + "_sum{sla=\"interactive\"} 0.12890625")) << text;
  const std::string queue = "specnode_request_queue_time_seconds";
  EXPECT_TRUE(lines.count(queue + "_bucket{sla=\"interactive\",le=\"0.001\"} 1")) << text;
  const std::string e2e = "specnode_e2e_request_latency_seconds";
  EXPECT_TRUE(lines.count(e2e + "_bucket{sla=\"interactive\",le=\"1\"} 0")) << text;
  EXPECT_TRUE(lines.count(e2e + "_bucket{sla=\"interactive\",le=\"1.5\"} 1")) << text;
  EXPECT_TRUE(lines.count(e2e + "_bucket{sla=\"interactive\",le=\"7680\"} 1")) << text;
}

// The inference gateway reads vLLM's names (Gateway API Inference Extension's model-server
// protocol): queue, running and the KV usage ratio, labelled with the served model.
TEST(MetricsTest, GatewaySeriesUnderVllmNamesWithTheModelLabel) {
  const std::string text = PrometheusText(Populated(), {}, "smol");
  const std::set<std::string> lines = Lines(text);
  for (const char* line :
       {"vllm:num_requests_waiting{model_name=\"smol\"} 2",
        "vllm:num_requests_running{model_name=\"smol\"} 3",
        "vllm:kv_cache_usage_perc{model_name=\"smol\"} 0.25",
        "specnode_model_info{model_name=\"smol\"} 1", "# TYPE vllm:kv_cache_usage_perc gauge"}) {
    EXPECT_TRUE(lines.count(line)) << line << "\n" << text;
  }
  // Without a name (a caller that serves none) the series are left out.
  EXPECT_EQ(PrometheusText(Populated(), {}).find("vllm:"), std::string::npos);
  SchedulerSnapshot empty;  // no KV gauges yet: the ratio is 0, not NaN
  EXPECT_TRUE(
      Lines(PrometheusText(empty, {}, "m")).count("vllm:kv_cache_usage_perc{model_name=\"m\"} 0"));
}

TEST(MetricsTest, CountersGaugesAndUnits) {
  auto controller = ControllerWithDomains();
  const std::string text = PrometheusText(Populated(), {{"ngram", controller.get()}});
  const std::set<std::string> lines = Lines(text);
  for (const char* line : {
           "specnode_requests_total{outcome=\"submitted\"} 9",
           "specnode_requests_total{outcome=\"failed\"} 1",
           "specnode_prompt_tokens_total 120",
           "specnode_generation_tokens_total 64",
           "specnode_spec_draft_tokens_total{domain=\"code\"} 40",
           "specnode_spec_accepted_tokens_total{domain=\"code\"} 30",
           "specnode_spec_accepted_tokens_total{domain=\"default\"} 2",
           "# TYPE specnode_spec_draft_tokens_total counter",
           "specnode_batching_window_seconds 0.0125",
           "specnode_batch_size_mean 2.5",
           "specnode_errors_total{code=\"overloaded\"} 1",
           "specnode_errors_total{code=\"unknown_sla\"} 0",  // every code from the start
           "specnode_kv_bytes{class=\"f16\"} 201326592",
           "# TYPE specnode_kv_bytes gauge",
           "# TYPE specnode_example_events_total counter",  // an engine *_total series
           "specnode_spec_k{drafter=\"ngram\",domain=\"code\"} 4",
       }) {
    EXPECT_TRUE(lines.count(line)) << line << "\n" << text;
  }
  EXPECT_THAT(text, HasSubstr("specnode_spec_acceptance{drafter=\"ngram\",domain=\"code\"} "));
  EXPECT_THAT(text, HasSubstr("specnode_spec_mode{drafter=\"ngram\",domain=\"default\",mode=\""));
  // Base units only: no millisecond families left, no quantile gauges.
  EXPECT_THAT(text, Not(HasSubstr("_ms")));
  EXPECT_THAT(text, Not(HasSubstr("quantile=")));
}

TEST(MetricsTest, LabelValuesAreEscaped) {
  SchedulerSnapshot s;
  s.latency["we\"ird\\sla\n"];
  s.drafted_by_domain["d\"q"] = 1;
  const std::string text = PrometheusText(s, {});
  EXPECT_THAT(text, HasSubstr("specnode_time_to_first_token_seconds_count{sla=\"we\\\"ird\\\\sla"
                              "\\n\"} 0\n"));
  EXPECT_THAT(text, HasSubstr("specnode_spec_draft_tokens_total{domain=\"d\\\"q\"} 1\n"));
}

// The text's structure, as a scraper parses it: every family's # HELP and # TYPE exactly
// once and before its samples, each sample belonging to the family declared last (families
// are not interleaved), histogram samples only as _bucket / _sum / _count.
TEST(MetricsTest, EveryFamilyOnceWithHelpAndType) {
  auto controller = ControllerWithDomains();
  const std::string text = PrometheusText(Populated(), {{"ngram", controller.get()}});
  std::map<std::string, std::string> types;
  std::set<std::string> helped;
  std::string current, current_type;
  for (const std::string& l : Split(text)) {
    const std::vector<std::string> words = absl::StrSplit(l, ' ');
    if (l.starts_with("# HELP ")) {
      ASSERT_GE(words.size(), 4u) << l << ": a HELP text";
      EXPECT_TRUE(helped.insert(words[2]).second) << "second HELP: " << l;
      continue;
    }
    if (l.starts_with("# TYPE ")) {
      ASSERT_EQ(words.size(), 4u) << l;
      EXPECT_TRUE(helped.count(words[2])) << "TYPE before HELP: " << l;
      EXPECT_TRUE(types.emplace(words[2], words[3]).second) << "second TYPE: " << l;
      current = words[2];
      current_type = words[3];
      continue;
    }
    ASSERT_FALSE(l.starts_with("#")) << l;
    const std::string name(l.substr(0, l.find_first_of("{ ")));
    if (current_type == "histogram") {
      EXPECT_TRUE(name == current + "_bucket" || name == current + "_sum" ||
                  name == current + "_count")
          << l << " under " << current;
    } else {
      EXPECT_EQ(name, current) << l;
    }
    if (current_type == "counter") {
      EXPECT_TRUE(name.ends_with("_total")) << l;
    }
  }
  EXPECT_EQ(helped.size(), types.size());
  EXPECT_EQ(types.at("specnode_e2e_request_latency_seconds"), "histogram");
  EXPECT_EQ(types.count("specnode_example_other"), 1u);
}

// promtool's own parser and linter (what Prometheus will accept, and its naming rules):
// any output is a complaint.
TEST(MetricsPromtoolTest, CheckMetricsFindsNoProblem) {
  std::string promtool;
  if (const char* env = std::getenv("PROMTOOL"); env != nullptr && *env != '\0') {
    promtool = env;
  } else {
    for (const char* dir : {"/usr/bin", "/usr/local/bin", "/bin"}) {
      if (std::filesystem::exists(std::string(dir) + "/promtool")) {
        promtool = std::string(dir) + "/promtool";
        break;
      }
    }
  }
  if (promtool.empty()) {
    GTEST_SKIP() << "promtool not found (Debian: apt-get install --no-install-recommends "
                    "prometheus, as scripts/setup does; or set PROMTOOL)";
  }
  auto controller = ControllerWithDomains();
  const std::string text = PrometheusText(Populated(), {{"ngram", controller.get()}}, "smol \"x\"");
  const std::string path = testing_support::TempFilePath("metrics", ".prom");
  std::ofstream(path) << text;
  const std::string cmd = absl::StrCat("'", promtool, "' check metrics < '", path, "' 2>&1");
  FILE* p = popen(cmd.c_str(), "r");
  ASSERT_NE(p, nullptr) << cmd;
  std::string output;
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof(buf), p)) > 0;) output.append(buf, n);
  const int status = pclose(p);
  // The one lint allowed: the colon of the gateway series' vLLM names (metrics.h), which
  // promtool reports (exit 3, lint findings only; a parse error exits 1).
  std::string rest;
  for (const std::string& l : Split(output)) {
    if (!(l.starts_with("vllm:") && l.ends_with(" metric names should not contain ':'"))) {
      absl::StrAppend(&rest, l, "\n");
    }
  }
  EXPECT_TRUE(WIFEXITED(status) && (WEXITSTATUS(status) == 0 || WEXITSTATUS(status) == 3))
      << cmd << "\n"
      << output;
  EXPECT_EQ(rest, "") << "promtool check metrics complains:\n" << output << "\n" << text;
}

}  // namespace
}  // namespace specnode
