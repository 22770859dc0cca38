// The KV-event publisher: the msgpack batch decodes element by element to vLLM's layout
// (both event encodings), and a live PUB+ROUTER pair on 127.0.0.1 publishes
// [topic, seq, payload] in order, replays from a seq with the -1 end marker, ignores a
// malformed replay request, flushes on destruction, and refuses bad endpoints.
#include "node/serve/kv_event_publisher.h"

#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST
#endif
#include <msgpack.hpp>
#include <zmq.hpp>

#include "gtest/gtest.h"

namespace specnode {
namespace {

using std::chrono::milliseconds;
using Type = msgpack::type::object_type;
using Kind = KvCacheEvent::Kind;

KvCacheEvent Event(Kind kind, std::vector<uint64_t> hashes, std::string medium) {
  KvCacheEvent e;
  e.kind = kind;
  e.block_hashes = std::move(hashes);
  e.medium = std::move(medium);
  return e;
}

KvCacheEvent Stored(std::vector<uint64_t> hashes, std::optional<uint64_t> parent) {
  KvCacheEvent e = Event(Kind::kBlockStored, std::move(hashes), "CPU");
  e.parent_block_hash = parent;
  e.block_size = 2;
  for (size_t i = 0; i < 2 * e.block_hashes.size(); ++i) e.token_ids.push_back(100 + i);
  return e;
}

KvCacheEvent Removed(std::vector<uint64_t> hashes, std::string medium) {
  return Event(Kind::kBlockRemoved, std::move(hashes), std::move(medium));
}

KvCacheEvent Cleared() { return Event(Kind::kAllBlocksCleared, {}, ""); }

std::string AsStr(const msgpack::object& o) {
  EXPECT_EQ(o.type, Type::STR);
  return o.type == Type::STR ? std::string(o.via.str.ptr, o.via.str.size) : "";
}

void ExpectUints(const msgpack::object& o, const std::vector<uint64_t>& want) {
  ASSERT_EQ(o.type, Type::ARRAY);
  ASSERT_EQ(o.via.array.size, want.size());
  for (size_t i = 0; i < want.size(); ++i) {
    EXPECT_EQ(o.via.array.ptr[i].type, Type::POSITIVE_INTEGER);
    EXPECT_EQ(o.via.array.ptr[i].via.u64, want[i]);
  }
}

// The batch's events array, after checking the envelope [ts, events(, rank)].
const msgpack::object& Events(const msgpack::object& batch, double ts, std::optional<int> rank) {
  EXPECT_EQ(batch.type, Type::ARRAY);
  EXPECT_EQ(batch.via.array.size, 3u);  // a nil rank is still sent (as msgspec does)
  EXPECT_EQ(batch.via.array.ptr[0].type, Type::FLOAT64);
  EXPECT_EQ(batch.via.array.ptr[0].via.f64, ts);
  if (rank.has_value()) {
    EXPECT_EQ(batch.via.array.ptr[2].type, Type::POSITIVE_INTEGER);
    EXPECT_EQ(batch.via.array.ptr[2].via.u64, static_cast<uint64_t>(*rank));
  } else {
    EXPECT_EQ(batch.via.array.ptr[2].type, Type::NIL);
  }
  EXPECT_EQ(batch.via.array.ptr[1].type, Type::ARRAY);
  return batch.via.array.ptr[1];
}

TEST(KvEventEncodingTest, BlockStoredWithParentAndRankIsEightElementTaggedArray) {
  const std::vector<KvCacheEvent> events = {Stored({(1ull << 62) + 7, 9}, 42)};
  const std::string bytes = EncodeKvEventBatch(1700000000.25, events, 3);
  msgpack::object_handle h = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& evs = Events(h.get(), 1700000000.25, 3);
  ASSERT_EQ(evs.via.array.size, 1u);
  const msgpack::object& e = evs.via.array.ptr[0];
  ASSERT_EQ(e.type, Type::ARRAY);
  ASSERT_EQ(e.via.array.size, 8u);
  const msgpack::object* f = e.via.array.ptr;
  EXPECT_EQ(AsStr(f[0]), "BlockStored");
  ExpectUints(f[1], {(1ull << 62) + 7, 9});
  ASSERT_EQ(f[2].type, Type::POSITIVE_INTEGER);
  EXPECT_EQ(f[2].via.u64, 42u);
  ExpectUints(f[3], {100, 101, 102, 103});
  ASSERT_EQ(f[4].type, Type::POSITIVE_INTEGER);
  EXPECT_EQ(f[4].via.u64, 2u);
  EXPECT_EQ(f[5].type, Type::NIL);  // lora_id
  EXPECT_EQ(AsStr(f[6]), "CPU");
  EXPECT_EQ(f[7].type, Type::NIL);  // lora_name
}

TEST(KvEventEncodingTest, BlockStoredWithoutParentOrRankHasNilParentAndNilRank) {
  KvCacheEvent stored = Stored({5}, std::nullopt);
  stored.token_ids = {0, -1};  // a negative id is a signed integer
  const std::vector<KvCacheEvent> events = {stored};
  const std::string bytes = EncodeKvEventBatch(2.5, events, std::nullopt);
  msgpack::object_handle h = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& evs = Events(h.get(), 2.5, std::nullopt);
  ASSERT_EQ(evs.via.array.size, 1u);
  const msgpack::object* f = evs.via.array.ptr[0].via.array.ptr;
  ASSERT_EQ(evs.via.array.ptr[0].via.array.size, 8u);
  EXPECT_EQ(AsStr(f[0]), "BlockStored");
  ExpectUints(f[1], {5});
  EXPECT_EQ(f[2].type, Type::NIL);
  ASSERT_EQ(f[3].via.array.size, 2u);
  EXPECT_EQ(f[3].via.array.ptr[0].type, Type::POSITIVE_INTEGER);
  EXPECT_EQ(f[3].via.array.ptr[1].type, Type::NEGATIVE_INTEGER);
  EXPECT_EQ(f[3].via.array.ptr[1].via.i64, -1);
}

TEST(KvEventEncodingTest, BlockRemovedAndAllBlocksClearedAreShortTaggedArrays) {
  const std::vector<KvCacheEvent> events = {Removed({3, 4}, "GPU"), Removed({8}, ""), Cleared()};
  const std::string bytes = EncodeKvEventBatch(0.0, events, 0);
  EXPECT_EQ(static_cast<uint8_t>(bytes[1]), 0xcb);  // a whole-number ts is still a float64
  msgpack::object_handle h = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& evs = Events(h.get(), 0.0, 0);
  ASSERT_EQ(evs.via.array.size, 3u);
  const msgpack::object& r = evs.via.array.ptr[0];
  ASSERT_EQ(r.via.array.size, 3u);
  EXPECT_EQ(AsStr(r.via.array.ptr[0]), "BlockRemoved");
  ExpectUints(r.via.array.ptr[1], {3, 4});
  EXPECT_EQ(AsStr(r.via.array.ptr[2]), "GPU");
  EXPECT_EQ(evs.via.array.ptr[1].via.array.ptr[2].type, Type::NIL);  // no medium
  const msgpack::object& c = evs.via.array.ptr[2];
  ASSERT_EQ(c.type, Type::ARRAY);
  ASSERT_EQ(c.via.array.size, 1u);
  EXPECT_EQ(AsStr(c.via.array.ptr[0]), "AllBlocksCleared");
}

TEST(KvEventEncodingTest, MapEncodingNamesTheFieldsAfterTheTypeTag) {
  const std::vector<KvCacheEvent> events = {Stored({1}, 7), Removed({1}, "CPU"), Cleared()};
  const std::string bytes = EncodeKvEventBatch(1.0, events, std::nullopt, KvEventEncoding::kMap);
  msgpack::object_handle h = msgpack::unpack(bytes.data(), bytes.size());
  const msgpack::object& evs = Events(h.get(), 1.0, std::nullopt);
  ASSERT_EQ(evs.via.array.size, 3u);
  const std::vector<std::vector<std::string>> keys = {
      {"type", "block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium",
       "lora_name"},
      {"type", "block_hashes", "medium"},
      {"type"}};
  const char* tags[] = {"BlockStored", "BlockRemoved", "AllBlocksCleared"};
  for (size_t i = 0; i < 3; ++i) {
    const msgpack::object& m = evs.via.array.ptr[i];
    ASSERT_EQ(m.type, Type::MAP);
    ASSERT_EQ(m.via.map.size, keys[i].size());
    for (size_t k = 0; k < keys[i].size(); ++k) EXPECT_EQ(AsStr(m.via.map.ptr[k].key), keys[i][k]);
    EXPECT_EQ(AsStr(m.via.map.ptr[0].val), tags[i]);
  }
  EXPECT_EQ(evs.via.array.ptr[0].via.map.ptr[2].val.via.u64, 7u);
}

// Writes sample batches for tests/serve/kv_events_decode.py to check (a manual check:
// SPECNODE_KV_EVENTS_DUMP=/tmp/dir).
TEST(KvEventEncodingTest, DumpsSamplesWhenAsked) {
  const char* dir = std::getenv("SPECNODE_KV_EVENTS_DUMP");
  if (dir == nullptr) GTEST_SKIP() << "SPECNODE_KV_EVENTS_DUMP not set";
  const std::vector<KvCacheEvent> events = {Stored({11, 12}, 10), Stored({20}, std::nullopt),
                                            Removed({11}, "CPU"), Removed({12}, ""), Cleared()};
  std::ofstream(std::string(dir) + "/array_rank.bin", std::ios::binary)
      << EncodeKvEventBatch(1.5, events, 2);
  std::ofstream(std::string(dir) + "/array.bin", std::ios::binary)
      << EncodeKvEventBatch(1.5, events, std::nullopt);
  std::ofstream(std::string(dir) + "/map_rank.bin", std::ios::binary)
      << EncodeKvEventBatch(1.5, events, 2, KvEventEncoding::kMap);
}

struct Published {
  std::string topic;
  uint64_t seq = 0;
  std::string payload;
};

uint64_t Be64(const zmq::message_t& m) {
  uint64_t v = 0;
  for (size_t i = 0; i < m.size(); ++i) v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  return v;
}

std::string Be64(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) s[i] = static_cast<char>(v & 0xff);
  return s;
}

std::vector<zmq::message_t> RecvMulti(zmq::socket_t& s, milliseconds timeout) {
  std::vector<zmq::message_t> parts;
  zmq::pollitem_t item = {static_cast<void*>(s), 0, ZMQ_POLLIN, 0};
  if (zmq::poll(&item, 1, timeout) <= 0) return parts;
  do {
    parts.emplace_back();
    (void)s.recv(parts.back());
  } while (parts.back().more());
  return parts;
}

std::optional<Published> RecvPub(zmq::socket_t& sub, milliseconds timeout) {
  std::vector<zmq::message_t> parts = RecvMulti(sub, timeout);
  if (parts.empty()) return std::nullopt;
  EXPECT_EQ(parts.size(), 3u);
  EXPECT_EQ(parts[1].size(), 8u);
  if (parts.size() != 3) return std::nullopt;
  return Published{parts[0].to_string(), Be64(parts[1]), parts[2].to_string()};
}

size_t EventCount(const std::string& payload) {
  msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
  return h.get().via.array.ptr[1].via.array.size;
}

// ZeroMQ's slow joiner: a SUB misses what is published before its subscription reaches the
// PUB. Probes (AllBlocksCleared) go out until one arrives; returns once the newest probe
// has, so that the next batch received is the next one published.
void Join(KvEventPublisher& pub, zmq::socket_t& sub) {
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (std::chrono::steady_clock::now() < deadline) {
    pub.OnKvCacheEvent(Cleared());
    ASSERT_TRUE(pub.Flush(milliseconds(5000)).ok());
    const uint64_t last = static_cast<uint64_t>(pub.published_batches() - 1);
    while (std::optional<Published> p = RecvPub(sub, milliseconds(100))) {
      if (p->seq == last) return;
    }
  }
  FAIL() << "the subscriber never received a probe";
}

class LivePublisherTest : public ::testing::Test {
 protected:
  void StartPublisher(KvEventPublisherOptions o = {}) {
    o.endpoint = "tcp://127.0.0.1:0";
    o.replay_endpoint = "tcp://127.0.0.1:0";
    o.topic = "kv-events";
    auto p = KvEventPublisher::Start(std::move(o));
    ASSERT_TRUE(p.ok()) << p.status();
    pub_ = std::move(p).value();
    ASSERT_NE(pub_->endpoint(), "tcp://127.0.0.1:0");
    sub_.set(zmq::sockopt::linger, 0);
    sub_.set(zmq::sockopt::subscribe, "kv-events");
    sub_.connect(pub_->endpoint());
    dealer_.set(zmq::sockopt::linger, 0);
    dealer_.connect(pub_->replay_endpoint());
  }

  // A DEALER's replay from `start`: (seq, payload) up to and including the end marker.
  std::vector<std::pair<uint64_t, std::string>> Replay(uint64_t start) {
    dealer_.send(zmq::buffer(Be64(start)), zmq::send_flags::none);
    std::vector<std::pair<uint64_t, std::string>> got;
    while (true) {
      std::vector<zmq::message_t> parts = RecvMulti(dealer_, milliseconds(10000));
      if (parts.size() != 2) {
        ADD_FAILURE() << "replay reply of " << parts.size() << " parts";
        return got;
      }
      got.emplace_back(Be64(parts[0]), parts[1].to_string());
      if (got.back().first == ~uint64_t{0}) return got;
    }
  }

  zmq::context_t ctx_{1};
  zmq::socket_t sub_{ctx_, zmq::socket_type::sub};
  zmq::socket_t dealer_{ctx_, zmq::socket_type::dealer};
  std::unique_ptr<KvEventPublisher> pub_;
};

TEST_F(LivePublisherTest, PublishesTopicSeqPayloadInOrderAndReplaysFromASeq) {
  StartPublisher();
  Join(*pub_, sub_);
  const uint64_t first = static_cast<uint64_t>(pub_->published_batches());
  for (int i = 0; i < 3; ++i) {
    pub_->OnKvCacheEvent(Stored({static_cast<uint64_t>(i + 1)}, std::nullopt));
    ASSERT_TRUE(pub_->Flush(milliseconds(5000)).ok());
  }
  for (uint64_t i = 0; i < 3; ++i) {
    std::optional<Published> p = RecvPub(sub_, milliseconds(10000));
    ASSERT_TRUE(p.has_value());
    EXPECT_EQ(p->topic, "kv-events");
    EXPECT_EQ(p->seq, first + i);
    EXPECT_EQ(EventCount(p->payload), 1u);
  }
  // seq starts at 0 (the first probe), one per batch, and a replay returns every batch.
  auto all = Replay(0);
  ASSERT_EQ(all.size(), first + 3 + 1);
  for (uint64_t i = 0; i < first + 3; ++i) EXPECT_EQ(all[i].first, i);
  auto from = Replay(first + 1);
  ASSERT_EQ(from.size(), 3u);
  EXPECT_EQ(from[0].first, first + 1);
  EXPECT_EQ(from[1].first, first + 2);
  EXPECT_EQ(from[1].second, all[first + 2].second);
  EXPECT_EQ(from[2].first, ~uint64_t{0});  // -1, 8 bytes big-endian signed
  EXPECT_EQ(from[2].second, "");
}

TEST_F(LivePublisherTest, ReqReplayPastTheLastGetsOnlyTheEndMarker) {
  StartPublisher();
  pub_->OnKvCacheEvent(Cleared());
  ASSERT_TRUE(pub_->Flush(milliseconds(5000)).ok());
  zmq::socket_t req(ctx_, zmq::socket_type::req);
  req.set(zmq::sockopt::linger, 0);
  req.connect(pub_->replay_endpoint());
  req.send(zmq::buffer(Be64(5)), zmq::send_flags::none);
  std::vector<zmq::message_t> parts = RecvMulti(req, milliseconds(10000));
  ASSERT_EQ(parts.size(), 2u);
  EXPECT_EQ(parts[0].to_string(), std::string(8, '\xff'));
  EXPECT_EQ(parts[1].size(), 0u);
}

TEST_F(LivePublisherTest, MalformedReplayRequestIsIgnored) {
  StartPublisher();
  pub_->OnKvCacheEvent(Cleared());
  ASSERT_TRUE(pub_->Flush(milliseconds(5000)).ok());
  dealer_.send(zmq::buffer(std::string("abc")), zmq::send_flags::none);
  EXPECT_TRUE(RecvMulti(dealer_, milliseconds(300)).empty());
  auto got = Replay(0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].first, 0u);
  EXPECT_EQ(got[1].first, ~uint64_t{0});
}

TEST_F(LivePublisherTest, QueuedEventsGatherIntoOneBatchUntilFlushed) {
  KvEventPublisherOptions o;
  o.batch_interval = milliseconds(3600 * 1000);
  StartPublisher(o);
  for (int i = 0; i < 5; ++i) pub_->OnKvCacheEvent(Removed({static_cast<uint64_t>(i)}, "CPU"));
  ASSERT_TRUE(pub_->Flush(milliseconds(5000)).ok());
  EXPECT_EQ(pub_->published_batches(), 1);
  auto got = Replay(0);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(EventCount(got[0].second), 5u);
}

TEST_F(LivePublisherTest, EventsFromSeveralThreadsAllArrive) {
  StartPublisher();
  Join(*pub_, sub_);
  constexpr int kThreads = 4, kEach = 250;
  std::vector<std::thread> threads;
  for (int t = 0; t < kThreads; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < kEach; ++i) {
        pub_->OnKvCacheEvent(Stored({static_cast<uint64_t>(t * kEach + i + 1)}, std::nullopt));
      }
    });
  }
  for (std::thread& t : threads) t.join();
  ASSERT_TRUE(pub_->Flush(milliseconds(10000)).ok());
  size_t events = 0;
  while (events < kThreads * kEach) {
    std::optional<Published> p = RecvPub(sub_, milliseconds(10000));
    ASSERT_TRUE(p.has_value()) << "got " << events << " events";
    events += EventCount(p->payload);
  }
  EXPECT_EQ(events, static_cast<size_t>(kThreads * kEach));
  EXPECT_EQ(pub_->dropped_events(), 0);
}

TEST_F(LivePublisherTest, DestructorPublishesWhatIsQueued) {
  KvEventPublisherOptions o;
  o.batch_interval = milliseconds(3600 * 1000);
  StartPublisher(o);
  Join(*pub_, sub_);
  for (int i = 0; i < 3; ++i) pub_->OnKvCacheEvent(Removed({static_cast<uint64_t>(i)}, "GPU"));
  pub_.reset();
  std::optional<Published> p = RecvPub(sub_, milliseconds(10000));
  ASSERT_TRUE(p.has_value());
  EXPECT_EQ(EventCount(p->payload), 3u);
}

TEST(KvEventPublisherStartTest, AddressInUseIsUnavailable) {
  KvEventPublisherOptions o;
  o.endpoint = "tcp://127.0.0.1:0";
  auto first = KvEventPublisher::Start(o);
  ASSERT_TRUE(first.ok()) << first.status();
  o.endpoint = (*first)->endpoint();
  auto second = KvEventPublisher::Start(o);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find(o.endpoint), std::string::npos);
  o.endpoint = "tcp://127.0.0.1:0";
  o.replay_endpoint = (*first)->endpoint();
  auto replay = KvEventPublisher::Start(o);
  EXPECT_EQ(replay.status().code(), absl::StatusCode::kUnavailable) << replay.status();
}

TEST(KvEventPublisherStartTest, GarbageEndpointIsInvalidArgument) {
  for (const char* bad : {"not-an-endpoint", "tcp://127.0.0.1:notaport", "bogus://x:1", ""}) {
    KvEventPublisherOptions o;
    o.endpoint = bad;
    auto p = KvEventPublisher::Start(o);
    EXPECT_EQ(p.status().code(), absl::StatusCode::kInvalidArgument) << bad << ": " << p.status();
  }
}

}  // namespace
}  // namespace specnode
