#include "node/cluster/shard_executor.h"

#include <algorithm>

#include "absl/strings/str_format.h"
#include "model/status_macros.h"

namespace specnode {

ShardExecutor::ShardExecutor(const LlamaConfig& config, std::unique_ptr<ModelRunner> model,
                             Communicator* comm)
    : config_(config), comm_(comm), model_(std::move(model)) {
  // Every shard's cache holds the same blocks, so TP rank 0 alone reports their events (as it
  // alone returns logits). A cache without a prefix cache refuses a listener, null or not.
  prefix_cache_ = model_->SetKvEventListener(comm_->rank() == 0 ? &events_ : nullptr).ok();
}

absl::StatusOr<int32_t> ShardExecutor::MatchPrefix(const StepOp& op) {
  const int32_t mine = prefix_cache_ ? std::max(0, model_->MatchPrefix(op.seq, op.tokens)) : 0;
  int32_t agreed = mine;
  if (comm_->size() > 1) {
    // Counts are positions of one sequence (< 2^24), exact as floats.
    const float f = static_cast<float>(mine);
    std::vector<float> all(comm_->size());
    SPECNODE_RETURN_IF_ERROR(comm_->AllGather(&f, 1, all.data()));
    agreed = static_cast<int32_t>(*std::min_element(all.begin(), all.end()));
  }
  if (mine > agreed) {
    // Another shard's cache had fewer of these blocks (it evicted them when a reservation
    // failed elsewhere): keep what every shard has.
    if (agreed == 0) {
      model_->Free(op.seq);
    } else {
      SPECNODE_RETURN_IF_ERROR(model_->Truncate(op.seq, agreed));
    }
  }
  if (agreed > 0) live_.insert(op.seq);
  return agreed;
}

KvFingerprint ShardExecutor::Fingerprint() const {
  std::vector<std::pair<SeqId, int32_t>> table;
  table.reserve(live_.size());
  for (SeqId s : live_) table.push_back({s, model_->Length(s)});
  return FingerprintLengths(table);
}

StepReplyMessage ShardExecutor::Execute(const StepPlanMessage& plan) {
  StepReplyMessage reply;
  reply.step = plan.step;
  reply.tp_rank = comm_->rank();
  auto finish = [&](absl::Status s, bool local) {
    reply.set_status(s);
    reply.local_failure = local && !s.ok();
    const KvFingerprint f = Fingerprint();
    reply.kv_hash = f.hash;
    reply.kv_tokens = f.tokens;
    if (const std::optional<ModelRunner::KvRoom> room = model_->Room(0)) {
      reply.kv_available_bytes = room->available;
    }
    if (const std::optional<ModelRunner::KvMemory> m = model_->Memory()) {
      reply.kv_used_bytes = m->used_bytes;
      for (size_t c = 0; c < reply.kv_class_bytes.size() && c < m->class_bytes.size(); ++c) {
        reply.kv_class_bytes[c] = m->class_bytes[c];
        if (m->class_tokens.has_value()) reply.kv_class_tokens[c] = (*m->class_tokens)[c];
      }
      if (m->host_bytes.has_value()) reply.kv_host_bytes = *m->host_bytes;
      if (m->cache_only_bytes.has_value()) reply.kv_cache_only_bytes = *m->cache_only_bytes;
    }
    reply.events = std::move(events_.events);
    events_.events.clear();
    return reply;
  };

  // 1. Ops, in order. The coordinator checked them against its own table, so a failure
  // here means the tables already diverged.
  for (const StepOp& op : plan.ops) {
    if (op.kind == StepOp::Kind::kFree) {
      model_->Free(op.seq);
      live_.erase(op.seq);
    } else if (op.kind == StepOp::Kind::kPublishPrefix) {
      if (prefix_cache_) model_->PublishPrefix(op.seq, op.tokens);
    } else if (op.kind == StepOp::Kind::kMatchPrefix) {
      absl::StatusOr<int32_t> n = MatchPrefix(op);
      if (!n.ok()) return finish(n.status(), true);
      reply.matched.push_back(*n);
    } else if (op.kind == StepOp::Kind::kKeepRows) {
      absl::Status s = model_->KeepRows(op.seq, op.n, op.tokens);
      if (!s.ok()) {
        return finish(
            absl::InternalError(absl::StrFormat("keeping %d rows of sequence %d from %d: %s",
                                                op.tokens.size(), op.seq, op.n, s.message())),
            true);
      }
    } else {
      absl::Status s = model_->Truncate(op.seq, op.n);
      if (!s.ok()) {
        return finish(absl::InternalError(absl::StrFormat("truncate of sequence %d to %d: %s",
                                                          op.seq, op.n, s.message())),
                      true);
      }
    }
  }

  // 2. Check (the forward pass's own rules) and reserve; remember new sequences to undo.
  std::vector<BatchEntry> batch;
  batch.reserve(plan.entries.size());
  for (const StepEntry& e : plan.entries) {
    batch.push_back({e.seq,
                     {e.tokens.data(), e.tokens.size()},
                     e.all_logits,
                     {e.parents.data(), e.parents.size()}});
  }
  absl::Status local = ValidateBatch(batch, config_.vocab_size).status();
  for (size_t i = 0; i < batch.size() && local.ok(); ++i) {
    if (!batch[i].parents.empty() && !model_->TreePasses()) {
      local = absl::UnimplementedError(
          absl::StrFormat("sequence %d: this shard's cache takes no draft trees", batch[i].seq));
    }
  }
  std::vector<SeqId> created;
  if (local.ok()) {
    for (const StepEntry& e : plan.entries) {
      const bool is_new = model_->Length(e.seq) == 0;
      absl::Status s = model_->Reserve(e.seq, static_cast<int32_t>(e.tokens.size()));
      if (is_new) created.push_back(e.seq);  // Free of an unknown id is a no-op
      if (!s.ok()) {
        local = s;
        break;
      }
    }
  }

  // 3. Agree before any collective of the forward pass.
  if (comm_->size() > 1) {
    const float mine = static_cast<float>(static_cast<int>(local.code()));
    std::vector<float> codes(comm_->size());
    absl::Status g = comm_->AllGather(&mine, 1, codes.data());
    if (!g.ok()) return finish(g, true);
    for (int r = 0; r < comm_->size(); ++r) {
      if (local.ok() && codes[r] != 0.0f) {
        for (SeqId seq : created) model_->Free(seq);
        return finish(absl::Status(static_cast<absl::StatusCode>(static_cast<int>(codes[r])),
                                   absl::StrFormat("TP rank %d failed this step", r)),
                      false);
      }
    }
  }
  if (!local.ok()) {
    for (SeqId s : created) model_->Free(s);
    return finish(local, true);
  }

  // 4. The forward pass (Reserve inside is a no-op now). Only TP rank 0 needs logits.
  if (!batch.empty()) {
    for (const BatchEntry& e : batch) live_.insert(e.seq);
    const bool head = comm_->rank() == 0;
    absl::Status s = model_->Forward(batch, head ? &logits_ : nullptr);
    if (!s.ok()) return finish(s, true);
    if (head) {
      reply.vocab = config_.vocab_size;
      reply.n_rows = static_cast<int64_t>(logits_.size()) / config_.vocab_size;
      reply.logits.swap(logits_);
    }
  }
  return finish(absl::OkStatus(), false);
}

}  // namespace specnode
