// The one place golden_capture touches the model API: load a model, build a forward pass
// with its KV cache (one process or three tensor-parallel shards), run batches. When the
// forward pass's API changes, only golden_engine.cc follows it; the cases and the goldens
// stay as they are.
#pragma once

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/cpu/cpu_matmul.h"
#include "model/llama/kv_cache.h"
#include "model/llama/llama_forward.h"
#include "model/tokenizer/tokenizer.h"

namespace specnode {

class LlamaModel;

// A loaded model (whole or one shard).
class GoldenModel {
 public:
  static absl::StatusOr<std::unique_ptr<GoldenModel>> Load(const std::string& path, ActQuant act,
                                                           ShardSpec shard);
  ~GoldenModel();
  const Tokenizer& tokenizer() const;
  const LlamaModel& model() const { return *model_; }

 private:
  GoldenModel() = default;
  std::unique_ptr<LlamaModel> model_;
};

// A target with its KV cache. kv_mode: dense | full | int8 | int4 | mixed (the store's
// defaults otherwise). tp_size 1: this thread plus a 2-thread pool; 3: three shards, one
// thread each, summing through a LocalCommunicatorGroup; rank 0's logits are returned.
class GoldenEngine {
 public:
  static absl::StatusOr<std::unique_ptr<GoldenEngine>> Create(const std::string& path, ActQuant act,
                                                              const std::string& kv_mode,
                                                              int tp_size);
  virtual ~GoldenEngine() = default;
  virtual absl::Status Forward(std::span<const BatchEntry> batch, std::vector<float>* logits) = 0;
  virtual absl::Status Truncate(SeqId seq, int32_t n) = 0;
  virtual void Free(SeqId seq) = 0;
  virtual int32_t vocab() const = 0;
};

}  // namespace specnode
