#include "node/serve/kv_event_publisher.h"

#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string_view>

#ifndef MSGPACK_NO_BOOST
#define MSGPACK_NO_BOOST  // header-only msgpack-cxx without Boost
#endif
#include <msgpack.hpp>
#include <zmq.hpp>

#include "absl/strings/str_cat.h"

namespace specnode {
namespace {

using Packer = msgpack::packer<msgpack::sbuffer>;

Packer& PackStr(Packer& p, std::string_view s) {
  return p.pack_str(static_cast<uint32_t>(s.size()))
      .pack_str_body(s.data(), static_cast<uint32_t>(s.size()));
}

// Non-negative integers as msgpack uint (as msgspec writes them), negative ones as int.
Packer& PackInt(Packer& p, int64_t v) {
  return v < 0 ? p.pack_int64(v) : p.pack_uint64(static_cast<uint64_t>(v));
}

// Always a msgpack float64 (0xcb): msgpack-cxx's pack_double writes a whole-number double as
// an integer, which typed decoders (Go, Rust) reject for vLLM's `ts: float`.
void PackFloat64(msgpack::sbuffer& buf, double d) {
  uint64_t bits;
  std::memcpy(&bits, &d, sizeof(bits));
  char out[9] = {static_cast<char>(0xcb)};
  for (int i = 8; i >= 1; --i, bits >>= 8) out[i] = static_cast<char>(bits & 0xff);
  buf.write(out, sizeof(out));
}

// One event: the tag, then the fields in vLLM's declaration order (each after its name when
// `map`: msgspec writes a tagged struct's map as {"type": tag, field: value, ...}).
void PackEvent(Packer& p, const KvCacheEvent& e, bool map) {
  auto head = [&](std::string_view tag, uint32_t fields) {
    if (map) {
      PackStr(p.pack_map(fields + 1), "type");
    } else {
      p.pack_array(fields + 1);
    }
    PackStr(p, tag);
  };
  auto key = [&](std::string_view k) -> Packer& { return map ? PackStr(p, k) : p; };
  auto hashes = [&] {
    key("block_hashes").pack_array(static_cast<uint32_t>(e.block_hashes.size()));
    for (uint64_t h : e.block_hashes) p.pack_uint64(h);
  };
  auto medium = [&] {
    e.medium.empty() ? key("medium").pack_nil() : PackStr(key("medium"), e.medium);
  };
  switch (e.kind) {
    case KvCacheEvent::Kind::kBlockStored:
      head("BlockStored", 7);
      hashes();
      e.parent_block_hash.has_value() ? key("parent_block_hash").pack_uint64(*e.parent_block_hash)
                                      : key("parent_block_hash").pack_nil();
      key("token_ids").pack_array(static_cast<uint32_t>(e.token_ids.size()));
      for (int32_t t : e.token_ids) PackInt(p, t);
      PackInt(key("block_size"), e.block_size);
      key("lora_id").pack_nil();
      medium();
      key("lora_name").pack_nil();
      return;
    case KvCacheEvent::Kind::kBlockRemoved:
      head("BlockRemoved", 2);
      hashes();
      medium();
      return;
    case KvCacheEvent::Kind::kAllBlocksCleared:
      head("AllBlocksCleared", 0);
      return;
  }
}

std::string BigEndian(uint64_t v) {
  std::string out(8, '\0');
  for (int i = 7; i >= 0; --i, v >>= 8) out[i] = static_cast<char>(v & 0xff);
  return out;
}

uint64_t FromBigEndian(const zmq::message_t& m) {
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  return v;
}

// Retries a part interrupted by a signal before it was queued (as Frontend::Send does).
void SendPart(zmq::socket_t& s, zmq::const_buffer b, zmq::send_flags f) {
  for (int attempt = 0;; ++attempt) {
    try {
      s.send(b, f);
      return;
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR || attempt >= 100) throw;
    }
  }
}

}  // namespace

std::string EncodeKvEventBatch(double ts, std::span<const KvCacheEvent> events,
                               std::optional<int> data_parallel_rank, KvEventEncoding encoding) {
  msgpack::sbuffer buf;
  Packer p(buf);
  p.pack_array(3);  // msgspec keeps a nil rank: omit_defaults does nothing to array_like
  PackFloat64(buf, ts);
  p.pack_array(static_cast<uint32_t>(events.size()));
  for (const KvCacheEvent& e : events) PackEvent(p, e, encoding == KvEventEncoding::kMap);
  data_parallel_rank.has_value() ? PackInt(p, *data_parallel_rank) : p.pack_nil();
  return std::string(buf.data(), buf.size());
}

KvEventPublisher::KvEventPublisher(KvEventPublisherOptions options)
    : options_(std::move(options)) {}

absl::StatusOr<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Start(
    KvEventPublisherOptions options) {
  if (options.buffer_batches < 0) return absl::InvalidArgumentError("buffer_batches < 0");
  if (options.batch_interval.count() < 0) return absl::InvalidArgumentError("batch_interval < 0");
  std::unique_ptr<KvEventPublisher> pub(new KvEventPublisher(std::move(options)));
  if (absl::Status s = pub->Bind(); !s.ok()) return s;
  try {
    pub->thread_ = std::thread([p = pub.get()] { p->Run(); });
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat("cannot start the KV event thread: ", e.what()));
  }
  return pub;
}

absl::Status KvEventPublisher::Bind() {
  auto bind = [this](zmq::socket_t& s, const std::string& endpoint, const char* what,
                     std::string* bound) -> absl::Status {
    if (endpoint.find("://") == std::string::npos) {
      return absl::InvalidArgumentError(absl::StrCat("malformed ", what, " '", endpoint, "'"));
    }
    try {
      s.bind(endpoint);
      *bound = s.get(zmq::sockopt::last_endpoint);
    } catch (const zmq::error_t& e) {
      const int n = e.num();
      const std::string msg = absl::StrCat("cannot bind ", what, " ", endpoint, ": ", e.what());
      if (n == EINVAL || n == EPROTONOSUPPORT || n == ENOCOMPATPROTO) {
        return absl::InvalidArgumentError(msg);
      }
      return absl::UnavailableError(msg);
    }
    return absl::OkStatus();
  };
  try {
    ctx_ = std::make_unique<zmq::context_t>(1);
    pub_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::pub);
    pub_->set(zmq::sockopt::linger, 500);
    pub_->set(zmq::sockopt::sndhwm, 100000);
    if (!options_.replay_endpoint.empty()) {
      replay_ = std::make_unique<zmq::socket_t>(*ctx_, zmq::socket_type::router);
      replay_->set(zmq::sockopt::linger, 500);
      // A whole replay fits in one client's pipe (the default of 1000 would drop the rest).
      replay_->set(zmq::sockopt::sndhwm,
                   static_cast<int>(std::min<int64_t>(options_.buffer_batches + 16, 1 << 30)));
    }
  } catch (const zmq::error_t& e) {
    return absl::InternalError(absl::StrCat("zmq setup: ", e.what()));
  }
  absl::Status s = bind(*pub_, options_.endpoint, "KV event endpoint", &endpoint_);
  if (s.ok() && replay_ != nullptr) {
    s = bind(*replay_, options_.replay_endpoint, "KV event replay endpoint", &replay_endpoint_);
  }
  if (!s.ok()) return s;
  wake_fd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
  if (wake_fd_ < 0) return absl::InternalError("eventfd failed");
  return absl::OkStatus();
}

KvEventPublisher::~KvEventPublisher() {
  if (thread_.joinable()) {
    {
      std::lock_guard lock(mu_);
      stop_ = true;
    }
    Wake();
    thread_.join();
  }
  replay_.reset();
  pub_.reset();
  ctx_.reset();  // waits out the sockets' linger
  if (wake_fd_ >= 0) close(wake_fd_);
}

void KvEventPublisher::Wake() {
  const uint64_t one = 1;
  [[maybe_unused]] ssize_t n = write(wake_fd_, &one, sizeof(one));
}

void KvEventPublisher::OnKvCacheEvent(KvCacheEvent event) {
  bool was_empty = false;
  {
    std::lock_guard lock(mu_);
    try {
      queue_.push_back(std::move(event));
    } catch (const std::exception&) {
      ++dropped_;
      return;
    }
    was_empty = queue_.size() == 1;
    if (was_empty) first_queued_ = std::chrono::steady_clock::now();
    ++queued_total_;
  }
  if (was_empty) Wake();  // the thread learns the batch's deadline
}

absl::Status KvEventPublisher::Flush(std::chrono::milliseconds timeout) {
  std::unique_lock lock(mu_);
  const int64_t target = queued_total_;
  if (published_total_ >= target) return absl::OkStatus();
  flush_target_ = std::max(flush_target_, target);
  Wake();
  if (!published_cv_.wait_for(lock, timeout, [&] { return published_total_ >= target; })) {
    return absl::DeadlineExceededError(
        absl::StrCat("KV events not published after ", timeout.count(), " ms"));
  }
  return absl::OkStatus();
}

int64_t KvEventPublisher::published_batches() const {
  std::lock_guard lock(mu_);
  return batches_;
}

int64_t KvEventPublisher::dropped_events() const {
  std::lock_guard lock(mu_);
  return dropped_;
}

void KvEventPublisher::Run() {
  zmq::pollitem_t items[] = {{nullptr, wake_fd_, ZMQ_POLLIN, 0},
                             {replay_ ? static_cast<void*>(*replay_) : nullptr, 0, ZMQ_POLLIN, 0}};
  const int n_items = replay_ ? 2 : 1;
  while (true) {
    std::vector<KvCacheEvent> batch;
    bool stopping = false;
    std::chrono::milliseconds wait(100);  // idle: sleep in poll, never spin
    {
      std::lock_guard lock(mu_);
      stopping = stop_;
      if (!queue_.empty()) {
        const auto now = std::chrono::steady_clock::now();
        const auto due = first_queued_ + options_.batch_interval;
        if (stop_ || flush_target_ > published_total_ || now >= due) {
          batch.swap(queue_);
        } else {
          wait = std::chrono::ceil<std::chrono::milliseconds>(due - now);
        }
      }
    }
    if (!batch.empty()) {
      PublishBatch(std::move(batch));
      continue;  // more may have come in meanwhile
    }
    if (stopping) return;  // nothing left to publish
    try {
      zmq::poll(items, n_items, wait);
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) std::fprintf(stderr, "kv events: zmq poll: %s\n", e.what());
      continue;
    }
    if (items[0].revents & ZMQ_POLLIN) {
      uint64_t n;
      [[maybe_unused]] ssize_t r = read(wake_fd_, &n, sizeof(n));
    }
    if (n_items == 2 && (items[1].revents & ZMQ_POLLIN)) ServiceReplay();
  }
}

void KvEventPublisher::PublishBatch(std::vector<KvCacheEvent> events) {
  const double ts =
      std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
  bool encoded = false;
  try {
    std::string payload =
        EncodeKvEventBatch(ts, events, options_.data_parallel_rank, options_.encoding);
    encoded = true;
    const uint64_t seq = next_seq_++;
    const std::string seq_bytes = BigEndian(seq);
    try {
      // PUB never blocks: past its high-water mark a slow subscriber loses the message (and
      // can ask for a replay).
      SendPart(*pub_, zmq::buffer(options_.topic), zmq::send_flags::sndmore);
      SendPart(*pub_, zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      SendPart(*pub_, zmq::buffer(payload), zmq::send_flags::none);
    } catch (const zmq::error_t& e) {
      std::fprintf(stderr, "kv events: publishing batch %llu: %s\n",
                   static_cast<unsigned long long>(seq), e.what());
    }
    if (options_.buffer_batches > 0) {
      buffer_.emplace_back(seq, std::move(payload));
      while (static_cast<int64_t>(buffer_.size()) > options_.buffer_batches) buffer_.pop_front();
    }
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kv events: %zu events lost: %s\n", events.size(), e.what());
  }
  std::lock_guard lock(mu_);
  published_total_ += static_cast<int64_t>(events.size());
  if (encoded) ++batches_;
  if (!encoded) dropped_ += static_cast<int64_t>(events.size());
  published_cv_.notify_all();
}

void KvEventPublisher::ServiceReplay() {
  std::vector<zmq::message_t> frames;
  for (int served = 0; served < 16; ++served) {  // what is ready, a few at a time
    frames.clear();
    try {
      zmq::message_t msg;
      if (!replay_->recv(msg, zmq::recv_flags::dontwait)) return;
      frames.push_back(std::move(msg));
      while (frames.back().more()) {
        frames.emplace_back();
        if (!replay_->recv(frames.back(), zmq::recv_flags::none)) break;
      }
      // REQ: [identity, "", start]; DEALER: [identity, start]. Anything else is ignored.
      const bool req = frames.size() == 3 && frames[1].size() == 0;
      if ((!req && frames.size() != 2) || frames.back().size() != 8) continue;
      const uint64_t start = FromBigEndian(frames.back());
      const std::string peer = frames[0].to_string();
      auto reply = [&](const std::string& seq_bytes, const std::string& payload) {
        SendPart(*replay_, zmq::buffer(peer), zmq::send_flags::sndmore);
        if (req) SendPart(*replay_, zmq::buffer("", 0), zmq::send_flags::sndmore);
        SendPart(*replay_, zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
        SendPart(*replay_, zmq::buffer(payload), zmq::send_flags::none);
      };
      for (const auto& [seq, payload] : buffer_) {
        if (seq >= start) reply(BigEndian(seq), payload);
      }
      reply(BigEndian(~uint64_t{0}), "");  // -1: the end marker
    } catch (const zmq::error_t& e) {
      if (e.num() != EINTR) std::fprintf(stderr, "kv events: replay: %s\n", e.what());
    } catch (const std::exception& e) {
      std::fprintf(stderr, "kv events: replay: %s\n", e.what());
    }
  }
}

}  // namespace specnode
