#include "node/session/model_session.h"

#include <cstdio>
#include <type_traits>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "coordinator/request_validator.h"
#include "model/tokenizer/chat_template.h"
#include "model/cpu/cpu_features.h"
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
  options.chat_template = compute.chat_template;
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
  if (!chat) return model_->tokenizer().Encode(text, /*parse_special=*/false);
  return EncodeChat({{"user", text}});
}

absl::StatusOr<std::vector<int32_t>> ModelSession::EncodeChat(
    const std::vector<ChatMessage>& messages) const {
  const Tokenizer& tok = model_->tokenizer();
  SPECNODE_ASSIGN_OR_RETURN(std::string rendered,
                            ApplyChatTemplate(tok.spec().chat_template, messages,
                                              /*add_generation_prompt=*/true));
  return tok.Encode(rendered, /*parse_special=*/true);
}

absl::Status ModelSession::ValidateRequest(std::span<const int32_t> prompt, int64_t max_tokens,
                                           const SamplingParams& sampling,
                                           std::optional<std::string_view> domain) const {
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
  const int64_t tokens = (*t)[0] + (*t)[1] + (*t)[2] + (*t)[3];
  return absl::StrFormat("kv: %.1f KiB/token over %d tokens; f16 %d, int8 %d, int4 %d, int2 %d",
                         tokens == 0 ? 0.0 : m->used_bytes / 1024.0 / tokens, tokens, (*t)[0],
                         (*t)[1], (*t)[2], (*t)[3]);
}

}  // namespace specnode
