#include "coordinator/model_drafter.h"

#include <algorithm>
#include <filesystem>

#include "absl/strings/escaping.h"
#include "absl/strings/str_format.h"
#include "coordinator/acceptance.h"
#include "model/status_macros.h"
#include "runtime/runner_factory.h"

namespace specnode {
namespace {

constexpr size_t kSyncChunk = 512;  // tokens per sequence per catch-up forward

}  // namespace

absl::Status CheckSameVocabulary(const std::string& path, const LlamaConfig& draft,
                                 const Tokenizer& a, const LlamaConfig& target,
                                 const Tokenizer& b) {
  if (draft.vocab_size != target.vocab_size || a.vocab_size() != b.vocab_size()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "draft model %s has a vocabulary of %d tokens (%d in its tokenizer) but the target's "
        "has %d (%d): a draft must share the target's vocabulary",
        path, draft.vocab_size, a.vocab_size(), target.vocab_size, b.vocab_size()));
  }
  for (int32_t id = 0; id < a.vocab_size(); ++id) {
    if (a.TokenToBytes(id, true) != b.TokenToBytes(id, true)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "draft model %s: token %d is \"%s\" but the target's is \"%s\": a draft must share "
          "the target's vocabulary",
          path, id, absl::CEscape(a.TokenToBytes(id, true)),
          absl::CEscape(b.TokenToBytes(id, true))));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::Finish(std::unique_ptr<ModelDrafter> d,
                                                                   const LlamaConfig& config,
                                                                   ThreadPool* pool,
                                                                   const KvOptions& kv) {
  // A draft in this process runs on the CPU, through the one runner factory.
  RunnerOptions o;
  o.kv = kv;
  o.pool = pool;
  SPECNODE_ASSIGN_OR_RETURN(d->runner_, MakeRunner(config, d->weights_, o));
  return d;
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::Load(const std::string& path,
                                                                 const LlamaModel& target,
                                                                 ThreadPool* pool,
                                                                 const KvOptions& kv) {
  std::unique_ptr<ModelDrafter> d(new ModelDrafter());
  SPECNODE_ASSIGN_OR_RETURN(d->own_model_, LlamaModel::Load(path));
  SPECNODE_RETURN_IF_ERROR(CheckSameVocabulary(path, d->own_model_->config(),
                                               d->own_model_->tokenizer(), target.config(),
                                               target.tokenizer()));
  d->name_ = std::filesystem::path(path).filename().string();
  SPECNODE_ASSIGN_OR_RETURN(d->weights_,
                            LoadLlamaWeights(d->own_model_->file(), d->own_model_->config()));
  d->weights_.activations = target.weights().activations;  // one compute mode per node
  const LlamaConfig config = d->own_model_->config();
  return Finish(std::move(d), config, pool, kv);
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::Remote(
    std::unique_ptr<LlamaModel> draft, const std::string& path, const LlamaModel& target,
    const ConnectFn& connect) {
  SPECNODE_RETURN_IF_ERROR(CheckSameVocabulary(path, draft->config(), draft->tokenizer(),
                                               target.config(), target.tokenizer()));
  std::unique_ptr<ModelDrafter> d(new ModelDrafter());
  d->name_ = std::filesystem::path(path).filename().string();
  SPECNODE_ASSIGN_OR_RETURN(d->runner_, connect(*draft));
  d->own_model_ = std::move(draft);
  return d;
}

absl::StatusOr<std::unique_ptr<ModelDrafter>> ModelDrafter::SelfDraft(const LlamaModel& target,
                                                                      int layers, ThreadPool* pool,
                                                                      const KvOptions& kv) {
  const int total = target.config().n_layers;
  if (layers < 1 || layers >= total) {
    return absl::InvalidArgumentError(
        absl::StrFormat("self-draft layers must be in [1, %d) for this %d-layer target, got %d",
                        total, total, layers));
  }
  std::unique_ptr<ModelDrafter> d(new ModelDrafter());
  d->name_ = absl::StrFormat("self:%d", layers);
  LlamaConfig config = target.config();
  config.n_layers = layers;
  SPECNODE_ASSIGN_OR_RETURN(d->weights_,
                            LoadLlamaWeights(target.file(), target.config(), {}, layers));
  d->weights_.activations = target.weights().activations;
  return Finish(std::move(d), config, pool, kv);
}

size_t ModelDrafter::CachedPrefix(SeqId seq, std::span<const int32_t> tokens) const {
  auto it = cached_.find(seq);
  if (it == cached_.end()) return 0;
  const std::vector<int32_t>& cached = it->second;
  const size_t limit = std::min(cached.size(), tokens.size());
  size_t common = 0;
  while (common < limit && cached[common] == tokens[common]) ++common;
  return common;
}

absl::StatusOr<int32_t> ModelDrafter::Align(SeqId seq, std::span<const int32_t> tokens) {
  const size_t common = CachedPrefix(seq, tokens);
  std::vector<int32_t>& cached = cached_[seq];
  if (common < cached.size()) {
    SPECNODE_RETURN_IF_ERROR(runner_->Truncate(seq, static_cast<int32_t>(common)));
    cached.resize(common);
  }
  return static_cast<int32_t>(common);
}

int64_t ModelDrafter::Uncached(SeqId seq, std::span<const int32_t> context) const {
  // What Sync feeds: context[0, size - 1) past the cached prefix, unless that is a tail of
  // at most kProposeTail tokens, which Propose's first round feeds as drafting.
  if (context.empty()) return 0;
  const auto want = context.first(context.size() - 1);
  const size_t missing = want.size() - CachedPrefix(seq, want);
  return missing <= kProposeTail ? 0 : static_cast<int64_t>(missing);
}

absl::Status ModelDrafter::Sync(std::span<const DraftRequest> requests) {
  // Feed context[0, size - 1) in chunks, all sequences in one batch per round, unless what
  // is missing is a tail Propose feeds anyway (kProposeTail).
  while (true) {
    std::vector<BatchEntry> batch;
    for (const DraftRequest& r : requests) {
      const auto want = r.context.first(r.context.size() - 1);
      SPECNODE_ASSIGN_OR_RETURN(int32_t have, Align(r.seq, want));
      if (want.size() - static_cast<size_t>(have) <= kProposeTail) continue;
      const size_t n = std::min(kSyncChunk, want.size() - have);
      batch.push_back({r.seq, want.subspan(have, n), false});
    }
    if (batch.empty()) return absl::OkStatus();
    SPECNODE_RETURN_IF_ERROR(runner_->Forward(batch, &logits_));
    for (const BatchEntry& e : batch) {
      auto& cached = cached_[e.seq];
      cached.insert(cached.end(), e.tokens.begin(), e.tokens.end());
    }
  }
}

absl::Status ModelDrafter::Propose(std::span<const DraftRequest> requests,
                                   std::vector<Draft>* drafts) {
  const int32_t vocab = runner_->vocab_size();
  drafts->assign(requests.size(), Draft{});
  // Round 0 feeds each context's uncached tail (normally its last token); round i > 0 feeds
  // draft i. A sequence stops at its k, or where the draft model's context ends.
  std::vector<std::vector<int32_t>> feed(requests.size());
  for (size_t i = 0; i < requests.size(); ++i) {
    SPECNODE_ASSIGN_OR_RETURN(int32_t have, Align(requests[i].seq, requests[i].context));
    if (static_cast<size_t>(have) == requests[i].context.size()) {
      // Everything is cached already: re-feed the last token to get its logits.
      SPECNODE_RETURN_IF_ERROR(runner_->Truncate(requests[i].seq, have - 1));
      cached_[requests[i].seq].pop_back();
      --have;
    }
    feed[i].assign(requests[i].context.begin() + have, requests[i].context.end());
  }
  std::vector<float> q;
  // Per request wanting a tree: each drafted position's runners-up (leaf siblings).
  std::vector<std::vector<std::vector<int32_t>>> alts(requests.size());
  const bool any_tree = std::any_of(requests.begin(), requests.end(),
                                    [](const DraftRequest& r) { return r.max_nodes > 0; });
  auto row_of = [&](size_t b) {
    return std::span<const float>(logits_.data() + b * vocab, static_cast<size_t>(vocab));
  };
  for (int round = 0;; ++round) {
    std::vector<BatchEntry> batch;
    std::vector<size_t> who;
    for (size_t i = 0; i < requests.size(); ++i) {
      const DraftRequest& r = requests[i];
      const bool wants_more = static_cast<int>((*drafts)[i].tokens.size()) < r.k;
      const size_t pos_after = cached_[r.seq].size() + feed[i].size();
      if (!wants_more || feed[i].empty() ||
          pos_after >= static_cast<size_t>(runner_->max_positions())) {
        continue;
      }
      batch.push_back({r.seq, feed[i], false});
      who.push_back(i);
    }
    if (batch.empty()) break;
    // A round whose samplers all draw from a row's largest logits (greedy, top-k) takes only
    // those (a draft on a GPU keeps its logits there): the arg max when every one is greedy.
    // One whose samplers need whole rows only to draw from them (no top-k, no q to keep)
    // takes each row's draw instead.
    HeadPlan plan;
    for (size_t i : who) plan.Add(*requests[i].sampler, vocab);
    // Trees want each row's runners-up too: a cut head returns enough of them.
    if (any_tree && plan.k > 0) plan.k = std::min<int>(std::max(plan.k, kTreeBranch), vocab);
    const int head_k = plan.k;
    const bool drawn = head_k == 0 && std::all_of(who.begin(), who.end(), [&](size_t i) {
                         const Sampler& sampler = *requests[i].sampler;
                         return sampler.DrawsWithParams(vocab) &&
                                (sampler.params().temperature == 0.0f || !requests[i].need_q);
                       });
    if (drawn) {
      std::vector<sample::DrawParams> draws;
      for (size_t i : who) {
        draws.push_back(requests[i].sampler->DrawAt(
            static_cast<int64_t>(requests[i].context.size() + (*drafts)[i].tokens.size())));
      }
      SPECNODE_RETURN_IF_ERROR(runner_->ForwardDrawn(batch, draws, &ids_));
    } else if (head_k == 0) {
      SPECNODE_RETURN_IF_ERROR(runner_->Forward(batch, &logits_));
    } else if (plan.sampled || head_k > 1) {
      SPECNODE_RETURN_IF_ERROR(runner_->ForwardTopK(batch, head_k, &ids_, &values_));
    } else {
      SPECNODE_RETURN_IF_ERROR(runner_->ForwardArgMax(batch, &ids_));
    }
    const HeadRows head = plan.Rows(ids_, values_, 0);
    for (size_t b = 0; b < who.size(); ++b) {
      const size_t i = who[b];
      const DraftRequest& r = requests[i];
      auto& cached = cached_[r.seq];
      cached.insert(cached.end(), feed[i].begin(), feed[i].end());
      Draft& d = (*drafts)[i];
      // Draft j is the token at position context.size() + j: drawn with that position's
      // noise, as the target draws its own token there.
      const int64_t position = static_cast<int64_t>(r.context.size() + d.tokens.size());
      int32_t token;
      if (drawn) {
        token = ids_[b];  // drawn with DrawAt(position), as above
      } else if (head_k > 0 && (r.sampler->params().temperature == 0.0f || !r.need_q)) {
        token = head.Sample(b, *r.sampler, position);  // greedy: q one-hot, left implicit
      } else if (head_k > 0) {
        r.sampler->DistributionTopK(head.Ids(b), head.Values(b), vocab, &q);
        token = r.sampler->SampleFrom(q, position);
        d.q.insert(d.q.end(), q.begin(), q.end());
      } else if (r.sampler->params().temperature == 0.0f) {
        token = ArgMax(row_of(b));
      } else if (!r.need_q) {
        token = r.sampler->Sample(row_of(b), position);  // == SampleFrom(Distribution(row))
      } else {
        r.sampler->Distribution(row_of(b), &q);
        token = r.sampler->SampleFrom(q, position);
        d.q.insert(d.q.end(), q.begin(), q.end());
      }
      d.tokens.push_back(token);
      if (r.max_nodes > 0) {
        const bool whole = head_k == 0 && !drawn;
        alts[i].push_back(
            drawn ? std::vector<int32_t>()
                  : RunnersUp(b, head, whole ? row_of(b) : std::span<const float>(), token));
      }
      // The last wanted draft is not fed: its K/V would only matter if it is accepted, and
      // then the next Sync/Propose feeds it.
      feed[i].assign(1, token);
    }
  }
  for (size_t i = 0; i < requests.size(); ++i) {
    if (requests[i].max_nodes > 0) AttachSiblings(requests[i].max_nodes, alts[i], &(*drafts)[i]);
  }
  return absl::OkStatus();
}

std::vector<int32_t> ModelDrafter::RunnersUp(size_t b, const HeadRows& head,
                                             std::span<const float> row, int32_t token) {
  std::span<const int32_t> ids;
  if (head.k > 1) {
    ids = head.Ids(b);
  } else if (!row.empty()) {  // a whole-row round
    const int k = std::min<int>(kTreeBranch, static_cast<int>(row.size()));
    top_.resize(k);
    top_values_.resize(k);
    TopK(row, k, top_.data(), top_values_.data());
    ids = top_;
  }
  std::vector<int32_t> out;
  for (int32_t id : ids) {
    if (static_cast<int>(out.size()) + 1 == kTreeBranch) break;
    if (id >= 0 && id != token) out.push_back(id);
  }
  return out;
}

void ModelDrafter::AttachSiblings(int max_nodes, const std::vector<std::vector<int32_t>>& alts,
                                  Draft* d) {
  const int chain = static_cast<int>(d->tokens.size());
  int budget = max_nodes - chain;
  std::vector<int32_t> parents;
  for (int i = 0; i < chain; ++i) parents.push_back(i - 1);
  for (int depth = 0; depth < chain && depth < static_cast<int>(alts.size()); ++depth) {
    for (int32_t token : alts[depth]) {
      if (budget <= 0) break;
      d->tokens.push_back(token);
      parents.push_back(depth - 1);  // a sibling of chain node `depth`
      --budget;
    }
  }
  if (static_cast<int>(d->tokens.size()) > chain) d->parents = std::move(parents);
}

void ModelDrafter::Free(SeqId seq) {
  runner_->Free(seq);
  cached_.erase(seq);
}

}  // namespace specnode
