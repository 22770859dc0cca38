#include "node/cluster/remote_target_runner.h"

#include <unistd.h>

#include <algorithm>
#include <cassert>
#include <chrono>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

bool Recoverable(absl::StatusCode c) {
  // The shards agreed on these before any collective and left their caches unchanged.
  return c == absl::StatusCode::kResourceExhausted || c == absl::StatusCode::kInvalidArgument;
}

}  // namespace

std::string RemoteTargetRunner::RankName(size_t i) const {
  return absl::StrFormat("%s rank %d", options_.role, options_.shard_ranks[i]);
}

absl::Status RemoteTargetRunner::Break(absl::Status s) {
  if (broken_.ok()) broken_ = std::move(s);
  return broken_;
}

absl::Status RemoteTargetRunner::CheckAlive(const std::vector<size_t>& which) const {
  for (size_t i : which) {
    if (i < shards_.size() && !PeerAlive(shards_[i].pid, shards_[i].host)) {
      return absl::UnavailableError(
          absl::StrFormat("%s (pid %d) is gone", RankName(i), shards_[i].pid));
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<std::unique_ptr<RemoteTargetRunner>> RemoteTargetRunner::Connect(
    ControlChannel* channel, RemoteTargetOptions options) {
  if (options.shard_ranks.empty()) {
    return absl::InvalidArgumentError("a remote target needs at least one shard rank");
  }
  std::unique_ptr<RemoteTargetRunner> r(new RemoteTargetRunner(channel, std::move(options)));
  const RemoteTargetOptions& o = r->options_;
  HelloMessage hello;
  hello.model = o.model;
  hello.tp_size = static_cast<int32_t>(o.shard_ranks.size());
  hello.coordinator_pid = getpid();
  hello.coordinator_host = ThisHost();
  const std::string frame = EncodeControl(hello);
  for (size_t i = 0; i < o.shard_ranks.size(); ++i) {
    SPECNODE_RETURN_IF_ERROR(
        channel->Send(o.shard_ranks[i], frame, o.startup_timeout_s, r->RankName(i)));
  }
  for (size_t i = 0; i < o.shard_ranks.size(); ++i) {
    const std::string name = r->RankName(i);
    SPECNODE_ASSIGN_OR_RETURN(
        std::string reply,
        channel->Recv(o.shard_ranks[i], o.startup_timeout_s, name + " (loading its shard)"));
    absl::StatusOr<HelloAckMessage> ack = DecodeHelloAck(reply);
    if (!ack.ok()) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s answered Hello with: %s", name, ack.status().message()));
    }
    if (ack->status_code != 0) {
      return absl::Status(static_cast<absl::StatusCode>(ack->status_code),
                          absl::StrFormat("%s: %s", name, ack->status_message));
    }
    if (ack->protocol_version != kControlProtocolVersion) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s speaks control protocol version %d, rank 0 speaks %d", name,
                          ack->protocol_version, kControlProtocolVersion));
    }
    if (!(ack->model == o.model)) {
      return absl::FailedPreconditionError(
          absl::StrFormat("%s opened a different model file (%s) than rank 0 (%s)", name,
                          DescribeFingerprint(ack->model), DescribeFingerprint(o.model)));
    }
    if (ack->tp_rank != static_cast<int32_t>(i) ||
        ack->tp_size != static_cast<int32_t>(o.shard_ranks.size()) ||
        ack->world_rank != o.shard_ranks[i]) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s reports TP rank %d of %d (world rank %d); expected TP rank %d of %d", name,
          ack->tp_rank, ack->tp_size, ack->world_rank, i, o.shard_ranks.size()));
    }
    r->shards_.push_back({ack->world_rank, ack->tp_rank, ack->pid, ack->host,
                          ack->kv_capacity_bytes, ack->n_kv_heads_local, ack->kv_page_bytes,
                          ack->kv_page_tokens, ack->kv_pass_boundary, ack->kv_prefix_cache,
                          ack->kv_tree_passes});
    r->kv_.push_back({ack->kv_page_bytes > 0 ? ack->kv_capacity_bytes : -1, 0, {}});
  }
  return r;
}

std::string RemoteTargetRunner::device() const {
  return absl::StrCat(options_.role, " ranks ", absl::StrJoin(options_.shard_ranks, ","));
}

int32_t RemoteTargetRunner::Length(SeqId seq) const {
  auto it = lengths_.find(seq);
  return it == lengths_.end() ? 0 : it->second;
}

absl::Status RemoteTargetRunner::Truncate(SeqId seq, int32_t n) {
  if (!broken_.ok()) return broken_;
  const int32_t len = Length(seq);
  if (n < 0 || n > len) {
    return absl::InvalidArgumentError(
        absl::StrFormat("truncate of sequence %d to %d beyond its length %d", seq, n, len));
  }
  if (n == len) return absl::OkStatus();
  lengths_[seq] = n;
  pending_ops_.push_back(StepOp::Truncate(seq, n));
  return absl::OkStatus();
}

bool RemoteTargetRunner::TreePasses() const {
  return !shards_.empty() && std::all_of(shards_.begin(), shards_.end(),
                                         [](const ShardInfo& s) { return s.kv_tree_passes; });
}

absl::Status RemoteTargetRunner::KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) {
  if (!broken_.ok()) return broken_;
  if (!TreePasses()) {
    return absl::UnimplementedError(
        absl::StrCat(device(), ": the shards' caches take no draft trees"));
  }
  const int32_t len = Length(seq);
  SPECNODE_RETURN_IF_ERROR(CheckKeptRows(pos0, len, rows));
  lengths_[seq] = pos0 + static_cast<int32_t>(rows.size());
  pending_ops_.push_back(StepOp::KeepRows(seq, pos0, rows));
  return absl::OkStatus();
}

void RemoteTargetRunner::Free(SeqId seq) {
  lengths_.erase(seq);
  if (broken_.ok()) pending_ops_.push_back(StepOp::Free(seq));
}

absl::Status RemoteTargetRunner::SendPlan(const std::string& plan_frame) {
  for (size_t i = 0; i < options_.shard_ranks.size(); ++i) {
    absl::Status s = channel_->Send(options_.shard_ranks[i], plan_frame, options_.timeout_s,
                                    RankName(i), [&] { return CheckAlive({i}); });
    if (!s.ok()) return s;
  }
  return absl::OkStatus();
}

absl::Status RemoteTargetRunner::CollectReplies(uint64_t step,
                                                std::vector<StepReplyMessage>* replies) {
  const size_t n = options_.shard_ranks.size();
  std::vector<size_t> all(n);
  for (size_t i = 0; i < n; ++i) all[i] = i;
  // Every reply in one polling loop, so that a dead shard is noticed whichever we wait on.
  replies->assign(n, {});
  std::vector<bool> got(n, false);
  size_t pending = n;
  const auto start = Clock::now();
  // The shards' own collectives give up after timeout_s and then answer with an error
  // naming the rank they waited for; waiting a little longer lets those answers arrive, so
  // that the rank reported missing below is the one that hung, not a healthy rank still
  // stuck in a collective with it.
  const auto deadline =
      start + std::chrono::duration_cast<Clock::duration>(
                  std::chrono::duration<double>(options_.timeout_s * kReplyGraceFactor));
  auto next_check = start + std::chrono::milliseconds(20);
  PollBackoff backoff;
  std::string frame;
  while (pending > 0) {
    bool progress = false;
    for (size_t i = 0; i < n; ++i) {
      if (got[i]) continue;
      SPECNODE_ASSIGN_OR_RETURN(bool arrived, channel_->TryRecv(options_.shard_ranks[i], &frame,
                                                                [&] { return CheckAlive({i}); }));
      if (!arrived) continue;
      absl::StatusOr<StepReplyMessage> reply = DecodeStepReply(frame);
      if (!reply.ok()) {
        return absl::InternalError(absl::StrFormat("%s sent a malformed reply: %s", RankName(i),
                                                   reply.status().message()));
      }
      if (reply->step != step || reply->tp_rank != static_cast<int32_t>(i)) {
        return absl::InternalError(
            absl::StrFormat("%s answered step %d as TP rank %d; expected step %d from TP rank %d",
                            RankName(i), reply->step, reply->tp_rank, step, i));
      }
      (*replies)[i] = *std::move(reply);
      got[i] = true;
      --pending;
      progress = true;
    }
    if (pending == 0) break;
    if (progress) {
      backoff.Reset();
      continue;
    }
    const auto now = Clock::now();
    if (now >= next_check) {
      SPECNODE_RETURN_IF_ERROR(CheckAlive(all));
      next_check = now + std::chrono::milliseconds(20);
    }
    if (now >= deadline) {
      // Every silent rank is named: when a host is lost, its ranks and any healthy rank
      // stuck in a collective with them are silent together, and the first one alone
      // could point at the wrong machine.
      std::vector<size_t> silent;
      for (size_t i = 0; i < n; ++i) {
        if (!got[i]) silent.push_back(i);
      }
      const std::string who =
          silent.size() == 1
              ? RankName(silent[0])
              : absl::StrCat(options_.role, " ranks ",
                             absl::StrJoin(silent, ", ", [&](std::string* out, size_t i) {
                               absl::StrAppend(out, options_.shard_ranks[i]);
                             }));
      return absl::DeadlineExceededError(absl::StrFormat("%s did not answer within %.1f s", who,
                                                         options_.timeout_s * kReplyGraceFactor));
    }
    backoff.Sleep();
  }
  return absl::OkStatus();
}

absl::Status RemoteTargetRunner::Forward(std::span<const BatchEntry> batch,
                                         std::vector<float>* logits) {
  SPECNODE_RETURN_IF_ERROR(BeginForward(batch));
  return EndForward(logits);
}

absl::Status RemoteTargetRunner::BeginForward(std::span<const BatchEntry> batch) {
  if (!broken_.ok()) return broken_;
  assert(!in_flight_);
  StepPlanMessage plan;
  plan.step = ++step_;
  plan.ops.swap(pending_ops_);
  pending_ = {};
  pending_.step = plan.step;
  for (const StepOp& op : plan.ops) {
    if (op.kind == StepOp::Kind::kMatchPrefix) pending_.matching.push_back(op.seq);
  }
  for (const BatchEntry& e : batch) {
    plan.entries.push_back({e.seq,
                            e.all_logits,
                            {e.tokens.begin(), e.tokens.end()},
                            {e.parents.begin(), e.parents.end()}});
    pending_.rows += e.all_logits ? static_cast<int64_t>(e.tokens.size()) : 1;
    pending_.fed.emplace_back(e.seq, static_cast<int32_t>(e.tokens.size()));
  }
  absl::Status s = SendPlan(EncodeControl(plan));
  if (!s.ok()) return Break(std::move(s));
  in_flight_ = true;
  return absl::OkStatus();
}

absl::Status RemoteTargetRunner::EndForward(std::vector<float>* logits) {
  assert(in_flight_);
  in_flight_ = false;
  if (!broken_.ok()) return broken_;
  const Pending plan = std::move(pending_);
  const int64_t rows = plan.rows;
  std::vector<StepReplyMessage> replies;
  absl::Status s = CollectReplies(plan.step, &replies);
  if (!s.ok()) return Break(std::move(s));

  // The shards' verdict: the reply of the shard whose own check failed, else any failure.
  const StepReplyMessage* failed = nullptr;
  for (const StepReplyMessage& r : replies) {
    if (r.status_code != 0 && (failed == nullptr || (r.local_failure && !failed->local_failure))) {
      failed = &r;
    }
  }
  if (failed != nullptr && !Recoverable(static_cast<absl::StatusCode>(failed->status_code))) {
    return Break(
        absl::Status(static_cast<absl::StatusCode>(failed->status_code),
                     absl::StrFormat("%s: %s", RankName(failed->tp_rank), failed->status_message)));
  }
  // The ops ran on every shard whether or not the batch failed (a recoverable failure comes
  // after them): the agreed MatchPrefix counts become the sequences' lengths.
  for (const StepReplyMessage& r : replies) {
    if (r.matched.size() != plan.matching.size() || r.matched != replies[0].matched) {
      return Break(absl::InternalError(absl::StrFormat(
          "%s answered %d prefix matches (%s) for the %d of step %d (rank 0's first: %s)",
          RankName(r.tp_rank), r.matched.size(), absl::StrJoin(r.matched, ","),
          plan.matching.size(), plan.step, absl::StrJoin(replies[0].matched, ","))));
    }
  }
  for (size_t i = 0; i < plan.matching.size(); ++i) {
    if (replies[0].matched[i] > 0) lengths_[plan.matching[i]] = replies[0].matched[i];
  }
  if (failed == nullptr) {
    for (const auto& [seq, n] : plan.fed) lengths_[seq] += n;
  }
  // Block tables: every shard must agree with this copy.
  std::vector<std::pair<SeqId, int32_t>> table(lengths_.begin(), lengths_.end());
  const KvFingerprint want = FingerprintLengths(table);
  for (const StepReplyMessage& r : replies) {
    if (r.kv_hash != want.hash || r.kv_tokens != want.tokens) {
      return Break(absl::InternalError(absl::StrFormat(
          "KV block tables diverged after step %d: %s holds %d tokens (hash %016x), rank 0 "
          "expects %d (hash %016x)",
          plan.step, RankName(r.tp_rank), r.kv_tokens, r.kv_hash, want.tokens, want.hash)));
    }
  }
  for (const StepReplyMessage& r : replies) {
    kv_[r.tp_rank] = {r.kv_available_bytes, r.kv_used_bytes,  r.kv_class_bytes,
                      r.kv_class_tokens,    r.kv_host_bytes, r.kv_cache_only_bytes};
  }
  if (listener_ != nullptr) {
    for (KvCacheEvent& e : replies[0].events) listener_->OnKvCacheEvent(std::move(e));
  }
  if (failed != nullptr) return failed->status();
  StepReplyMessage& head = replies[0];
  // An ops-only step (a Ping) has no rows, and the shard sends no vocab with none.
  if (head.n_rows != rows || (rows > 0 && head.vocab != options_.vocab_size)) {
    return Break(absl::InternalError(
        absl::StrFormat("%s sent %d rows of vocab %d; expected %d rows of %d", RankName(0),
                        head.n_rows, head.vocab, rows, options_.vocab_size)));
  }
  logits->swap(head.logits);
  return absl::OkStatus();
}

bool RemoteTargetRunner::PrefixCache() const {
  return !shards_.empty() && std::all_of(shards_.begin(), shards_.end(),
                                         [](const ShardInfo& s) { return s.kv_prefix_cache; });
}

int32_t RemoteTargetRunner::MatchPrefix(SeqId seq, std::span<const int32_t> tokens) {
  if (!broken_.ok() || in_flight_ || !PrefixCache() || Length(seq) != 0 || tokens.empty()) {
    return 0;
  }
  pending_ops_.push_back(StepOp::MatchPrefix(seq, tokens));
  std::vector<float> none;
  if (!Forward({}, &none).ok()) return 0;  // broken: the engine's next call says why
  return Length(seq);
}

void RemoteTargetRunner::PublishPrefix(SeqId seq, std::span<const int32_t> tokens) {
  const int32_t len = Length(seq);
  if (!broken_.ok() || !PrefixCache() || len == 0) return;
  // Only cached positions can be published: the rest would be dropped by every shard.
  tokens = tokens.first(std::min<size_t>(tokens.size(), static_cast<size_t>(len)));
  pending_ops_.push_back(StepOp::PublishPrefix(seq, tokens));
}

absl::Status RemoteTargetRunner::SetKvEventListener(KvCacheEventListener* listener) {
  if (listener != nullptr && !PrefixCache()) {
    return absl::UnimplementedError(
        absl::StrCat("the target's shards on ", device(),
                     " keep no prefix cache (their KV caches are dense, not paged)"));
  }
  listener_ = listener;
  return absl::OkStatus();
}

absl::Status RemoteTargetRunner::Ping() {
  std::vector<float> none;
  return Forward({}, &none);
}

std::optional<ModelRunner::KvRoom> RemoteTargetRunner::Room(int64_t tokens) const {
  if (shards_.empty()) return std::nullopt;
  std::optional<KvRoom> tightest;  // the shard with the least room to spare
  for (size_t i = 0; i < shards_.size(); ++i) {
    const ShardInfo& s = shards_[i];
    if (s.kv_page_bytes <= 0 || s.kv_page_tokens <= 0 || kv_[i].available < 0) {
      return std::nullopt;
    }
    const int64_t pages = (tokens + s.kv_page_tokens - 1) / s.kv_page_tokens + 1;
    const KvRoom room{pages * s.kv_page_bytes, kv_[i].available};
    if (!tightest || room.available - room.needed < tightest->available - tightest->needed) {
      tightest = room;
    }
  }
  return tightest;
}

std::optional<ModelRunner::KvMemory> RemoteTargetRunner::Memory() const {
  KvMemory m;
  // Bytes add up over the shards. Every shard holds every token (for its own kv heads), so
  // tokens per class are the shards' mean (the shards of a mixed store may demote a token
  // differently); both only when every shard can tell.
  std::array<int64_t, kKvClasses> tokens{};
  int64_t host = 0, cache_only = 0;
  bool have_tokens = !shards_.empty(), have_host = !shards_.empty();
  bool have_cache_only = !shards_.empty();
  for (size_t i = 0; i < shards_.size(); ++i) {
    if (kv_[i].available < 0) return std::nullopt;
    m.capacity_bytes += shards_[i].kv_capacity_bytes;
    m.used_bytes += kv_[i].used;
    for (size_t c = 0; c < m.class_bytes.size(); ++c) {
      m.class_bytes[c] += kv_[i].class_bytes[c];
      if (kv_[i].class_tokens[c] < 0) have_tokens = false;
      tokens[c] += kv_[i].class_tokens[c];
    }
    if (kv_[i].host_bytes < 0) have_host = false;
    host += kv_[i].host_bytes;
    if (kv_[i].cache_only < 0) have_cache_only = false;
    cache_only += kv_[i].cache_only;
  }
  if (have_tokens) {
    const int64_t n = static_cast<int64_t>(shards_.size());
    for (int64_t& t : tokens) t = (t + n / 2) / n;
    m.class_tokens = tokens;
  }
  if (have_host) m.host_bytes = host;
  if (have_cache_only) m.cache_only_bytes = cache_only;
  return m;
}

void RemoteTargetRunner::Shutdown(const std::string& reason) {
  const std::string frame = EncodeControl(ShutdownMessage{reason});
  for (size_t i = 0; i < options_.shard_ranks.size(); ++i) {
    if (i < shards_.size() && !PeerAlive(shards_[i].pid, shards_[i].host)) continue;
    absl::Status s = channel_->Send(options_.shard_ranks[i], frame, 1.0, RankName(i),
                                    [&] { return CheckAlive({i}); });
    (void)s;  // best effort: a shard that cannot hear us is torn down by mpirun
  }
  if (broken_.ok()) broken_ = absl::FailedPreconditionError("the remote target was shut down");
}

}  // namespace specnode
