// ModelSession: what a CLI command needs to run one model on this machine — the loaded
// model, a thread pool, the forward pass and a KV cache (kvstore/) — with prompt helpers.
// Not thread-safe (one command drives it).
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "kvstore/kv_options.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/device.h"
#include "model/llama/llama_forward.h"
#include "model/llama/llama_model.h"
#include "model/llama/sampling.h"
#include "model/tokenizer/chat_template.h"
#include "runtime/model_runner.h"

namespace specnode {

// Where and how the model runs (--activations, --device, --chat-template; model.activations,
// model.device and model.chat_template in a serve config), typed where they were read.
struct ComputeOptions {
  // CPU matmul activation rounding (cpu_matmul.h); unset: the device's own (int16 on the
  // CPU, f32 on a GPU, which refuses a set value).
  std::optional<ActQuant> activations;
  Device device;  // the target's forward pass and KV cache
  // A built-in chat template's text (BuiltinChatTemplate) replacing the file's; empty: the
  // file's own.
  std::string chat_template;
};

class ModelSession {
 public:
  // Loads `path`; show_progress draws a load progress bar on stderr. The runner comes from
  // the one factory (runtime/runner_factory.h): on cuda:N the model runs on that GPU with
  // its KV store there; drafts and everything else stay on the CPU. What the device cannot
  // do is refused before the weights are loaded.
  static absl::StatusOr<std::unique_ptr<ModelSession>> Open(const std::string& path, int threads,
                                                            bool show_progress,
                                                            const KvOptions& kv = {},
                                                            const ComputeOptions& compute = {});

  const LlamaModel& model() const { return *model_; }
  // The forward pass and cache as the speculative engine drives them (CPU or GPU).
  LocalModelRunner& runner() { return *runner_; }
  const Device& device() const { return device_; }
  bool on_cpu() const { return device_.is_cpu(); }
  // FailedPrecondition naming `command` when the session is not on the CPU.
  absl::Status RequireCpu(const char* command) const;
  ThreadPool* pool() { return pool_.get(); }
  // The backend's description: "cpu (avx2 kernels, int16 activations, 2 threads)",
  // "cuda:0 (NVIDIA H200), int16-activation matmuls (kQuantAct), CUDA graphs".
  std::string kernel_name() const;

  // Text -> ids; with chat, the text becomes one user turn in the model's chat template
  // (with the generation prompt) and special tokens in the template are parsed.
  absl::StatusOr<std::vector<int32_t>> EncodePrompt(const std::string& text, bool chat) const;
  // A conversation (user / assistant turns) in the model's chat template, with the
  // assistant turn opener after it.
  absl::StatusOr<std::vector<int32_t>> EncodeChat(const std::vector<ChatMessage>& messages) const;
  // The request checks every way in shares (coordinator/request_validator.h), with this
  // model's vocabulary and context: an empty prompt, ids outside the vocabulary, prompt +
  // max_tokens beyond the context, bad sampling values or domain are errors naming why.
  absl::Status ValidateRequest(std::span<const int32_t> prompt, int64_t max_tokens,
                               const SamplingParams& sampling = {},
                               std::optional<std::string_view> domain = std::nullopt) const;

  // Feeds the prompt to sequence `seq` in chunks of at most kPrefillChunk tokens and
  // returns the logits of its last token ([vocab], valid until the next call).
  absl::StatusOr<std::span<const float>> Prefill(SeqId seq, std::span<const int32_t> prompt);
  // Feeds one token; returns its logits ([vocab], valid until the next call).
  absl::StatusOr<std::span<const float>> Decode(SeqId seq, int32_t token);

  // One line on the KV cache's use by seq ("" for the dense cache): bytes per token and
  // tokens per precision class.
  std::string KvSummary(SeqId seq) const;

  static constexpr int kPrefillChunk = 512;

 private:
  std::unique_ptr<LlamaModel> model_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<LocalModelRunner> runner_;
  Device device_;
  std::vector<float> logits_;
};

}  // namespace specnode
