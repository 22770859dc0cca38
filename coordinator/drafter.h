// Drafter: proposes up to K next tokens for sequences, which the target then verifies.
//
// Drafters are stateless towards the engine: every call passes the sequence's whole
// committed context (prompt + accepted tokens), and a drafter with its own KV cache (a
// draft model) brings that cache in line by itself — it keeps the longest common prefix of
// what it cached and the context and feeds the rest. Rejected drafts are thereby rolled
// back on the draft side without a separate call.
//
// A proposal carries, for each drafted token, the distribution q it was drawn from (needed
// by the exact sampled acceptance rule), or no rows when the drafter is deterministic
// (q is then one-hot on the drafted token: n-gram lookup).
//
// Not thread-safe: the engine calls a drafter from its step loop only.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "model/llama/kv_cache.h"
#include "model/llama/sampling.h"

namespace specnode {

struct DraftRequest {
  SeqId seq = 0;
  std::span<const int32_t> context;  // committed tokens, non-empty
  int k = 0;                         // wanted drafts, >= 1
  // The sequence's sampler: params for q, and the noise of each position (a drafter that
  // samples draws draft j, the token at position context.size() + j, with
  // sampler->SampleFrom(q, that position) / Sample, so that it races with the same noise
  // as the target's draw there: what makes the match acceptance rule accept it).
  Sampler* sampler = nullptr;
  std::string_view domain;  // the request's routed domain (valid for the call)
  bool need_q = true;       // false: the acceptance rule does not read Draft::q (kMatch)
  // > 0: the target verifies trees (coordinator/draft_tree.h), and a drafter that builds
  // them may propose up to max_nodes nodes, none deeper than k; 0: a chain of up to k.
  int max_nodes = 0;
};

struct Draft {
  // 0..k drafted tokens (a chain), or the nodes of a tree when parents is not empty.
  std::vector<int32_t> tokens;
  // [tokens.size(), vocab], or empty (deterministic drafter, or need_q was false); chains
  // only.
  std::vector<float> q;
  // A tree's parent nodes ([tokens.size()], draft_tree.h), only when max_nodes > 0.
  std::vector<int32_t> parents;
};

class Drafter {
 public:
  virtual ~Drafter() = default;

  // For logs and stats: "ngram:3", "self:8", the draft file's name.
  virtual std::string name() const = 0;

  // Catches the drafter's state up on context it has not seen (a draft model prefills its
  // cache after steps it sat out, or a new sequence's prompt), so that Propose measures
  // only the cost of drafting; a short uncached tail may be left to Propose, which feeds it
  // with its first round anyway (ModelDrafter: up to kProposeTail tokens). The engine times
  // the two apart (catch-up is not a cost of K). Optional.
  virtual absl::Status Sync(std::span<const DraftRequest> requests) { return absl::OkStatus(); }

  // One proposal per request, in order (drafts->size() == requests.size()). Batched across
  // requests where the drafter can. Errors leave the engine's sequences untouched.
  virtual absl::Status Propose(std::span<const DraftRequest> requests,
                               std::vector<Draft>* drafts) = 0;

  // Context tokens Sync would feed before drafting for `seq` at `context`: a draft model's
  // tokens past the longest prefix it holds for seq (0 when that is a short tail Propose
  // feeds anyway); 0 for a drafter without state. The engine times catch-ups per token with
  // it, and the router weighs a drafter's first steps on a sequence with it.
  virtual int64_t Uncached(SeqId seq, std::span<const int32_t> context) const { return 0; }

  // True when proposals cost next to nothing and need no state caught up (prompt lookup):
  // the engine then also asks this drafter on steps another drafter (or none) served and
  // scores what it would have proposed against the tokens the target emitted (shadow
  // scoring, spec_engine.h), so its acceptance is learnt without giving it sequences.
  virtual bool CheapToShadow() const { return false; }

  // > 0: the drafter learns from the target's own verification (token recycling): after
  // each step the engine passes it, per sequence that fed the target, the tokens fed and
  // each returned row's ObservedTopK() largest candidates (fewer where the pass drew its
  // rows on the device: then the drawn token alone). 0 (default): never called.
  virtual int ObservedTopK() const { return 0; }
  // tokens [n]: the pass's input tokens whose rows came back (a verification's every row; a
  // direct step's or a prompt chunk's last token); ids [n * k]: row r's candidates at
  // [r * k, r * k + k), best first, -1 where the row had none (non-finite logits). Row r is
  // the target's prediction of the token after tokens[r] (after its tree path).
  virtual void ObserveTarget(std::span<const int32_t> tokens, std::span<const int32_t> ids, int k) {
  }

  // Releases what the drafter holds for seq. Unknown ids are ignored.
  // Liveness while idle (SpeculativeEngine::Heartbeat): a drafter whose model runs on
  // another rank checks that it still answers. OK by default.
  virtual absl::Status Ping() { return absl::OkStatus(); }
  virtual void Free(SeqId seq) = 0;
};

}  // namespace specnode
