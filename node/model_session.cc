#include "node/model_session.h"

#include <cstdio>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/request_validator.h"
#include "model/chat_template.h"
#include "model/cpu_features.h"
#include "model/status_macros.h"
#include "runtime/runner_factory.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<ModelSession>> ModelSession::Open(const std::string& path,
                                                                 int threads, bool show_progress,
                                                                 const KvOptions& kv,
                                                                 const ComputeOptions& compute) {
  auto s = std::make_unique<ModelSession>();
  s->device_ = compute.device;
  s->pool_ = std::make_unique<ThreadPool>(threads);
  RunnerOptions ro;
  ro.device = compute.device;
  ro.kv = kv;
  ro.activations = compute.activations;
  ro.pool = s->pool_.get();
  // Refuse what the device cannot do before reading any weight.
  SPECNODE_RETURN_IF_ERROR(CheckRunnerOptions(ro));
  LoadOptions options;
  options.activations = compute.activations.value_or(ActQuant::kInt16);
  if (show_progress) {
    options.progress = [&path](double f) {
      std::fprintf(stderr, "\rloading %s: %3d%%", path.c_str(), static_cast<int>(f * 100));
      if (f >= 1.0) std::fprintf(stderr, "\n");
    };
  }
  SPECNODE_ASSIGN_OR_RETURN(s->model_, LlamaModel::Load(path, options));
  SPECNODE_ASSIGN_OR_RETURN(s->runner_,
                            MakeRunner(s->model_->config(), s->model_->weights(), ro));
  return s;
}

std::string ModelSession::kernel_name() const { return runner_->backend().Describe(); }

absl::Status ModelSession::RequireCpu(const char* command) const {
  if (on_cpu()) return absl::OkStatus();
  return absl::FailedPreconditionError(absl::StrCat(
      command, " runs the CPU forward pass only (got --device ", device_.name(), ")"));
}

absl::StatusOr<std::vector<int32_t>> ModelSession::EncodePrompt(const std::string& text,
                                                                bool chat) const {
  const Tokenizer& tok = model_->tokenizer();
  if (!chat) return tok.Encode(text, /*parse_special=*/false);
  SPECNODE_ASSIGN_OR_RETURN(std::string rendered,
                            ApplyChatTemplate(tok.spec().chat_template, {{"user", text}},
                                              /*add_generation_prompt=*/true));
  return tok.Encode(rendered, /*parse_special=*/true);
}

absl::Status ModelSession::ValidateRequest(std::span<const int32_t> prompt, int64_t max_tokens,
                                           const SamplingParams& sampling,
                                           std::string_view domain) const {
  const LlamaConfig& c = model_->config();
  return specnode::ValidateRequest(prompt, max_tokens, sampling, domain,
                                   RequestLimits{c.vocab_size, c.context_length, c.context_length});
}

absl::StatusOr<std::span<const float>> ModelSession::Prefill(SeqId seq,
                                                             std::span<const int32_t> prompt) {
  for (size_t begin = 0; begin < prompt.size(); begin += kPrefillChunk) {
    const size_t count = std::min<size_t>(kPrefillChunk, prompt.size() - begin);
    BatchEntry entry{seq, prompt.subspan(begin, count), false};
    SPECNODE_RETURN_IF_ERROR(runner_->Forward({&entry, 1}, &logits_));
  }
  return std::span<const float>(logits_);
}

absl::StatusOr<std::span<const float>> ModelSession::Decode(SeqId seq, int32_t token) {
  BatchEntry entry{seq, {&token, 1}, false};
  SPECNODE_RETURN_IF_ERROR(runner_->Forward({&entry, 1}, &logits_));
  return std::span<const float>(logits_);
}

std::string ModelSession::KvSummary(SeqId seq) const {
  const std::optional<ModelRunner::KvMemory> m = runner_->Memory();
  const std::optional<std::array<int64_t, kKvClasses>> t = runner_->SequenceTokens(seq);
  if (!m.has_value() || !t.has_value()) return "";  // the dense reference cache
  const int64_t tokens = (*t)[0] + (*t)[1] + (*t)[2];
  return absl::StrFormat("kv: %.1f KiB/token over %d tokens; f16 %d, int8 %d, int4 %d",
                         tokens == 0 ? 0.0 : m->used_bytes / 1024.0 / tokens, tokens, (*t)[0],
                         (*t)[1], (*t)[2]);
}

const char kKvFlagsHelp[] =
    "  --kv-mode MODE      KV cache: auto (default: mixed on the CPU, full on a GPU), mixed\n"
    "                      (f16 sinks + recent window, older tokens INT8 if critical else\n"
    "                      INT4), full (f16), int8, int4, dense (f32 reference, CPU only)\n"
    "  --kv-capacity-mb N  KV memory budget in MiB (default 1024)\n"
    "  --kv-window N       recent tokens kept full precision in mixed mode (default 64)\n"
    "  --kv-sinks N        leading tokens kept full precision (default 4)\n"
    "  --kv-page-tokens N  token slots per KV page (default 8)\n"
    "  --kv-critical-threshold X  relative attention mass that keeps a token INT8 (default 4)\n"
    "  --kv-sample-every N observe attention mass at 1 query position in N (default 4)\n"
    "  --kv-evict-window N drop tokens older than N except the sinks (lossy; off by default)\n"
    "  --kv-no-rotate      store K/V unrotated (default: Hadamard-rotated before quantising)\n";

const char kComputeFlagsHelp[] =
    "  --activations MODE  CPU matmuls: int16 (default: follows a float reference's greedy\n"
    "                      path) or int8 (llama.cpp's rounding; faster batched matmuls on\n"
    "                      AVX-512 VNNI); refused on a GPU (f32 activations)\n"
    "  --device DEV        cpu (default) or cuda:N: the target's forward pass and KV store on\n"
    "                      that GPU (f16 pages: kv mode auto or full; builds with CUDA)\n";

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

absl::StatusOr<ComputeOptions> ComputeOptionsFromArgs(const CliArgs& args) {
  ComputeOptions c;
  SPECNODE_ASSIGN_OR_RETURN(c.activations, ActQuantFromArgs(args));
  if (args.Has("device")) {
    absl::StatusOr<Device> d = ParseDevice(args.Get("device"));
    if (!d.ok()) return absl::InvalidArgumentError(absl::StrCat("--device: ", d.status().message()));
    c.device = *d;
  }
  return c;
}

std::string ActivationsName(const ComputeOptions& compute) {
  if (!compute.device.is_cpu()) return "f32";
  return ActQuantName(compute.activations.value_or(ActQuant::kInt16));
}

std::set<std::string> KvValueKeys() {
  return {"kv-mode",         "kv-capacity-mb",        "kv-window",
          "kv-sinks",        "kv-critical-threshold", "kv-sample-every",
          "kv-evict-window", "kv-page-tokens"};
}

std::set<std::string> WithKvFlags(std::set<std::string> flags) {
  flags.insert("kv-no-rotate");
  return flags;
}

absl::Status ApplyKvFlags(const CliArgs& args, KvOptions* o) {
  if (args.Has("kv-mode")) {
    absl::StatusOr<KvMode> mode = ParseKvMode(args.Get("kv-mode"));
    if (!mode.ok()) return absl::InvalidArgumentError(absl::StrCat("--kv-mode: ", mode.status().message()));
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
  SPECNODE_RETURN_IF_ERROR(set_int("kv-window", 1, 1 << 20, &o->window_tokens));
  SPECNODE_RETURN_IF_ERROR(set_int("kv-sinks", 0, 1 << 20, &o->sink_tokens));
  SPECNODE_RETURN_IF_ERROR(set_int("kv-sample-every", 1, 1 << 20, &o->mass_sample_every));
  SPECNODE_RETURN_IF_ERROR(set_int("kv-page-tokens", 1, 4096, &o->page_tokens));
  if (args.Has("kv-critical-threshold")) {
    SPECNODE_ASSIGN_OR_RETURN(double thr, args.GetDouble("kv-critical-threshold", 0, 0.0, 1e6));
    o->critical_threshold = static_cast<float>(thr);
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

int RunModelCommand(const char* name, const char* help, int argc, char** argv,
                    std::set<std::string> value_keys, std::set<std::string> flag_keys,
                    absl::Status (*run)(const CliArgs&)) {
  value_keys.merge(KvValueKeys());
  value_keys.insert("activations");
  value_keys.insert("device");
  flag_keys.insert("help");
  auto args = CliArgs::Parse(argc, argv, value_keys, WithKvFlags(std::move(flag_keys)));
  if (!args.ok()) {
    std::fprintf(stderr, "specnode %s: %s\n%s%s%s", name,
                 std::string(args.status().message()).c_str(), help, kKvFlagsHelp,
                 kComputeFlagsHelp);
    return 2;
  }
  if (args->Has("help")) {
    std::printf("%s%s%s", help, kKvFlagsHelp, kComputeFlagsHelp);
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
