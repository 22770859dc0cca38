#include "node/cluster/control_protocol.h"

#include <cstring>
#include <random>

#include "absl/strings/str_format.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace specnode {
namespace {

using ::testing::HasSubstr;

ModelFingerprint Fp() { return {123456789, 272, 49152, 30}; }

HelloMessage SampleHello() {
  HelloMessage m;
  m.model = Fp();
  m.tp_size = 3;
  m.coordinator_pid = 4242;
  m.coordinator_host = "node-a";
  return m;
}

HelloAckMessage SampleAck() {
  HelloAckMessage m;
  m.model = Fp();
  m.world_rank = 2;
  m.tp_rank = 1;
  m.tp_size = 3;
  m.kv_capacity_bytes = int64_t{512} << 20;
  m.n_kv_heads_local = 1;
  m.kv_page_bytes = 24576;
  m.kv_page_tokens = 8;
  m.kv_prefix_cache = true;
  m.kv_tree_passes = true;
  m.pid = 777;
  m.host = "node-b";
  m.status_code = static_cast<int32_t>(absl::StatusCode::kNotFound);
  m.status_message = "no such file";
  return m;
}

StepPlanMessage SamplePlan() {
  StepPlanMessage m;
  m.step = 17;
  const std::vector<int32_t> prompt = {3, 1, 4, 1, 5, 9, 2, 6, 5, 3};
  m.ops = {StepOp::Truncate(5, 12),         StepOp::Free(-3),
           StepOp::MatchPrefix(11, prompt), StepOp::PublishPrefix(5, prompt),
           StepOp::MatchPrefix(12, {}),     StepOp::KeepRows(5, 10, std::vector<int32_t>{0, 2, 3})};
  // A chain, a decode step, and a draft tree (v6: its parent rows).
  m.entries = {
      {5, true, {1, 2, 3, 4, 5}}, {9, false, {42}}, {4, true, {7, 8, 9, 10}, {-1, 0, 0, 2}}};
  return m;
}

StepReplyMessage SampleReply() {
  StepReplyMessage m;
  m.step = 17;
  m.tp_rank = 0;
  m.kv_hash = 0xdeadbeefcafef00dull;
  m.kv_tokens = 99;
  m.kv_available_bytes = 123456;
  m.kv_used_bytes = 654321;
  m.kv_class_bytes = {600000, 50000, 4321, 2800};
  m.kv_class_tokens = {70, 8, 120, 140};
  m.kv_host_bytes = 9999;
  m.kv_cache_only_bytes = 4096;
  m.matched = {16, 0};
  KvCacheEvent stored;
  stored.block_hashes = {0x7fffffffffffffffull, 1};
  stored.parent_block_hash = 42;
  stored.token_ids = {1, 2, 3, 4, 5, 6};
  stored.block_size = 3;
  stored.medium = "CPU";
  KvCacheEvent removed;
  removed.kind = KvCacheEvent::Kind::kBlockRemoved;
  removed.block_hashes = {9};
  removed.medium = "GPU";
  KvCacheEvent cleared;
  cleared.kind = KvCacheEvent::Kind::kAllBlocksCleared;
  KvCacheEvent first = stored;
  first.parent_block_hash.reset();
  m.events = {stored, removed, cleared, first};
  m.n_rows = 2;
  m.vocab = 3;
  m.logits = {0.5f, -1.0f, 2.0f, 3.0f, 1e-3f, -7.25f};
  return m;
}

// Rewrites the header's payload length so that only the payload is malformed.
std::string FixLength(std::string frame) {
  const uint64_t payload = frame.size() - kControlHeaderBytes;
  std::memcpy(frame.data() + 8, &payload, sizeof(payload));
  return frame;
}

TEST(ControlProtocolTest, HelloRoundTrip) {
  const HelloMessage m = SampleHello();
  const std::string f = EncodeControl(m);
  ASSERT_EQ(*PeekControlKind(f), ControlKind::kHello);
  auto d = DecodeHello(f);
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->protocol_version, kControlProtocolVersion);
  EXPECT_EQ(d->model, m.model);
  EXPECT_EQ(d->tp_size, 3);
  EXPECT_EQ(d->coordinator_pid, 4242);
  EXPECT_EQ(d->coordinator_host, "node-a");
}

TEST(ControlProtocolTest, HelloAckRoundTrip) {
  const HelloAckMessage m = SampleAck();
  auto d = DecodeHelloAck(EncodeControl(m));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->model, m.model);
  EXPECT_EQ(d->world_rank, 2);
  EXPECT_EQ(d->tp_rank, 1);
  EXPECT_EQ(d->tp_size, 3);
  EXPECT_EQ(d->kv_capacity_bytes, m.kv_capacity_bytes);
  EXPECT_EQ(d->n_kv_heads_local, 1);
  EXPECT_EQ(d->kv_page_bytes, 24576);
  EXPECT_EQ(d->kv_page_tokens, 8);
  EXPECT_TRUE(d->kv_prefix_cache);
  EXPECT_TRUE(d->kv_tree_passes);
  EXPECT_EQ(d->pid, 777);
  EXPECT_EQ(d->host, "node-b");
  EXPECT_EQ(d->status_code, m.status_code);
  EXPECT_EQ(d->status_message, "no such file");
}

TEST(ControlProtocolTest, StepPlanRoundTrip) {
  const StepPlanMessage m = SamplePlan();
  auto d = DecodeStepPlan(EncodeControl(m));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->step, 17u);
  EXPECT_EQ(d->ops, m.ops);
  EXPECT_EQ(d->entries, m.entries);

  StepPlanMessage empty;
  auto e = DecodeStepPlan(EncodeControl(empty));
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_TRUE(e->ops.empty());
  EXPECT_TRUE(e->entries.empty());
}

TEST(ControlProtocolTest, StepReplyRoundTrip) {
  StepReplyMessage m = SampleReply();
  auto d = DecodeStepReply(EncodeControl(m));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->step, 17u);
  EXPECT_EQ(d->kv_hash, m.kv_hash);
  EXPECT_EQ(d->kv_available_bytes, 123456);
  EXPECT_EQ(d->kv_used_bytes, 654321);
  EXPECT_EQ(d->kv_class_bytes, m.kv_class_bytes);
  EXPECT_EQ(d->kv_class_tokens, m.kv_class_tokens);
  EXPECT_EQ(d->kv_host_bytes, 9999);
  EXPECT_EQ(d->kv_cache_only_bytes, 4096);
  EXPECT_EQ(d->matched, m.matched);
  EXPECT_EQ(d->events, m.events);
  EXPECT_EQ(d->kv_tokens, 99);
  EXPECT_EQ(d->n_rows, 2);
  EXPECT_EQ(d->vocab, 3);
  EXPECT_EQ(d->logits, m.logits);
  EXPECT_TRUE(d->status().ok());

  StepReplyMessage err;
  err.tp_rank = 2;
  err.set_status(absl::ResourceExhaustedError("kv full"));
  err.local_failure = true;
  auto de = DecodeStepReply(EncodeControl(err));
  ASSERT_TRUE(de.ok()) << de.status();
  EXPECT_EQ(de->status(), absl::ResourceExhaustedError("kv full"));
  EXPECT_TRUE(de->local_failure);
  EXPECT_EQ(de->tp_rank, 2);
  EXPECT_TRUE(de->logits.empty());
}

TEST(ControlProtocolTest, ShutdownRoundTrip) {
  auto d = DecodeShutdown(EncodeControl(ShutdownMessage{"bye"}));
  ASSERT_TRUE(d.ok()) << d.status();
  EXPECT_EQ(d->reason, "bye");
}

TEST(ControlProtocolTest, HeaderErrors) {
  const std::string f = EncodeControl(SampleHello());
  EXPECT_THAT(PeekControlKind("").status().message(), HasSubstr("shorter than"));
  EXPECT_THAT(PeekControlKind(f.substr(0, 15)).status().message(), HasSubstr("shorter than"));

  std::string bad_magic = f;
  bad_magic[0] = 'X';
  EXPECT_THAT(DecodeHello(bad_magic).status().message(), HasSubstr("bad magic"));

  std::string bad_version = f;
  bad_version[4] = 1;  // an older peer
  EXPECT_EQ(DecodeHello(bad_version).status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(DecodeHello(bad_version).status().message(),
              HasSubstr(absl::StrFormat("control protocol version 1; this build speaks %d",
                                        kControlProtocolVersion)));

  std::string bad_kind = f;
  bad_kind[6] = 99;
  EXPECT_THAT(DecodeHello(bad_kind).status().message(), HasSubstr("unknown kind 99"));
  bad_kind[6] = 0;
  EXPECT_THAT(PeekControlKind(bad_kind).status().message(), HasSubstr("unknown kind 0"));

  EXPECT_THAT(DecodeHello(f + "x").status().message(), HasSubstr("header says"));
  EXPECT_THAT(DecodeHello(f.substr(0, f.size() - 1)).status().message(), HasSubstr("header says"));

  // The right frame for the wrong decoder.
  EXPECT_THAT(DecodeStepPlan(f).status().message(), HasSubstr("expected StepPlan, got Hello"));
}

// Every strict prefix of every message (header fixed up to match) is InvalidArgument, and so
// is one trailing byte.
TEST(ControlProtocolTest, EveryTruncationIsInvalidArgument) {
  const std::vector<std::string> frames = {
      EncodeControl(SampleHello()), EncodeControl(SampleAck()), EncodeControl(SamplePlan()),
      EncodeControl(SampleReply()), EncodeControl(ShutdownMessage{"reason"})};
  for (const std::string& f : frames) {
    const ControlKind kind = *PeekControlKind(f);
    auto decode = [kind](std::string_view g) -> absl::Status {
      switch (kind) {
        case ControlKind::kHello:
          return DecodeHello(g).status();
        case ControlKind::kHelloAck:
          return DecodeHelloAck(g).status();
        case ControlKind::kStepPlan:
          return DecodeStepPlan(g).status();
        case ControlKind::kStepReply:
          return DecodeStepReply(g).status();
        case ControlKind::kShutdown:
          return DecodeShutdown(g).status();
      }
      return absl::InternalError("?");
    };
    ASSERT_TRUE(decode(f).ok()) << ControlKindName(kind);
    for (size_t n = 0; n < f.size(); ++n) {
      std::string g = f.substr(0, n);
      if (n >= kControlHeaderBytes) g = FixLength(g);
      const absl::Status s = decode(g);
      EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument)
          << ControlKindName(kind) << " prefix " << n << ": " << s;
    }
    const absl::Status trailing = decode(FixLength(f + std::string(1, '\0')));
    EXPECT_EQ(trailing.code(), absl::StatusCode::kInvalidArgument) << ControlKindName(kind);
    EXPECT_THAT(trailing.message(), HasSubstr("trailing"));
  }
}

// Offsets into a StepPlan payload (after the 16-byte header): step u64 at 0, op count u32
// at 8, first op kind u8 at 12.
TEST(ControlProtocolTest, MalformedStepPlan) {
  std::string f = EncodeControl(SamplePlan());
  {
    std::string g = f;
    const uint32_t huge = 0xffffffffu;
    std::memcpy(g.data() + 16 + 8, &huge, 4);
    EXPECT_THAT(DecodeStepPlan(g).status().message(), HasSubstr("above the limit"));
    const uint32_t many = 1000;
    std::memcpy(g.data() + 16 + 8, &many, 4);
    EXPECT_THAT(DecodeStepPlan(g).status().message(), HasSubstr("needs more bytes"));
  }
  {
    std::string g = f;
    g[16 + 12] = 7;
    EXPECT_THAT(DecodeStepPlan(g).status().message(), HasSubstr("unknown kind 7"));
  }
  {
    StepPlanMessage m;
    m.ops = {StepOp::Truncate(1, -4)};
    EXPECT_THAT(DecodeStepPlan(EncodeControl(m)).status().message(), HasSubstr("truncate to -4"));
  }
  {
    StepPlanMessage m;
    m.entries = {{1, false, {}}};
    EXPECT_THAT(DecodeStepPlan(EncodeControl(m)).status().message(), HasSubstr("no tokens"));
  }
  {
    StepPlanMessage m;
    m.entries = {{1, true, {3, 4, 5}, {-1, 0}}};
    EXPECT_THAT(DecodeStepPlan(EncodeControl(m)).status().message(),
                HasSubstr("2 parents for 3 tokens"));
    m.entries.clear();
    m.ops = {StepOp::KeepRows(1, 4, std::vector<int32_t>{})};
    EXPECT_THAT(DecodeStepPlan(EncodeControl(m)).status().message(),
                HasSubstr("keep 0 rows from 4"));
    m.ops = {StepOp::KeepRows(1, -1, std::vector<int32_t>{0})};
    EXPECT_THAT(DecodeStepPlan(EncodeControl(m)).status().message(),
                HasSubstr("keep 1 rows from -1"));
  }
  {
    StepPlanMessage m;
    m.entries = {{1, false, {3}}};
    std::string g = EncodeControl(m);
    // step(8) + op count(4) + entry count(4) + seq(8) -> all_logits byte.
    g[16 + 8 + 4 + 4 + 8] = 2;
    EXPECT_THAT(DecodeStepPlan(g).status().message(), HasSubstr("all_logits 2"));
    // Token count bigger than the bytes left.
    std::string h = EncodeControl(m);
    const uint32_t n = 5;
    std::memcpy(h.data() + 16 + 8 + 4 + 4 + 8 + 1, &n, 4);
    EXPECT_THAT(DecodeStepPlan(h).status().message(), HasSubstr("needs more bytes"));
  }
}

TEST(ControlProtocolTest, MalformedStepReply) {
  {
    StepReplyMessage m = SampleReply();
    m.logits.pop_back();  // 5 floats for 2 x 3
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(),
                HasSubstr("5 logits for 2 rows of vocab 3"));
  }
  {
    StepReplyMessage m = SampleReply();
    m.status_code = 99;
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(), HasSubstr("status code 99"));
  }
  {
    StepReplyMessage m = SampleReply();
    m.n_rows = -1;
    m.logits.clear();
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(), HasSubstr("negative size"));
  }
  {
    StepReplyMessage m = SampleReply();
    m.kv_available_bytes = -2;
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(), HasSubstr("KV bytes"));
    HelloAckMessage a = SampleAck();
    a.kv_page_tokens = -8;
    EXPECT_THAT(DecodeHelloAck(EncodeControl(a)).status().message(), HasSubstr("KV page geometry"));
  }
  {
    StepReplyMessage m = SampleReply();
    m.matched = {8, -1};
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(),
                HasSubstr("negative MatchPrefix count"));
    m = SampleReply();
    m.events[0].token_ids.pop_back();  // 5 token ids for 2 blocks of 3
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(),
                HasSubstr("events[0]: 5 token ids for 2 blocks of 3"));
    m = SampleReply();
    m.events[1].kind = static_cast<KvCacheEvent::Kind>(7);
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(),
                HasSubstr("events[1]: kind 7"));
    m = SampleReply();
    m.kv_cache_only_bytes = -5;
    EXPECT_THAT(DecodeStepReply(EncodeControl(m)).status().message(), HasSubstr("KV bytes"));
    HelloAckMessage a = SampleAck();
    std::string g = EncodeControl(a);
    // kv_prefix_cache: after version, fingerprint (24), ranks (12), capacity (8), heads (4),
    // page bytes (8), page tokens (4), pass boundary (4).
    g[16 + 4 + 24 + 12 + 8 + 4 + 8 + 4 + 4] = 2;
    EXPECT_THAT(DecodeHelloAck(g).status().message(), HasSubstr("kv_prefix_cache 2"));
    // kv_tree_passes (v6): the next byte.
    g = EncodeControl(a);
    g[16 + 4 + 24 + 12 + 8 + 4 + 8 + 4 + 4 + 1] = 3;
    EXPECT_THAT(DecodeHelloAck(g).status().message(), HasSubstr("kv_tree_passes 3"));
  }
  {
    // A logits count that claims far more floats than the frame holds.
    StepReplyMessage m;
    m.n_rows = int64_t{1} << 40;
    m.vocab = 1 << 20;
    EXPECT_EQ(DecodeStepReply(EncodeControl(m)).status().code(),
              absl::StatusCode::kInvalidArgument);
    m.n_rows = 1 << 20;
    m.vocab = 1 << 10;
    std::string g = EncodeControl(m);
    const uint64_t count = uint64_t{1} << 30;
    std::memcpy(g.data() + g.size() - 8, &count, 8);
    EXPECT_THAT(DecodeStepReply(g).status().message(), HasSubstr("truncated at logits"));
  }
  {
    HelloAckMessage a = SampleAck();
    a.tp_rank = 3;
    EXPECT_THAT(DecodeHelloAck(EncodeControl(a)).status().message(), HasSubstr("tp rank 3 of 3"));
    HelloMessage h = SampleHello();
    h.tp_size = 0;
    EXPECT_THAT(DecodeHello(EncodeControl(h)).status().message(), HasSubstr("tp_size 0"));
  }
  {
    std::string g = EncodeControl(ShutdownMessage{"x"});
    const uint32_t big = kMaxControlString + 1;
    std::memcpy(g.data() + 16, &big, 4);
    EXPECT_THAT(DecodeShutdown(g).status().message(), HasSubstr("limit"));
  }
}

// Random byte flips never crash; the result is either a message or InvalidArgument.
TEST(ControlProtocolTest, RandomCorruptionNeverCrashes) {
  std::mt19937 rng(7);
  const std::vector<std::string> frames = {
      EncodeControl(SamplePlan()), EncodeControl(SampleReply()), EncodeControl(SampleAck())};
  for (int it = 0; it < 3000; ++it) {
    std::string g = frames[it % frames.size()];
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) g[rng() % g.size()] = static_cast<char>(rng());
    for (const absl::Status& s :
         {DecodeStepPlan(g).status(), DecodeStepReply(g).status(), DecodeHelloAck(g).status(),
          DecodeHello(g).status(), DecodeShutdown(g).status()}) {
      EXPECT_TRUE(s.ok() || s.code() == absl::StatusCode::kInvalidArgument) << s;
    }
  }
}

TEST(ControlProtocolTest, KvFingerprint) {
  const KvFingerprint a = FingerprintLengths({{1, 10}, {2, 5}});
  EXPECT_EQ(a.tokens, 15);
  EXPECT_EQ(a, FingerprintLengths({{1, 10}, {2, 5}, {3, 0}}));  // zero lengths skipped
  EXPECT_NE(a, FingerprintLengths({{1, 5}, {2, 10}}));
  EXPECT_NE(a.hash, FingerprintLengths({{1, 10}, {2, 6}}).hash);
}

}  // namespace
}  // namespace specnode
