// specnode serve --check-config: checks a serve config without serving — the config, the
// models' GGUF headers (mapped, metadata parsed, every tensor's name and shape checked; no
// page of weights read), the drafts against the target, and for GPU ranks where each rank
// lands and which GPU it opens (node/serve/gpu_layout.h) — and prints a summary.
#pragma once

#include <optional>

#include "absl/status/statusor.h"
#include "node/cli/cli_args.h"
#include "node/serve/cluster_config.h"
#include "runtime/runner_factory.h"

namespace specnode {

// --check-config's GPU layout flags, parsed.
struct GpuCheckOptions {
  std::optional<int> ranks_per_node;  // --ranks-per-node R: mpirun --map-by ppr:R:node
  std::optional<int> gpus_per_node;   // --gpus-per-node N: nodes of N GPUs, not this host's
};

// --ranks-per-node / --gpus-per-node (only with --check-config: InvalidArgument otherwise).
absl::StatusOr<GpuCheckOptions> GpuCheckOptionsFromArgs(const CliArgs& args);

// What a single-process node asks of its device (CheckRunnerOptions).
RunnerOptions RunnerOptionsFor(const ServeConfig& cfg);

// The check and its summary on stdout; the first failure, naming the file or rank.
absl::Status CheckConfig(const ServeConfig& cfg, const GpuCheckOptions& gpu_options);

}  // namespace specnode
