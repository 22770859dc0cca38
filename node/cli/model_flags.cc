#include "node/cli/model_flags.h"

#include <cstdio>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/status_macros.h"
#include "model/tokenizer/chat_template.h"

namespace specnode {

std::string KvFlagsHelp() {
  // The defaults printed are KvOptions' own: one source (kvstore/kv_options.h).
  const KvOptions d;
  return absl::StrFormat(
      "  --kv-mode MODE      KV cache: auto (default: mixed, on the CPU and a GPU), mixed\n"
      "                      (f16 sinks + recent window, older tokens INT8 if critical else\n"
      "                      INT4), full (f16), int8, int4, dense (f32 reference, CPU only)\n"
      "  --kv-capacity-mb N  KV memory budget in MiB per target rank (default %d)\n"
      "  --gpu-memory-utilization F\n"
      "                      instead: the KV cache takes what is left of F (0..1] of the\n"
      "                      device's memory once the model is loaded (a GPU's, or the\n"
      "                      host's on the CPU; memory other processes use counts)\n"
      "  --kv-window N       recent tokens kept full precision in mixed mode (default %d)\n"
      "  --kv-sinks N        leading tokens kept full precision (default %d)\n"
      "  --kv-page-tokens N  token slots per KV page (default %d)\n"
      "  --kv-critical-threshold X  relative attention mass that keeps a token INT8 (default %g)\n"
      "  --kv-cold-threshold X  mixed mode: relative attention mass below which a token goes\n"
      "                      to the INT2 cold tier (default 0: no cold tier)\n"
      "  --kv-bytes-per-token N  mixed mode: a KV byte budget per token (every layer's K and\n"
      "                      V rows); the store picks each token's class by its attention\n"
      "                      mass to stay within it (default 0: the thresholds decide)\n"
      "  --kv-budget-rank R  mass (default) or recency: what ranks tokens under the budget\n"
      "                      (recency: newer tokens more precise, for comparison)\n"
      "  --kv-sample-every N observe attention mass at 1 query position in N (default %d)\n"
      "  --kv-demote-every N mixed mode demotes when a length reaches a multiple of N\n"
      "                      (default %d)\n"
      "  --kv-evict-window N drop tokens older than N except the sinks (lossy; off by default)\n"
      "  --kv-no-rotate      store K/V unrotated (default: Hadamard-rotated before quantising)\n"
      "  --kv-host-capacity-mb N  host (swap) tier for preempted sequences' KV in MiB\n"
      "                      (default %d; 0: preempted sequences recompute)\n"
      "  --kv-no-prefix-cache  no sharing of equal prompt prefixes' pages (default: shared)\n",
      d.capacity_bytes >> 20, d.window_tokens, d.sink_tokens, d.page_tokens, d.critical_threshold,
      d.mass_sample_every, d.demote_every, static_cast<int>(d.host_capacity_bytes >> 20));
}

const char kComputeFlagsHelp[] =
    "  --activations MODE  CPU matmuls: int16 (default: follows a float reference's greedy\n"
    "                      path) or int8 (llama.cpp's rounding; faster batched matmuls on\n"
    "                      AVX-512 VNNI, a little on AVX2); a GPU runs int16, refuses int8\n"
    "  --device DEV        cpu (default) or cuda:N: the target's forward pass and KV store on\n"
    "                      that GPU (every kv mode but dense; builds with CUDA)\n"
    "  --chat-template NAME  format chat prompts as chatml, llama3, zephyr, gemma, mistral\n"
    "                      or llama2 instead of the model file's template (a file without\n"
    "                      one needs this)\n";

absl::StatusOr<std::optional<ActQuant>> ActQuantFromArgs(const CliArgs& args) {
  if (!args.Has("activations")) return std::optional<ActQuant>();
  ActQuant act = ActQuant::kInt16;
  const std::string name = args.Get("activations");
  if (!ParseActQuant(name, &act)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--activations: expected int16 or int8, got \"", name, "\""));
  }
  return std::optional<ActQuant>(act);
}

absl::StatusOr<std::string> ChatTemplateFromArgs(const CliArgs& args) {
  if (!args.Has("chat-template")) return std::string();
  absl::StatusOr<std::string> t = BuiltinChatTemplate(args.Get("chat-template"));
  if (!t.ok())
    return absl::InvalidArgumentError(absl::StrCat("--chat-template: ", t.status().message()));
  return t;
}

absl::StatusOr<ComputeOptions> ComputeOptionsFromArgs(const CliArgs& args) {
  ComputeOptions c;
  SPECNODE_ASSIGN_OR_RETURN(c.activations, ActQuantFromArgs(args));
  if (args.Has("device")) {
    absl::StatusOr<Device> d = ParseDevice(args.Get("device"));
    if (!d.ok())
      return absl::InvalidArgumentError(absl::StrCat("--device: ", d.status().message()));
    c.device = *d;
  }
  SPECNODE_ASSIGN_OR_RETURN(c.chat_template, ChatTemplateFromArgs(args));
  return c;
}

std::string ActivationsName(const ComputeOptions& compute) {
  // Quantised matmuls on a GPU round to int16 blocks (cuda/cuda_matmul.h, kQuantAct).
  if (!compute.device.is_cpu()) return "int16";
  return ActQuantName(compute.activations.value_or(ActQuant::kInt16));
}

std::set<std::string> KvValueKeys() {
  return {"kv-mode",
          "kv-capacity-mb",
          "kv-window",
          "gpu-memory-utilization",
          "kv-sinks",
          "kv-critical-threshold",
          "kv-sample-every",
          "kv-demote-every",
          "kv-evict-window",
          "kv-page-tokens",
          "kv-host-capacity-mb",
          "kv-cold-threshold",
          "kv-bytes-per-token",
          "kv-budget-rank"};
}

std::set<std::string> WithKvFlags(std::set<std::string> flags) {
  flags.insert("kv-no-rotate");
  flags.insert("kv-no-prefix-cache");
  return flags;
}

absl::Status ApplyKvFlags(const CliArgs& args, KvOptions* o) {
  if (args.Has("kv-mode")) {
    absl::StatusOr<KvMode> mode = ParseKvMode(args.Get("kv-mode"));
    if (!mode.ok())
      return absl::InvalidArgumentError(absl::StrCat("--kv-mode: ", mode.status().message()));
    o->mode = *mode;
  }
  auto set_int = [&args](const char* flag, int64_t lo, int64_t hi, auto* out) -> absl::Status {
    if (!args.Has(flag)) return absl::OkStatus();
    SPECNODE_ASSIGN_OR_RETURN(int64_t v, args.GetInt(flag, 0, lo, hi));
    *out = static_cast<std::remove_pointer_t<decltype(out)>>(v);
    return absl::OkStatus();
  };
  if (args.Has("kv-capacity-mb")) {
    SPECNODE_ASSIGN_OR_RETURN(int64_t mb, args.GetInt("kv-capacity-mb", 0, 1, 1 << 24));
    o->capacity_bytes = mb << 20;
  }
  if (args.Has("kv-host-capacity-mb")) {
    SPECNODE_ASSIGN_OR_RETURN(int64_t mb, args.GetInt("kv-host-capacity-mb", 0, 0, 1 << 24));
    o->host_capacity_bytes = mb << 20;
  }
  if (args.Has("kv-no-prefix-cache")) o->prefix_cache = false;
  if (args.Has("gpu-memory-utilization")) {
    SPECNODE_ASSIGN_OR_RETURN(o->memory_utilization,
                              args.GetDouble("gpu-memory-utilization", 0, 0.0, 1.0));
    if (o->memory_utilization <= 0) {
      return absl::InvalidArgumentError("--gpu-memory-utilization must be in (0, 1]");
    }
  }
  SPECNODE_RETURN_IF_ERROR(set_int("kv-window", 1, 1 << 20, &o->window_tokens));
  SPECNODE_RETURN_IF_ERROR(set_int("kv-sinks", 0, 1 << 20, &o->sink_tokens));
  SPECNODE_RETURN_IF_ERROR(set_int("kv-sample-every", 1, 1 << 20, &o->mass_sample_every));
  SPECNODE_RETURN_IF_ERROR(set_int("kv-demote-every", 1, 1 << 20, &o->demote_every));
  SPECNODE_RETURN_IF_ERROR(set_int("kv-page-tokens", 1, 4096, &o->page_tokens));
  if (args.Has("kv-critical-threshold")) {
    SPECNODE_ASSIGN_OR_RETURN(double thr, args.GetDouble("kv-critical-threshold", 0, 0.0, 1e6));
    o->critical_threshold = static_cast<float>(thr);
  }
  if (args.Has("kv-bytes-per-token")) {
    SPECNODE_ASSIGN_OR_RETURN(o->bytes_per_token,
                              args.GetInt("kv-bytes-per-token", 0, 0, int64_t{1} << 40));
  }
  if (args.Has("kv-budget-rank")) {
    SPECNODE_ASSIGN_OR_RETURN(o->budget_rank, ParseKvBudgetRank(args.Get("kv-budget-rank")));
  }
  if (args.Has("kv-cold-threshold")) {
    SPECNODE_ASSIGN_OR_RETURN(double cold, args.GetDouble("kv-cold-threshold", 0, 0.0, 1e6));
    o->cold_threshold = static_cast<float>(cold);
  }
  if (args.Has("kv-no-rotate")) o->rotate = false;
  if (args.Has("kv-evict-window")) {
    SPECNODE_RETURN_IF_ERROR(set_int("kv-evict-window", 1, 1 << 24, &o->evict_window));
    o->evict = true;
  }
  return o->Validate("KV flags: ");
}

absl::StatusOr<KvOptions> KvOptionsFromArgs(const CliArgs& args) {
  KvOptions o;
  SPECNODE_RETURN_IF_ERROR(ApplyKvFlags(args, &o));
  return o;
}

absl::StatusOr<SamplingParams> SamplingFromArgs(const CliArgs& args,
                                                const SamplingParams& defaults) {
  SamplingParams sp;
  SPECNODE_ASSIGN_OR_RETURN(double temperature,
                            args.GetDouble("temperature", defaults.temperature, 0.0, 100.0));
  SPECNODE_ASSIGN_OR_RETURN(int64_t top_k, args.GetInt("top-k", defaults.top_k, 0, 1 << 30));
  SPECNODE_ASSIGN_OR_RETURN(double top_p, args.GetDouble("top-p", defaults.top_p, 0.0, 1.0));
  SPECNODE_ASSIGN_OR_RETURN(int64_t seed,
                            args.GetInt("seed", static_cast<int64_t>(defaults.seed), 0, INT64_MAX));
  sp.temperature = static_cast<float>(temperature);
  sp.top_k = static_cast<int>(top_k);
  sp.top_p = static_cast<float>(top_p);
  sp.seed = static_cast<uint64_t>(seed);
  return sp;
}

absl::StatusOr<AcceptanceRule> AcceptanceFromArgs(const CliArgs& args) {
  if (!args.Has("acceptance")) return AcceptanceRule::kMatch;
  absl::StatusOr<AcceptanceRule> rule = ParseAcceptanceRule(args.Get("acceptance"));
  if (!rule.ok())
    return absl::InvalidArgumentError(absl::StrCat("--acceptance: ", rule.status().message()));
  return rule;
}

int RunModelCommand(const char* name, const std::string& help, int argc, char** argv,
                    std::set<std::string> value_keys, std::set<std::string> flag_keys,
                    absl::Status (*run)(const CliArgs&), std::set<std::string> list_keys) {
  value_keys.merge(KvValueKeys());
  value_keys.insert("activations");
  value_keys.insert("device");
  value_keys.insert("chat-template");
  flag_keys.insert("help");
  auto args = CliArgs::Parse(argc, argv, value_keys, WithKvFlags(std::move(flag_keys)), list_keys);
  if (!args.ok()) {
    std::fprintf(stderr, "specnode %s: %s\n%s%s%s", name,
                 std::string(args.status().message()).c_str(), help.c_str(),
                 KvFlagsHelp().c_str(), kComputeFlagsHelp);
    return 2;
  }
  if (args->Has("help")) {
    std::printf("%s%s%s", help.c_str(), KvFlagsHelp().c_str(), kComputeFlagsHelp);
    return 0;
  }
  absl::Status s = run(*args);
  if (!s.ok()) {
    // An empty message: already reported (another MPI rank printed it).
    if (!s.message().empty()) {
      std::fprintf(stderr, "specnode %s: %s\n", name, std::string(s.message()).c_str());
    }
    return 1;
  }
  return 0;
}

}  // namespace specnode
