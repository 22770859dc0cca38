#include "node/model_session.h"

#include <cstdio>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "model/chat_template.h"
#include "model/cpu_features.h"
#include "model/status_macros.h"
#include "node/gpu_runner.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<ModelSession>> ModelSession::Open(const std::string& path,
                                                                 int threads, bool show_progress,
                                                                 const KvOptions& kv,
                                                                 const ComputeOptions& compute) {
  SPECNODE_ASSIGN_OR_RETURN(const int device, ParseDevice(compute.device, "device"));
  auto s = std::make_unique<ModelSession>();
  s->device_ = compute.device;
  LoadOptions options;
  options.activations = compute.activations;
  if (show_progress) {
    options.progress = [&path](double f) {
      std::fprintf(stderr, "\rloading %s: %3d%%", path.c_str(), static_cast<int>(f * 100));
      if (f >= 1.0) std::fprintf(stderr, "\n");
    };
  }
  SPECNODE_ASSIGN_OR_RETURN(s->model_, LlamaModel::Load(path, options));
  const LlamaConfig& c = s->model_->config();
  s->pool_ = std::make_unique<ThreadPool>(threads);
  if (device >= 0) {
    SPECNODE_ASSIGN_OR_RETURN(s->runner_, MakeGpuRunner(*s->model_, device, kv));
    return s;
  }
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<KvCache> cache,
                            MakeKvCache(c, s->model_->weights().n_kv_heads_local, kv));
  auto local =
      std::make_unique<LocalModelRunner>(c, s->model_->weights(), s->pool_.get(), std::move(cache));
  s->local_ = local.get();
  s->runner_ = std::move(local);
  return s;
}

std::string ModelSession::kernel_name() const { return on_cpu() ? CpuKernelName() : device_; }

absl::Status ModelSession::RequireCpu(const char* command) const {
  if (on_cpu()) return absl::OkStatus();
  return absl::FailedPreconditionError(
      absl::StrCat(command, " runs the CPU forward pass only (got --device ", device_, ")"));
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

absl::Status ModelSession::CheckPrompt(std::span<const int32_t> prompt,
                                       int64_t max_new_tokens) const {
  const LlamaConfig& c = model_->config();
  if (prompt.empty()) return absl::InvalidArgumentError("the prompt is empty");
  for (int32_t id : prompt) {
    if (id < 0 || id >= c.vocab_size) {
      return absl::InvalidArgumentError(
          absl::StrFormat("prompt token id %d outside the vocabulary [0, %d)", id, c.vocab_size));
    }
  }
  if (static_cast<int64_t>(prompt.size()) + max_new_tokens > c.context_length) {
    return absl::InvalidArgumentError(
        absl::StrFormat("prompt of %d tokens plus %d new tokens exceeds the context length %d",
                        prompt.size(), max_new_tokens, c.context_length));
  }
  return absl::OkStatus();
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
  if (!on_cpu()) return "";
  const auto* store = dynamic_cast<const KvStore*>(&local_->cache());
  if (store == nullptr) return "";
  const KvUsage u = store->Usage();
  const auto t = store->SequenceTokens(seq);
  const int64_t tokens = t[0] + t[1] + t[2];
  return absl::StrFormat("kv (%s): %.1f KiB/token over %d tokens; f16 %d, int8 %d, int4 %d",
                         std::string(KvModeName(store->config().mode)),
                         tokens == 0 ? 0.0 : u.used_bytes / 1024.0 / tokens, tokens, t[0], t[1],
                         t[2]);
}

const char kKvFlagsHelp[] =
    "  --kv-mode MODE      KV cache: mixed (default: f16 sinks + recent window, older tokens\n"
    "                      INT8 if critical else INT4), full (f16), int8, int4, dense (f32)\n"
    "  --kv-capacity-mb N  KV memory budget in MiB (default 1024)\n"
    "  --kv-window N       recent tokens kept full precision in mixed mode (default 64)\n"
    "  --kv-sinks N        leading tokens kept full precision (default 4)\n"
    "  --kv-page-tokens N  token slots per KV page (default 8)\n"
    "  --kv-critical-threshold X  relative attention mass that keeps a token INT8 (default 4)\n"
    "  --kv-sample-every N observe attention mass at 1 query position in N (default 4)\n"
    "  --kv-evict-window N drop tokens older than N except the sinks (lossy; off by default)\n"
    "  --kv-no-rotate      store K/V unrotated (default: Hadamard-rotated before quantising)\n";

const char kComputeFlagsHelp[] =
    "  --activations MODE  int16 (default: follows a float reference's greedy path) or int8\n"
    "                      (llama.cpp's rounding; faster batched matmuls on AVX-512 VNNI)\n"
    "  --device DEV        cpu (default) or cuda:N: the target's forward pass and KV cache on\n"
    "                      that GPU (f16 KV of --kv-capacity-mb; builds with the CUDA backend)\n";

absl::StatusOr<ActQuant> ActQuantFromArgs(const CliArgs& args) {
  ActQuant act = ActQuant::kInt16;
  const std::string name = args.Get("activations", "int16");
  if (!ParseActQuant(name, &act)) {
    return absl::InvalidArgumentError(
        absl::StrCat("--activations: expected int16 or int8, got \"", name, "\""));
  }
  return act;
}

absl::StatusOr<ComputeOptions> ComputeOptionsFromArgs(const CliArgs& args) {
  ComputeOptions c;
  SPECNODE_ASSIGN_OR_RETURN(c.activations, ActQuantFromArgs(args));
  c.device = args.Get("device", "cpu");
  SPECNODE_RETURN_IF_ERROR(ParseDevice(c.device, "--device").status());
  return c;
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
