#include "node/model_session.h"

#include <cstdio>

#include "absl/strings/str_format.h"
#include "model/chat_template.h"
#include "model/cpu_features.h"
#include "model/status_macros.h"

namespace specnode {

absl::StatusOr<std::unique_ptr<ModelSession>> ModelSession::Open(const std::string& path,
                                                                 int threads, bool show_progress,
                                                                 int64_t kv_tokens) {
  auto s = std::make_unique<ModelSession>();
  LoadOptions options;
  if (show_progress) {
    options.progress = [&path](double f) {
      std::fprintf(stderr, "\rloading %s: %3d%%", path.c_str(), static_cast<int>(f * 100));
      if (f >= 1.0) std::fprintf(stderr, "\n");
    };
  }
  SPECNODE_ASSIGN_OR_RETURN(s->model_, LlamaModel::Load(path, options));
  const LlamaConfig& c = s->model_->config();
  s->pool_ = std::make_unique<ThreadPool>(threads);
  s->forward_ = std::make_unique<LlamaForward>(c, s->model_->weights(), s->pool_.get());
  s->cache_ = std::make_unique<DenseKvCache>(c.n_layers, c.n_kv_heads, c.head_dim, c.gqa_group(),
                                             c.context_length, kv_tokens);
  return s;
}

std::string ModelSession::kernel_name() const { return CpuKernelName(); }

absl::StatusOr<std::vector<int32_t>> ModelSession::EncodePrompt(const std::string& text,
                                                                bool chat) const {
  const Tokenizer& tok = model_->tokenizer();
  if (!chat) return tok.Encode(text, /*parse_special=*/false);
  SPECNODE_ASSIGN_OR_RETURN(
      std::string rendered,
      ApplyChatTemplate(tok.spec().chat_template, {{"user", text}}, /*add_generation_prompt=*/true));
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
    return absl::InvalidArgumentError(absl::StrFormat(
        "prompt of %d tokens plus %d new tokens exceeds the context length %d", prompt.size(),
        max_new_tokens, c.context_length));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::span<const float>> ModelSession::Prefill(SeqId seq,
                                                             std::span<const int32_t> prompt) {
  for (size_t begin = 0; begin < prompt.size(); begin += kPrefillChunk) {
    const size_t count = std::min<size_t>(kPrefillChunk, prompt.size() - begin);
    BatchEntry entry{seq, prompt.subspan(begin, count), false};
    SPECNODE_RETURN_IF_ERROR(forward_->Forward({&entry, 1}, cache_.get(), &logits_));
  }
  return std::span<const float>(logits_);
}

absl::StatusOr<std::span<const float>> ModelSession::Decode(SeqId seq, int32_t token) {
  BatchEntry entry{seq, {&token, 1}, false};
  SPECNODE_RETURN_IF_ERROR(forward_->Forward({&entry, 1}, cache_.get(), &logits_));
  return std::span<const float>(logits_);
}

}  // namespace specnode
