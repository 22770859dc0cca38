// RemoteTargetRunner (rank 0's ModelRunner over MPI target shards) against scripted fake
// shards, under `mpirun -np 3` (ctest: remote_target_runner_mpi_test): rank 0 runs the
// GoogleTest cases in order; ranks 1 and 2 play TP ranks 0 and 1 of a target and misbehave
// on cue — a different model file, a failed load, a wrong block-table fingerprint, KV
// exhausted on one shard, silence past the deadline, a malformed reply — or keep a prefix
// cache (matches, publishes, events; shards that disagree on a match). Each case ends with
// a world barrier, then rank 0 discards any frame left over.
#include <mpi.h>
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "gtest/gtest.h"
#include "node/cluster/control_channel.h"
#include "node/cluster/control_protocol.h"
#include "node/cluster/remote_target_runner.h"
#include "tensor-parallel/mpi_check.h"
#include "tests/support/mpi_test_main.h"

namespace specnode {
namespace {

constexpr int kVocab = 8;
const ModelFingerprint kFp = {1000, 12, kVocab, 2};

// The scenarios, in the order rank 0's tests run them.
enum Scenario {
  kWrongModel,
  kLoadFailed,
  kSteps,
  kDiverged,
  kExhausted,
  kSilent,
  kMalformed,
  kPrefix,
  kPrefixDisagree,
  kTrees
};

// The prompt of the prefix scenarios: 17 tokens, two whole 8-token pages cached.
std::vector<int32_t> PrefixPrompt() {
  std::vector<int32_t> p;
  for (int32_t t = 1; t <= 17; ++t) p.push_back(t);
  return p;
}

ControlChannel& Channel() {
  static ControlChannel c;
  return c;
}

void Barrier() { MPI_Barrier(MPI_COMM_WORLD); }

// ---- The fake shards (ranks 1 and 2 = TP ranks 0 and 1). ----

std::string Recv0() {
  auto f = Channel().Recv(0, 30, "rank 0");
  if (!f.ok()) {
    std::fprintf(stderr, "fake shard: %s\n", std::string(f.status().message()).c_str());
    MPI_Abort(MPI_COMM_WORLD, 2);
  }
  return *f;
}

void Send0(const std::string& frame) { (void)Channel().Send(0, frame, 30, "rank 0"); }

void Handshake(int world, Scenario sc) {
  (void)DecodeHello(Recv0());
  HelloAckMessage ack;
  ack.model = kFp;
  ack.world_rank = world;
  ack.tp_rank = world - 1;
  ack.tp_size = 2;
  ack.pid = getpid();
  ack.host = ThisHost();
  ack.kv_capacity_bytes = 1 << 20;
  ack.kv_page_bytes = 4096;
  ack.kv_page_tokens = 8;
  if (sc == kWrongModel && world == 2) ack.model.file_bytes = 999;
  if (sc == kLoadFailed && world == 1) ack.set_status(absl::NotFoundError("no such file"));
  ack.kv_prefix_cache = sc == kPrefix || sc == kPrefixDisagree;
  ack.kv_tree_passes = sc == kTrees;
  Send0(EncodeControl(ack));
}

StepReplyMessage Reply(const StepPlanMessage& plan, int world, int64_t tokens) {
  StepReplyMessage r;
  r.step = plan.step;
  r.tp_rank = world - 1;
  // The fake keeps no table: the scripted plans below imply these lengths.
  std::vector<std::pair<SeqId, int32_t>> table;
  if (tokens > 0) table.push_back({1, static_cast<int32_t>(tokens)});
  const KvFingerprint f = FingerprintLengths(table);
  r.kv_hash = f.hash;
  r.kv_tokens = f.tokens;
  r.kv_used_bytes = 4096 * world;
  r.kv_class_bytes = {4096 * world, 0, 0, 0};
  r.kv_available_bytes = (1 << 20) - 4096 * 10 * world;  // TP rank 1 is the tighter one
  if (world == 1) {
    int64_t rows = 0;
    for (const StepEntry& e : plan.entries) {
      rows += e.all_logits ? static_cast<int64_t>(e.tokens.size()) : 1;
    }
    r.n_rows = rows;
    r.vocab = rows > 0 ? kVocab : 0;  // as ShardExecutor: no vocab without rows
    for (int64_t i = 0; i < rows * kVocab; ++i) r.logits.push_back(static_cast<float>(i));
  }
  return r;
}

void FakeShard(int world) {
  for (Scenario sc : {kWrongModel, kLoadFailed, kSteps, kDiverged, kExhausted, kSilent, kMalformed,
                      kPrefix, kPrefixDisagree, kTrees}) {
    Handshake(world, sc);
    if (sc == kSteps) {
      // Plan 1: seq 1 prefill of 3 tokens; plan 2: ops (truncate 1 -> 2) + one token.
      auto p1 = DecodeStepPlan(Recv0());
      Send0(EncodeControl(Reply(*p1, world, 3)));
      auto p2 = DecodeStepPlan(Recv0());
      const bool ops_ok = p2.ok() && p2->ops.size() == 1 && p2->ops[0] == StepOp::Truncate(1, 2);
      Send0(EncodeControl(Reply(*p2, world, ops_ok ? 3 : 99)));
      // Plan 3: a Ping (no entries, no ops).
      auto p3 = DecodeStepPlan(Recv0());
      const bool empty = p3.ok() && p3->entries.empty() && p3->ops.empty();
      Send0(EncodeControl(Reply(*p3, world, empty ? 3 : 99)));
    } else if (sc == kDiverged) {
      auto p = DecodeStepPlan(Recv0());
      Send0(EncodeControl(Reply(*p, world, world == 2 ? 4 : 3)));
    } else if (sc == kExhausted) {
      auto p = DecodeStepPlan(Recv0());
      StepReplyMessage r = Reply(*p, world, 0);
      r.n_rows = 0;
      r.logits.clear();
      r.set_status(world == 2 ? absl::ResourceExhaustedError("kv full on rank 2")
                              : absl::ResourceExhaustedError("TP rank 1 failed this step"));
      r.local_failure = world == 2;
      Send0(EncodeControl(r));
      auto again = DecodeStepPlan(Recv0());  // the retry succeeds
      Send0(EncodeControl(Reply(*again, world, 3)));
    } else if (sc == kSilent) {
      auto p = DecodeStepPlan(Recv0());
      if (world == 1) Send0(EncodeControl(Reply(*p, world, 3)));
    } else if (sc == kPrefix) {
      const std::vector<int32_t> prompt = PrefixPrompt();
      // Plan 1: the match alone (an ops-only step); 16 positions cached, one eviction seen.
      auto p1 = DecodeStepPlan(Recv0());
      const bool match_ok = p1.ok() && p1->entries.empty() && p1->ops.size() == 1 &&
                            p1->ops[0] == StepOp::MatchPrefix(1, prompt);
      StepReplyMessage r1 = Reply(*p1, world, match_ok ? 16 : 99);
      r1.matched = {16};
      if (world == 1) {
        KvCacheEvent removed;
        removed.kind = KvCacheEvent::Kind::kBlockRemoved;
        removed.block_hashes = {77};
        removed.medium = "CPU";
        r1.events = {removed};
      }
      Send0(EncodeControl(r1));
      // Plan 2: the prompt's last token only.
      auto p2 = DecodeStepPlan(Recv0());
      const bool rest_ok = p2.ok() && p2->ops.empty() && p2->entries.size() == 1 &&
                           p2->entries[0].tokens == std::vector<int32_t>{17};
      Send0(EncodeControl(Reply(*p2, world, rest_ok ? 17 : 99)));
      // Plan 3 (a Ping): the publish op, its tokens cut to the 17 cached positions.
      auto p3 = DecodeStepPlan(Recv0());
      const bool publish_ok =
          p3.ok() && p3->ops.size() == 1 && p3->ops[0] == StepOp::PublishPrefix(1, prompt);
      StepReplyMessage r3 = Reply(*p3, world, publish_ok ? 17 : 99);
      r3.kv_cache_only_bytes = 8192;
      if (world == 1) {
        KvCacheEvent stored;
        stored.block_hashes = {5, 6};
        stored.token_ids.assign(prompt.begin(), prompt.begin() + 16);
        stored.block_size = 8;
        stored.medium = "CPU";
        r3.events = {stored};
      }
      Send0(EncodeControl(r3));
    } else if (sc == kPrefixDisagree) {
      auto p = DecodeStepPlan(Recv0());
      StepReplyMessage r = Reply(*p, world, 16);
      r.matched = {world == 1 ? 16 : 8};
      Send0(EncodeControl(r));
    } else if (sc == kTrees) {
      // Plan 1: a prompt of 3; plan 2: a tree of 4 rows at positions 3.., its parents sent
      // along; plan 3: the kept path (rows 0, 1, 3 from position 3) as an op, then one token.
      auto p1 = DecodeStepPlan(Recv0());
      Send0(EncodeControl(Reply(*p1, world, 3)));
      auto p2 = DecodeStepPlan(Recv0());
      const bool tree_ok = p2.ok() && p2->entries.size() == 1 && p2->entries[0].all_logits &&
                           p2->entries[0].parents == std::vector<int32_t>{-1, 0, 0, 1};
      Send0(EncodeControl(Reply(*p2, world, tree_ok ? 7 : 99)));
      auto p3 = DecodeStepPlan(Recv0());
      const bool keep_ok = p3.ok() && p3->ops.size() == 1 &&
                           p3->ops[0] == StepOp::KeepRows(1, 3, std::vector<int32_t>{0, 1, 3}) &&
                           p3->entries.size() == 1 && p3->entries[0].parents.empty();
      Send0(EncodeControl(Reply(*p3, world, keep_ok ? 7 : 99)));
    } else if (sc == kMalformed) {
      auto p = DecodeStepPlan(Recv0());
      if (world == 1) {
        Send0("definitely not a frame");
      } else {
        Send0(EncodeControl(Reply(*p, world, 3)));
      }
    }
    Barrier();
  }
}

// ---- Rank 0: the runner under test. ----

class RemoteTargetRunnerTest : public ::testing::Test {
 protected:
  void TearDown() override {
    Barrier();
    std::string stale;
    for (int r : {1, 2}) {
      while (Channel().TryRecv(r, &stale).value_or(false)) {
      }
    }
  }
  static RemoteTargetOptions Options() {
    RemoteTargetOptions o;
    o.shard_ranks = {1, 2};
    o.timeout_s = 0.5;
    o.startup_timeout_s = 30;
    o.model = kFp;
    o.vocab_size = kVocab;
    o.max_positions = 64;
    return o;
  }
};

TEST_F(RemoteTargetRunnerTest, DifferentModelFileIsRefused) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_NE(r.status().message().find("target rank 2 opened a different model file"),
            std::string::npos)
      << r.status();
}

TEST_F(RemoteTargetRunnerTest, ShardLoadErrorIsReportedWithItsRank) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(r.status(), absl::NotFoundError("target rank 1: no such file"));
}

// Collects what a runner hands its KV event listener.
struct EventLog : KvCacheEventListener {
  void OnKvCacheEvent(KvCacheEvent e) override { events.push_back(std::move(e)); }
  std::vector<KvCacheEvent> events;
};

TEST_F(RemoteTargetRunnerTest, StepsCarryOpsAndLogits) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  // These shards keep no prefix cache: no round trip for a match (the scripted shards would
  // see an unexpected plan), no listener.
  const std::vector<int32_t> some = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  EXPECT_EQ((*r)->MatchPrefix(1, some), 0);
  EventLog log;
  EXPECT_EQ((*r)->SetKvEventListener(&log).code(), absl::StatusCode::kUnimplemented);
  ASSERT_EQ((*r)->shards().size(), 2u);
  EXPECT_EQ((*r)->shards()[1].world_rank, 2);
  // KV room: the shards' page geometry from their HelloAcks, the whole capacity free.
  std::optional<ModelRunner::KvRoom> room = (*r)->Room(17);  // 3 pages + the spare
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->needed, 4 * 4096);
  EXPECT_EQ(room->available, 1 << 20);
  std::vector<int32_t> prompt = {1, 2, 3};
  std::vector<BatchEntry> b1 = {{1, prompt, false}};
  std::vector<float> logits;
  ASSERT_TRUE((*r)->Forward(b1, &logits).ok());
  // After a step: the tightest shard's available bytes; used bytes summed for metrics.
  room = (*r)->Room(17);
  ASSERT_TRUE(room.has_value());
  EXPECT_EQ(room->available, (1 << 20) - 4096 * 20);
  const std::optional<ModelRunner::KvMemory> mem = (*r)->Memory();
  ASSERT_TRUE(mem.has_value());
  EXPECT_EQ(mem->capacity_bytes, 2 << 20);
  EXPECT_EQ(mem->used_bytes, 4096 * 3);
  EXPECT_EQ(mem->class_bytes[0], 4096 * 3);
  ASSERT_EQ(logits.size(), static_cast<size_t>(kVocab));
  EXPECT_EQ(logits[5], 5.0f);
  EXPECT_EQ((*r)->Length(1), 3);
  // These shards' caches take no draft trees (HelloAck v6): chains only, KeepRows refused
  // before anything is queued.
  EXPECT_FALSE((*r)->TreePasses());
  EXPECT_EQ((*r)->KeepRows(1, 1, std::vector<int32_t>{0}).code(), absl::StatusCode::kUnimplemented);
  EXPECT_EQ((*r)->Length(1), 3);
  ASSERT_TRUE((*r)->Truncate(1, 2).ok());
  EXPECT_EQ((*r)->Length(1), 2);  // at once, locally
  EXPECT_EQ((*r)->Truncate(1, 5).code(), absl::StatusCode::kInvalidArgument);
  std::vector<int32_t> one = {4};
  std::vector<BatchEntry> b2 = {{1, one, false}};
  ASSERT_TRUE((*r)->Forward(b2, &logits).ok());  // the shards saw the truncate op
  EXPECT_EQ((*r)->Length(1), 3);
  // A Ping is a step without rows: no logits, no vocab, and the runner stays usable.
  const absl::Status ping = (*r)->Ping();
  EXPECT_TRUE(ping.ok()) << ping;
  EXPECT_TRUE((*r)->broken().ok());
  EXPECT_EQ((*r)->Length(1), 3);
}

TEST_F(RemoteTargetRunnerTest, DivergedBlockTablesBreakTheRunner) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> prompt = {1, 2, 3};
  std::vector<BatchEntry> b = {{1, prompt, false}};
  std::vector<float> logits;
  const absl::Status s = (*r)->Forward(b, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("KV block tables diverged"), std::string::npos) << s;
  EXPECT_NE(s.message().find("target rank 2 holds 4 tokens"), std::string::npos) << s;
  EXPECT_EQ((*r)->Forward(b, &logits), s);  // broken: no more messages
}

TEST_F(RemoteTargetRunnerTest, KvExhaustedOnOneShardIsRecoverable) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> prompt = {1, 2, 3};
  std::vector<BatchEntry> b = {{1, prompt, false}};
  std::vector<float> logits;
  const absl::Status s = (*r)->Forward(b, &logits);
  EXPECT_EQ(s, absl::ResourceExhaustedError("kv full on rank 2"));  // the shard's own message
  EXPECT_TRUE((*r)->broken().ok());
  EXPECT_EQ((*r)->Length(1), 0);
  EXPECT_TRUE((*r)->Forward(b, &logits).ok());
}

TEST_F(RemoteTargetRunnerTest, SilentShardTimesOutNamingItsRank) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> prompt = {1, 2, 3};
  std::vector<BatchEntry> b = {{1, prompt, false}};
  std::vector<float> logits;
  const absl::Status s = (*r)->Forward(b, &logits);
  EXPECT_EQ(s, absl::DeadlineExceededError("target rank 2 did not answer within 0.8 s"));
  EXPECT_EQ((*r)->broken(), s);
  EXPECT_EQ((*r)->Truncate(1, 0), s);
}

TEST_F(RemoteTargetRunnerTest, MalformedReplyBreaksTheRunner) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  std::vector<int32_t> prompt = {1, 2, 3};
  std::vector<BatchEntry> b = {{1, prompt, false}};
  std::vector<float> logits;
  const absl::Status s = (*r)->Forward(b, &logits);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("target rank 1 sent a malformed reply"), std::string::npos) << s;
}

TEST_F(RemoteTargetRunnerTest, PrefixMatchPublishAndEventsTravelWithTheSteps) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EventLog log;
  ASSERT_TRUE((*r)->SetKvEventListener(&log).ok());
  const std::vector<int32_t> prompt = PrefixPrompt();
  EXPECT_EQ((*r)->MatchPrefix(1, prompt), 16);  // one round trip
  EXPECT_EQ((*r)->Length(1), 16);
  ASSERT_EQ(log.events.size(), 1u);  // TP rank 0's, as it arrived
  EXPECT_EQ(log.events[0].kind, KvCacheEvent::Kind::kBlockRemoved);
  EXPECT_EQ(log.events[0].block_hashes, std::vector<uint64_t>{77});
  std::vector<int32_t> last = {17};
  std::vector<BatchEntry> b = {{1, last, false}};
  std::vector<float> logits;
  ASSERT_TRUE((*r)->Forward(b, &logits).ok());
  EXPECT_EQ((*r)->Length(1), 17);
  // A match for a sequence that holds tokens is answered here, without a message.
  EXPECT_EQ((*r)->MatchPrefix(1, prompt), 0);
  std::vector<int32_t> longer = prompt;
  longer.insert(longer.end(), {40, 41, 42});
  (*r)->PublishPrefix(1, longer);  // queued; cut to the 17 cached positions
  ASSERT_TRUE((*r)->Ping().ok());
  ASSERT_EQ(log.events.size(), 2u);
  EXPECT_EQ(log.events[1].kind, KvCacheEvent::Kind::kBlockStored);
  EXPECT_EQ(log.events[1].token_ids.size(), 16u);
  const std::optional<ModelRunner::KvMemory> mem = (*r)->Memory();
  ASSERT_TRUE(mem.has_value());
  EXPECT_EQ(mem->cache_only_bytes, 2 * 8192);
  EXPECT_TRUE((*r)->SetKvEventListener(nullptr).ok());
}

TEST_F(RemoteTargetRunnerTest, ShardsThatDisagreeOnAMatchBreakTheRunner) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ((*r)->MatchPrefix(1, PrefixPrompt()), 0);
  const absl::Status s = (*r)->broken();
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal);
  EXPECT_NE(s.message().find("target rank 2 answered 1 prefix matches (8)"), std::string::npos)
      << s;
}

// Protocol v6: shards whose caches take draft trees. A tree entry carries its parents, the
// kept path travels as a KeepRows op with the next plan, and the runner's copy of the length
// follows at once (the fake shards check both; a wrong plan would diverge the tables).
TEST_F(RemoteTargetRunnerTest, DraftTreesTravelWithTheirParentsAndKeptRows) {
  auto r = RemoteTargetRunner::Connect(&Channel(), Options());
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_TRUE((*r)->TreePasses());
  std::vector<float> logits;
  const std::vector<int32_t> prompt = {1, 2, 3}, tree = {3, 4, 5, 6}, parents = {-1, 0, 0, 1};
  const std::vector<int32_t> kept = {0, 1, 3}, next = {6};
  std::vector<BatchEntry> b1 = {{1, prompt, false}};
  ASSERT_TRUE((*r)->Forward(b1, &logits).ok());
  std::vector<BatchEntry> b2 = {{1, tree, true, parents}};
  ASSERT_TRUE((*r)->Forward(b2, &logits).ok());
  EXPECT_EQ(logits.size(), 4u * kVocab);  // a row per tree node
  EXPECT_EQ((*r)->Length(1), 7);
  // Checked against the runner's own length before anything is queued.
  EXPECT_EQ((*r)->KeepRows(1, 3, std::vector<int32_t>{0, 9}).code(),
            absl::StatusCode::kInvalidArgument);
  ASSERT_TRUE((*r)->KeepRows(1, 3, kept).ok());
  EXPECT_EQ((*r)->Length(1), 6);
  std::vector<BatchEntry> b3 = {{1, next, false}};
  const absl::Status s3 = (*r)->Forward(b3, &logits);
  ASSERT_TRUE(s3.ok()) << s3;
  EXPECT_EQ((*r)->Length(1), 7);
}

}  // namespace
}  // namespace specnode

int main(int argc, char** argv) {
  return specnode::testing_support::RunUnderMpirun(argc, argv, 3,
                                                   [](int rank, int argc, char** argv) {
                                                     if (rank != 0) {
                                                       specnode::FakeShard(rank);
                                                       return 0;
                                                     }
                                                     ::testing::InitGoogleTest(&argc, argv);
                                                     ::testing::GTEST_FLAG(shuffle) = false;
                                                     return RUN_ALL_TESTS();
                                                   });
}
