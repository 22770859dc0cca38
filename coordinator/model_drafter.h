// Drafters that run a Llama-family model: a separate draft GGUF with the target's
// vocabulary, or a self-draft made of the target's first L layers + its final norm and head
// (LayerSkip-style early exit, no extra weights). Both keep their own KV cache.
//
// Drafting K tokens for a batch of sequences costs K batched forward passes of one token
// per sequence. Each drafted token is sampled from q = the sequence sampler's Distribution
// of the draft logits (temperature / top-k / top-p of the request; greedy gives one-hot q)
// with the noise of the position it fills — the noise the target draws that position with,
// so under the match rule a draft close to the target is accepted often.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "coordinator/acceptance.h"
#include "coordinator/drafter.h"
#include "kvstore/kv_options.h"
#include "model/cpu/thread_pool.h"
#include "model/llama/llama_model.h"
#include "runtime/model_runner.h"

namespace specnode {

// A draft model must share the target's vocabulary: the same size in the model and its
// tokenizer, and every token the same bytes. InvalidArgument naming `path` and the first
// difference otherwise. (ModelDrafter's start, and `serve --check-config` from the headers.)
absl::Status CheckSameVocabulary(const std::string& path, const LlamaConfig& draft,
                                 const Tokenizer& draft_tokenizer, const LlamaConfig& target,
                                 const Tokenizer& target_tokenizer);

class ModelDrafter final : public Drafter {
 public:
  // A draft model from its own GGUF file. InvalidArgument when its vocabulary differs from
  // `target`'s (size or any token's bytes): drafted ids would mean other text.
  // `target` and `pool` must outlive the drafter.
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> Load(const std::string& path,
                                                            const LlamaModel& target,
                                                            ThreadPool* pool, const KvOptions& kv);

  // The first `layers` layers of `target` (1 <= layers < target's layer count, else
  // InvalidArgument). Shares the target's mapped weights.
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> SelfDraft(const LlamaModel& target,
                                                                 int layers, ThreadPool* pool,
                                                                 const KvOptions& kv);

  // A draft model that runs elsewhere (another MPI rank, or a GPU): `draft` is the file
  // mapped here for the vocabulary check (InvalidArgument on a mismatch, before `connect` is
  // called); `connect` then returns the runner that drives it (a RemoteTargetRunner over the
  // draft rank, a GPU runner from runtime/runner_factory.h on rank 0's GPU). Drafting is the
  // same as Load's.
  using ConnectFn =
      std::function<absl::StatusOr<std::unique_ptr<ModelRunner>>(const LlamaModel& draft)>;
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> Remote(std::unique_ptr<LlamaModel> draft,
                                                              const std::string& path,
                                                              const LlamaModel& target,
                                                              const ConnectFn& connect);

  // Sync leaves an uncached tail of up to this many tokens (besides the last) to Propose's
  // first round: a step that accepted every draft then costs one draft forward (the last
  // draft and the target's token together), not two.
  static constexpr size_t kProposeTail = 16;
  // Trees (DraftRequest::max_nodes > 0): each drafted position's next best candidates of the
  // draft's row, up to this many a position counted with the drafted one, become leaf
  // siblings of its node (the draft model is not run on them: no extra rounds), shallowest
  // positions first, within max_nodes. The target's walk then keeps a sibling where the
  // chain's token fails and takes its row's bonus token: a step gains a token where the
  // draft's runner-up was right. Rounds whose draws happen on the device (ForwardDrawn)
  // return no candidates: chains.
  static constexpr int kTreeBranch = 4;

  std::string name() const override { return name_; }
  absl::Status Sync(std::span<const DraftRequest> requests) override;
  int64_t Uncached(SeqId seq, std::span<const int32_t> context) const override;
  absl::Status Propose(std::span<const DraftRequest> requests, std::vector<Draft>* drafts) override;
  void Free(SeqId seq) override;
  absl::Status Ping() override { return runner_->Ping(); }  // a remote draft's ranks

 private:
  ModelDrafter() = default;
  // Length of the common prefix of seq's cached tokens and `tokens` (0 for an unknown seq).
  size_t CachedPrefix(SeqId seq, std::span<const int32_t> tokens) const;
  // Trees: row b's best candidates other than the drafted `token`, at most kTreeBranch - 1,
  // from the round's head (head.k > 1) or its whole row; none from a drawn round.
  std::vector<int32_t> RunnersUp(size_t b, const HeadRows& head, std::span<const float> row,
                                 int32_t token);
  // The chain in d->tokens plus, shallowest first and within max_nodes, each position's
  // runners-up (alts[depth]) as leaf siblings; parents set when any was added.
  static void AttachSiblings(int max_nodes, const std::vector<std::vector<int32_t>>& alts,
                             Draft* d);
  // Truncates seq's cache to its common prefix with `tokens` and returns that length.
  absl::StatusOr<int32_t> Align(SeqId seq, std::span<const int32_t> tokens);
  static absl::StatusOr<std::unique_ptr<ModelDrafter>> Finish(std::unique_ptr<ModelDrafter> d,
                                                              const LlamaConfig& config,
                                                              ThreadPool* pool,
                                                              const KvOptions& kv);

  std::string name_;
  std::unique_ptr<LlamaModel> own_model_;  // a separate draft file; null for a self-draft
  LlamaWeights weights_;                   // views (into own_model_ or the target's file)
  std::unique_ptr<ModelRunner> runner_;
  std::map<SeqId, std::vector<int32_t>> cached_;  // tokens whose K/V the runner holds
  std::vector<float> logits_;
  std::vector<int32_t> ids_;   // a round's head: arg maxes, top-k ids or draws (ModelRunner)
  std::vector<float> values_;  // a sampled top-k round's largest logits
  std::vector<int32_t> top_;   // a whole-row round's candidates for a tree (TopK)
  std::vector<float> top_values_;
};

}  // namespace specnode
