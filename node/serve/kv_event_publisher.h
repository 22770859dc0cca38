// Puts a KV cache's events (model/llama/kv_cache_events.h) on the wire the way vLLM's
// ZmqEventPublisher does (vllm/distributed/kv_events.py), so that KV-aware routers written
// for vLLM (llm-d's prefix-cache scorer, Dynamo's KV router) can follow this node's cache.
//
// Transport (ZeroMQ). A PUB socket bound at `endpoint` sends one 3-part message per batch:
//   [topic (the option's bytes, may be empty),
//    seq (uint64, 8 bytes big-endian; 0 for the first batch, +1 per batch),
//    payload (the msgpack batch below)]
// An optional ROUTER socket bound at `replay_endpoint` serves replays. A client (REQ or
// DEALER) sends one frame: the first seq it wants, 8 bytes big-endian unsigned. It gets one
// message [seq (8 bytes BE), payload] per buffered batch with seq >= start, oldest first,
// then the end marker [-1 as 8 bytes BE signed (ff x 8), empty frame]. A start past the
// newest batch gets the marker alone. A request whose frame is not 8 bytes is ignored
// (nothing is sent: a REQ client must give up on it). Only the last `buffer_batches`
// batches are kept.
//
// Payload (msgpack, as vLLM's msgspec structs encode it; "uint" means a msgpack unsigned
// integer, "nil" msgpack nil). The batch is always an array:
//   [ts (float64, 0xcb even when whole: seconds since the Unix epoch), events (array),
//    data_parallel_rank (uint | nil)]  -- always 3 elements: msgspec's omit_defaults has no
//                                         effect on array_like structs (msgspec #720)
// Each event, with KvEventEncoding::kArray (vLLM up to 0.23, tag first):
//   ["BlockStored", block_hashes [uint...], parent_block_hash (uint | nil),
//    token_ids [int...], block_size (uint), lora_id (nil), medium (str | nil),
//    lora_name (nil)]     -- 8 elements, vLLM's schema before extra_keys; msgspec decoders
//                            of later vLLM fill the missing trailing fields with defaults
//   ["BlockRemoved", block_hashes [uint...], medium (str | nil)]
//   ["AllBlocksCleared"]
// With KvEventEncoding::kMap (vLLM after PR #42892, "type" first, then the same fields by
// name in the same order, e.g. {"type": "BlockRemoved", "block_hashes": [...],
// "medium": "GPU"}); fields newer vLLM has defaults for (extra_keys, group_idx,
// kv_cache_spec_*) are left out, as omit_defaults does for maps: byte for byte what msgspec
// writes. An empty medium is sent as nil.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "model/llama/kv_cache_events.h"

namespace zmq {
class context_t;
class socket_t;
}  // namespace zmq

namespace specnode {

enum class KvEventEncoding {
  kArray,  // each event a tagged array (vLLM <= 0.23; what most routers decode)
  kMap,    // each event a tagged map (current vLLM; newer routers decode both)
};

// "array" or "map" (serve.kv_events_encoding, --kv-events-encoding); nullopt otherwise.
inline std::optional<KvEventEncoding> ParseKvEventEncoding(std::string_view name) {
  if (name == "array") return KvEventEncoding::kArray;
  if (name == "map") return KvEventEncoding::kMap;
  return std::nullopt;
}

// The msgpack bytes of one batch (layout above). Pure; never throws except std::bad_alloc.
std::string EncodeKvEventBatch(double ts, std::span<const KvCacheEvent> events,
                               std::optional<int> data_parallel_rank,
                               KvEventEncoding encoding = KvEventEncoding::kArray);

struct KvEventPublisherOptions {
  // ZeroMQ address the PUB socket binds, e.g. "tcp://127.0.0.1:5557" or "tcp://*:5557"; a
  // port of 0 or * picks a free one (see endpoint()).
  std::string endpoint = "tcp://*:5557";
  // Address the replay ROUTER socket binds; empty: no replay socket.
  std::string replay_endpoint;
  std::string topic;                      // first frame of every published message
  int64_t buffer_batches = 10000;         // batches kept for replay (0: none)
  std::optional<int> data_parallel_rank;  // sent in every batch when set
  // How long events gather into one batch, from the first event queued into an empty queue
  // to its publication. 0: publish as soon as the publisher thread wakes.
  std::chrono::milliseconds batch_interval{10};
  KvEventEncoding encoding = KvEventEncoding::kArray;
};

// Owns a ZeroMQ context, its PUB (and ROUTER) socket and one publisher thread that alone
// touches the sockets. OnKvCacheEvent, Flush and the accessors may be called from any
// thread; nothing on the caller's thread waits for the network.
class KvEventPublisher : public KvCacheEventListener {
 public:
  // Binds the sockets and starts the thread. A malformed endpoint (or option) gives
  // InvalidArgument; an address that cannot be bound (in use, no such interface) gives
  // Unavailable naming it.
  static absl::StatusOr<std::unique_ptr<KvEventPublisher>> Start(KvEventPublisherOptions options);

  // Publishes what is still queued, stops the thread and closes the sockets (ZeroMQ keeps
  // trying to deliver sent messages for up to 500 ms).
  ~KvEventPublisher() override;

  KvEventPublisher(const KvEventPublisher&) = delete;
  KvEventPublisher& operator=(const KvEventPublisher&) = delete;

  // Queues the event for the next batch (under a mutex; never blocks on the network).
  void OnKvCacheEvent(KvCacheEvent event) override;

  // Waits until every event queued before the call has been published (sent on the PUB
  // socket and kept for replay), cutting the current batch short. DeadlineExceeded if that
  // takes longer than `timeout`.
  absl::Status Flush(std::chrono::milliseconds timeout);

  int64_t published_batches() const;  // batches sent so far (the next batch's seq)
  int64_t dropped_events() const;     // events lost to a failed allocation or encoding
  // The addresses actually bound (ZMQ_LAST_ENDPOINT: a wildcard port resolved); replay is
  // empty without a replay socket.
  const std::string& endpoint() const { return endpoint_; }
  const std::string& replay_endpoint() const { return replay_endpoint_; }

 private:
  explicit KvEventPublisher(KvEventPublisherOptions options);
  absl::Status Bind();
  void Wake();
  void Run();  // the publisher thread
  void PublishBatch(std::vector<KvCacheEvent> events);
  void ServiceReplay();

  const KvEventPublisherOptions options_;
  std::string endpoint_;
  std::string replay_endpoint_;
  std::unique_ptr<zmq::context_t> ctx_;
  std::unique_ptr<zmq::socket_t> pub_;
  std::unique_ptr<zmq::socket_t> replay_;
  int wake_fd_ = -1;  // eventfd: wakes the thread's poll

  mutable std::mutex mu_;
  std::condition_variable published_cv_;
  std::vector<KvCacheEvent> queue_;                     // guarded by mu_
  std::chrono::steady_clock::time_point first_queued_;  // guarded by mu_: of queue_[0]
  int64_t queued_total_ = 0;                            // guarded by mu_: events ever queued
  int64_t published_total_ = 0;  // guarded by mu_: events ever published (or dropped)
  int64_t flush_target_ = 0;     // guarded by mu_: publish at once up to this count
  int64_t batches_ = 0;          // guarded by mu_
  int64_t dropped_ = 0;          // guarded by mu_
  bool stop_ = false;            // guarded by mu_

  // Publisher thread only.
  std::deque<std::pair<uint64_t, std::string>> buffer_;  // (seq, payload), oldest first
  uint64_t next_seq_ = 0;
  std::thread thread_;
};

}  // namespace specnode
