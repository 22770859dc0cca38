// A loaded Llama model: the mapped GGUF file, its config, weight views and tokenizer.
// Immutable after Load(); safe to share between threads (forward passes keep their own
// scratch in LlamaForward).
#pragma once

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "model/gguf/gguf_reader.h"
#include "model/llama/llama_config.h"
#include "model/llama/llama_weights.h"
#include "model/tokenizer/tokenizer.h"

namespace specnode {

struct LoadOptions {
  ShardSpec shard;
  int n_layers = -1;  // < 0: all layers (see LoadLlamaWeights)
  ActQuant activations = ActQuant::kInt16;  // LlamaWeights::activations
  // Replaces the file's tokenizer.chat_template (BuiltinChatTemplate text); empty: the file's.
  std::string chat_template;
  // Called with the fraction of weight bytes paged in so far (0..1), from the loading
  // thread, at most ~100 times. Loading touches every weight page so that the first
  // token does not pay for page faults; a tensor-parallel shard (shard.size > 1) touches
  // only the pages of its own slices and the replicated tensors.
  std::function<void(double)> progress;
};

class LlamaModel {
 public:
  // Every failure is a Status naming the file and the problem (missing file, bad GGUF,
  // unsupported architecture, missing tensor, bad tokenizer).
  static absl::StatusOr<std::unique_ptr<LlamaModel>> Load(const std::string& path,
                                                          const LoadOptions& options = {});

  const GgufFile& file() const { return *file_; }
  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  const Tokenizer& tokenizer() const { return *tokenizer_; }

 private:
  LlamaModel() = default;

  std::unique_ptr<GgufFile> file_;
  LlamaConfig config_;
  LlamaWeights weights_;
  std::unique_ptr<Tokenizer> tokenizer_;
};

}  // namespace specnode
