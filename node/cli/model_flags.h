// The flags every model-running subcommand shares (--kv-*, --activations, --device), parsed
// once into typed options where they are read, and the subcommands' common entry.
#pragma once

#include <optional>
#include <set>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/acceptance.h"
#include "kvstore/kv_options.h"
#include "model/cpu/cpu_matmul.h"
#include "node/cli/cli_args.h"
#include "node/session/model_session.h"

namespace specnode {

// The KV flags every model-running subcommand accepts, and their parsing:
//   --kv-mode dense|full|int8|int4|mixed   --kv-capacity-mb N   --kv-window N
//   --kv-sinks N   --kv-critical-threshold X   --kv-sample-every N   --kv-evict-window N
//   (--kv-evict-window turns on lossy sliding-window eviction)
std::string KvFlagsHelp();  // with KvOptions' defaults
std::set<std::string> KvValueKeys();
// `flags` plus the boolean KV flags (--kv-no-rotate).
std::set<std::string> WithKvFlags(std::set<std::string> flags);
// ApplyKvFlags sets only the fields whose flags are given (over a config's `kv:` section,
// say), each validated where it is read; KvOptionsFromArgs applies them over the defaults.
absl::Status ApplyKvFlags(const CliArgs& args, KvOptions* options);
absl::StatusOr<KvOptions> KvOptionsFromArgs(const CliArgs& args);

// --activations int16|int8 (default: the device's): how CPU matmuls round activations for
// quantised weights (cpu_matmul.h); --device cpu|cuda:N (default cpu): where the target
// computes. Every model-running subcommand takes both.
extern const char kComputeFlagsHelp[];
// Unset when --activations is absent.
absl::StatusOr<std::optional<ActQuant>> ActQuantFromArgs(const CliArgs& args);
// --chat-template NAME -> the built-in template's text ("" without the flag).
absl::StatusOr<std::string> ChatTemplateFromArgs(const CliArgs& args);
absl::StatusOr<ComputeOptions> ComputeOptionsFromArgs(const CliArgs& args);
// What the matmuls round activations to: "int16" / "int8" on the CPU (what its kernels
// run), "int16" on a GPU (its quantised matmuls; float weights multiply f32 there).
std::string ActivationsName(const ComputeOptions& compute);

// --temperature T --top-k K --top-p P --seed S over `defaults` (each validated where read;
// ValidateSamplingParams runs with the request's other checks).
absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args,
                                                const SamplingParams& defaults);

// --acceptance match|ratio (default match): how sampled drafts are accepted
// (coordinator/acceptance.h).
absl::StatusOr<AcceptanceRule> AcceptanceFromArgs(const CliArgs& args);

// The shared entry of the model-running subcommands: parses argv with `value_keys`,
// `flag_keys` and the multi-value `list_keys` plus the KV keys and --help, prints usage
// (`help` + the KV flags) on a usage error (returns 2) or --help (0), otherwise runs `run`,
// printing "specnode <name>: <message>" and returning 1 when it fails (a status with an empty
// message returns 1 silently: it was reported elsewhere, e.g. by MPI rank 0).
int RunModelCommand(const char* name, const std::string& help, int argc, char** argv,
                    std::set<std::string> value_keys, std::set<std::string> flag_keys,
                    absl::Status (*run)(const CliArgs&), std::set<std::string> list_keys = {});

}  // namespace specnode
