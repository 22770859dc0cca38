// libFuzzer target for the serve config (docs/configs.md): arbitrary bytes as a YAML file
// through ParseServeConfig, and as one scalar through each typed field parser it uses
// (device, KV mode, draft spec, acceptance rule, metrics address).
//
// Beyond "no crash, no sanitizer report, no exception" it traps when a promise breaks:
//   - a refused file is InvalidArgument and its message starts with the file's name (the
//     "file:line: key: ..." form operators rely on);
//   - a parsed config is within the documented ranges of the fields checked here, and
//     parsing the same text again gives the same result (no hidden state);
//   - a name a field parser accepts prints back to a name it accepts again.

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/strings/match.h"
#include "coordinator/acceptance.h"
#include "coordinator/draft_spec.h"
#include "kvstore/kv_options.h"
#include "model/llama/device.h"
#include "node/serve/cluster_config.h"
#include "node/serve/metrics_http.h"

namespace {

void Check(bool ok) {
  if (!ok) __builtin_trap();
}

constexpr char kSource[] = "fuzz.yaml";

void CheckConfig(const specnode::ServeConfig& c) {
  Check(c.source == kSource);
  Check(c.max_active >= 1 && c.max_queue >= 0);
  Check(c.k_max >= 1);
  Check(c.drain_timeout_s >= 0);
  Check(c.topology.timeout_s > 0);
  Check(c.topology.world_size >= 1);
  int ranks = c.topology.groups.empty() ? 1 : 0;
  for (const specnode::GroupTopology& g : c.topology.groups) {
    Check(!g.target.empty());
    ranks += static_cast<int>(g.target.size());
  }
  Check(ranks <= c.topology.world_size);
  Check(c.sla.max_active == c.max_active && c.sla.max_queue == c.max_queue);
  if (!c.metrics_bind.empty()) Check(specnode::ValidateMetricsAddress(c.metrics_bind).ok());
}

void FieldParsers(std::string_view text) {
  if (auto m = specnode::ParseKvMode(text); m.ok()) {
    Check(specnode::ParseKvMode(specnode::KvModeName(*m)).ok());
  }
  if (auto r = specnode::ParseAcceptanceRule(text); r.ok()) {
    Check(specnode::ParseAcceptanceRule(specnode::AcceptanceRuleName(*r)).ok());
  }
  (void)specnode::ParseDevice(text);
  (void)specnode::ParseDraftSpec(text);
  (void)specnode::ValidateMetricsAddress(std::string(text));
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  FieldParsers(text);
  const absl::StatusOr<specnode::ServeConfig> c = specnode::ParseServeConfig(text, kSource);
  if (!c.ok()) {
    Check(c.status().code() == absl::StatusCode::kInvalidArgument);
    Check(absl::StartsWith(c.status().message(), kSource));
    return 0;
  }
  CheckConfig(*c);
  const absl::StatusOr<specnode::ServeConfig> again = specnode::ParseServeConfig(text, kSource);
  Check(again.ok() && again->max_active == c->max_active && again->kv.mode == c->kv.mode &&
        again->topology.world_size == c->topology.world_size && again->bind == c->bind &&
        again->model == c->model);
  return 0;
}
