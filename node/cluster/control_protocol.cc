#include "node/cluster/control_protocol.h"

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <type_traits>

#include "absl/strings/str_format.h"
#include "model/status_macros.h"

namespace specnode {
namespace {

static_assert(std::endian::native == std::endian::little,
              "the control protocol is little-endian and encoded by memcpy");

class Writer {
 public:
  template <typename T>
  void Put(T v) {
    static_assert(std::is_trivially_copyable_v<T>);
    const size_t at = out_.size();
    out_.resize(at + sizeof(T));
    std::memcpy(out_.data() + at, &v, sizeof(T));
  }
  void PutString(std::string_view s) {
    Put<uint32_t>(static_cast<uint32_t>(s.size()));
    out_.append(s);
  }
  template <typename T>
  void PutArray(const T* data, size_t n) {
    const size_t at = out_.size();
    out_.resize(at + n * sizeof(T));
    if (n > 0) std::memcpy(out_.data() + at, data, n * sizeof(T));
  }
  // Header + payload.
  std::string Finish(ControlKind kind) const {
    Writer h;
    h.Put<uint32_t>(kControlMagic);
    h.Put<uint16_t>(kControlProtocolVersion);
    h.Put<uint16_t>(static_cast<uint16_t>(kind));
    h.Put<uint64_t>(out_.size());
    return h.out_ + out_;
  }

 private:
  std::string out_;
};

// Reads a payload; the first failure sticks (later reads return zeros) and names the field.
class Reader {
 public:
  explicit Reader(std::string_view payload) : in_(payload) {}

  template <typename T>
  T Get(const char* what) {
    T v{};
    if (!Need(sizeof(T), what)) return v;
    std::memcpy(&v, in_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }
  std::string GetString(const char* what) {
    const uint32_t n = Get<uint32_t>(what);
    if (!status_.ok()) return {};
    if (n > kMaxControlString) {
      Fail(absl::StrFormat("%s: string of %d bytes (limit %d)", what, n, kMaxControlString));
      return {};
    }
    if (!Need(n, what)) return {};
    std::string s(in_.substr(pos_, n));
    pos_ += n;
    return s;
  }
  // A u32 count whose elements take at least `min_elem_bytes` each: checked against the
  // limit and the bytes left before anything is allocated.
  uint32_t GetCount(const char* what, uint32_t limit, size_t min_elem_bytes) {
    const uint32_t n = Get<uint32_t>(what);
    if (!status_.ok()) return 0;
    if (n > limit) {
      Fail(absl::StrFormat("%s: count %d above the limit %d", what, n, limit));
      return 0;
    }
    if (static_cast<uint64_t>(n) * min_elem_bytes > in_.size() - pos_) {
      Fail(absl::StrFormat("%s: count %d needs more bytes than the %d left", what, n,
                           in_.size() - pos_));
      return 0;
    }
    return n;
  }
  template <typename T>
  void GetArray(T* out, size_t n, const char* what) {
    if (!Need(n * sizeof(T), what)) return;
    if (n > 0) std::memcpy(out, in_.data() + pos_, n * sizeof(T));
    pos_ += n * sizeof(T);
  }
  void Fail(std::string message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError("control message: " + message);
  }
  // OK when every read succeeded and the payload is used up.
  absl::Status Done() {
    if (status_.ok() && pos_ != in_.size()) {
      Fail(absl::StrFormat("%d trailing bytes", in_.size() - pos_));
    }
    return status_;
  }
  bool ok() const { return status_.ok(); }
  size_t left() const { return in_.size() - pos_; }

 private:
  bool Need(size_t n, const char* what) {
    if (!status_.ok()) return false;
    if (n > in_.size() - pos_) {
      Fail(
          absl::StrFormat("truncated at %s (needs %d bytes, %d left)", what, n, in_.size() - pos_));
      return false;
    }
    return true;
  }

  std::string_view in_;
  size_t pos_ = 0;
  absl::Status status_;
};

void PutFingerprint(Writer& w, const ModelFingerprint& f) {
  w.Put<uint64_t>(f.file_bytes);
  w.Put<uint64_t>(f.tensor_count);
  w.Put<int32_t>(f.vocab_size);
  w.Put<int32_t>(f.n_layers);
}

ModelFingerprint GetFingerprint(Reader& r) {
  ModelFingerprint f;
  f.file_bytes = r.Get<uint64_t>("model.file_bytes");
  f.tensor_count = r.Get<uint64_t>("model.tensor_count");
  f.vocab_size = r.Get<int32_t>("model.vocab_size");
  f.n_layers = r.Get<int32_t>("model.n_layers");
  return f;
}

bool ValidStatusCode(int32_t code) { return code >= 0 && code <= 16; }

bool OpHasTokens(StepOp::Kind k) {
  return k == StepOp::Kind::kMatchPrefix || k == StepOp::Kind::kPublishPrefix ||
         k == StepOp::Kind::kKeepRows;
}

// A u32 count, then that many values of T (a list's elements after GetCount's checks).
template <typename T>
void PutList(Writer& w, const std::vector<T>& v) {
  w.Put<uint32_t>(static_cast<uint32_t>(v.size()));
  w.PutArray(v.data(), v.size());
}
template <typename T>
std::vector<T> GetList(Reader& r, const char* what, uint32_t limit) {
  const uint32_t n = r.GetCount(what, limit, sizeof(T));
  std::vector<T> v;
  if (!r.ok()) return v;
  v.resize(n);
  r.GetArray(v.data(), n, what);
  return v;
}

// KvCacheEvent on the wire: kind u8 (0 BlockStored, 1 BlockRemoved, 2 AllBlocksCleared);
// block hashes u64...; has_parent u8 + parent u64; token ids i32...; block_size i32; medium.
constexpr size_t kMinEventBytes = 1 + 4 + 1 + 8 + 4 + 4 + 4;

void PutEvent(Writer& w, const KvCacheEvent& e) {
  w.Put<uint8_t>(static_cast<uint8_t>(e.kind));
  PutList(w, e.block_hashes);
  w.Put<uint8_t>(e.parent_block_hash.has_value() ? 1 : 0);
  w.Put<uint64_t>(e.parent_block_hash.value_or(0));
  PutList(w, e.token_ids);
  w.Put<int32_t>(e.block_size);
  w.PutString(e.medium);
}

KvCacheEvent GetEvent(Reader& r, uint32_t i) {
  KvCacheEvent e;
  const uint8_t kind = r.Get<uint8_t>("event.kind");
  e.block_hashes = GetList<uint64_t>(r, "event.block_hashes", kMaxEntryTokens);
  const uint8_t has_parent = r.Get<uint8_t>("event.has_parent");
  const uint64_t parent = r.Get<uint64_t>("event.parent_block_hash");
  e.token_ids = GetList<int32_t>(r, "event.token_ids", kMaxEntryTokens);
  e.block_size = r.Get<int32_t>("event.block_size");
  e.medium = r.GetString("event.medium");
  if (!r.ok()) return e;
  if (kind > static_cast<uint8_t>(KvCacheEvent::Kind::kAllBlocksCleared) || has_parent > 1) {
    r.Fail(absl::StrFormat("events[%d]: kind %d, has_parent %d", i, kind, has_parent));
    return e;
  }
  e.kind = static_cast<KvCacheEvent::Kind>(kind);
  if (has_parent == 1) e.parent_block_hash = parent;
  if (e.kind == KvCacheEvent::Kind::kBlockStored &&
      (e.block_size <= 0 ||
       e.token_ids.size() != static_cast<uint64_t>(e.block_size) * e.block_hashes.size())) {
    r.Fail(absl::StrFormat("events[%d]: %d token ids for %d blocks of %d", i, e.token_ids.size(),
                           e.block_hashes.size(), e.block_size));
  }
  return e;
}

// The payload of a frame of kind `want`, after the header checks.
absl::StatusOr<std::string_view> Payload(std::string_view frame, ControlKind want) {
  SPECNODE_ASSIGN_OR_RETURN(ControlKind kind, PeekControlKind(frame));
  if (kind != want) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "control message: expected %s, got %s", ControlKindName(want), ControlKindName(kind)));
  }
  return frame.substr(kControlHeaderBytes);
}

}  // namespace

const char* ControlKindName(ControlKind kind) {
  switch (kind) {
    case ControlKind::kHello:
      return "Hello";
    case ControlKind::kHelloAck:
      return "HelloAck";
    case ControlKind::kStepPlan:
      return "StepPlan";
    case ControlKind::kStepReply:
      return "StepReply";
    case ControlKind::kShutdown:
      return "Shutdown";
  }
  return "unknown";
}

std::string DescribeFingerprint(const ModelFingerprint& f) {
  return absl::StrFormat("%d bytes, %d tensors, vocab %d, %d layers", f.file_bytes, f.tensor_count,
                         f.vocab_size, f.n_layers);
}

absl::Status StepReplyMessage::status() const {
  if (status_code == 0) return absl::OkStatus();
  return absl::Status(static_cast<absl::StatusCode>(status_code), status_message);
}

void StepReplyMessage::set_status(const absl::Status& s) {
  status_code = static_cast<int32_t>(s.code());
  status_message = std::string(s.message());
}

void HelloAckMessage::set_status(const absl::Status& s) {
  status_code = static_cast<int32_t>(s.code());
  status_message = std::string(s.message());
}

KvFingerprint FingerprintLengths(const std::vector<std::pair<SeqId, int32_t>>& sorted_lengths) {
  KvFingerprint f;
  uint64_t h = 1469598103934665603ull;  // FNV-1a offset basis
  auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i) {
      h ^= (v >> (8 * i)) & 0xff;
      h *= 1099511628211ull;
    }
  };
  for (const auto& [seq, len] : sorted_lengths) {
    if (len <= 0) continue;
    mix(static_cast<uint64_t>(seq));
    mix(static_cast<uint64_t>(len));
    f.tokens += len;
  }
  f.hash = h;
  return f;
}

std::string EncodeControl(const HelloMessage& m) {
  Writer w;
  w.Put<uint32_t>(m.protocol_version);
  PutFingerprint(w, m.model);
  w.Put<int32_t>(m.tp_size);
  w.Put<int64_t>(m.coordinator_pid);
  w.PutString(m.coordinator_host);
  return w.Finish(ControlKind::kHello);
}

std::string EncodeControl(const HelloAckMessage& m) {
  Writer w;
  w.Put<uint32_t>(m.protocol_version);
  PutFingerprint(w, m.model);
  w.Put<int32_t>(m.world_rank);
  w.Put<int32_t>(m.tp_rank);
  w.Put<int32_t>(m.tp_size);
  w.Put<int64_t>(m.kv_capacity_bytes);
  w.Put<int32_t>(m.n_kv_heads_local);
  w.Put<int64_t>(m.kv_page_bytes);
  w.Put<int32_t>(m.kv_page_tokens);
  w.Put<int32_t>(m.kv_pass_boundary);
  w.Put<uint8_t>(m.kv_prefix_cache ? 1 : 0);
  w.Put<uint8_t>(m.kv_tree_passes ? 1 : 0);
  w.Put<int64_t>(m.pid);
  w.PutString(m.host);
  w.Put<int32_t>(m.status_code);
  w.PutString(m.status_message);
  return w.Finish(ControlKind::kHelloAck);
}

std::string EncodeControl(const StepPlanMessage& m) {
  Writer w;
  w.Put<uint64_t>(m.step);
  w.Put<uint32_t>(static_cast<uint32_t>(m.ops.size()));
  for (const StepOp& op : m.ops) {
    w.Put<uint8_t>(static_cast<uint8_t>(op.kind));
    w.Put<int64_t>(op.seq);
    w.Put<int32_t>(op.n);
    if (OpHasTokens(op.kind)) PutList(w, op.tokens);
  }
  w.Put<uint32_t>(static_cast<uint32_t>(m.entries.size()));
  for (const StepEntry& e : m.entries) {
    w.Put<int64_t>(e.seq);
    w.Put<uint8_t>(e.all_logits ? 1 : 0);
    w.Put<uint32_t>(static_cast<uint32_t>(e.tokens.size()));
    w.PutArray(e.tokens.data(), e.tokens.size());
    PutList(w, e.parents);
  }
  return w.Finish(ControlKind::kStepPlan);
}

std::string EncodeControl(const StepReplyMessage& m) {
  Writer w;
  w.Put<uint64_t>(m.step);
  w.Put<int32_t>(m.tp_rank);
  w.Put<int32_t>(m.status_code);
  w.PutString(m.status_message);
  w.Put<uint8_t>(m.local_failure ? 1 : 0);
  w.Put<uint64_t>(m.kv_hash);
  w.Put<int64_t>(m.kv_tokens);
  w.Put<int64_t>(m.kv_available_bytes);
  w.Put<int64_t>(m.kv_used_bytes);
  static_assert(kNumKvPrecisions == 4,
                "the wire format (v7) carries 4 classes (f16, int8, int4, int2)");
  for (int64_t b : m.kv_class_bytes) w.Put<int64_t>(b);
  for (int64_t t : m.kv_class_tokens) w.Put<int64_t>(t);
  w.Put<int64_t>(m.kv_host_bytes);
  w.Put<int64_t>(m.kv_cache_only_bytes);
  PutList(w, m.matched);
  w.Put<uint32_t>(static_cast<uint32_t>(m.events.size()));
  for (const KvCacheEvent& e : m.events) PutEvent(w, e);
  w.Put<int64_t>(m.n_rows);
  w.Put<int32_t>(m.vocab);
  w.Put<uint64_t>(m.logits.size());
  w.PutArray(m.logits.data(), m.logits.size());
  return w.Finish(ControlKind::kStepReply);
}

std::string EncodeControl(const ShutdownMessage& m) {
  Writer w;
  w.PutString(m.reason);
  return w.Finish(ControlKind::kShutdown);
}

absl::StatusOr<ControlKind> PeekControlKind(std::string_view frame) {
  if (frame.size() < kControlHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("control message: %d bytes, shorter than the %d-byte header", frame.size(),
                        kControlHeaderBytes));
  }
  Reader r(frame.substr(0, kControlHeaderBytes));
  const uint32_t magic = r.Get<uint32_t>("magic");
  const uint16_t version = r.Get<uint16_t>("version");
  const uint16_t kind = r.Get<uint16_t>("kind");
  const uint64_t payload = r.Get<uint64_t>("payload length");
  if (magic != kControlMagic) {
    return absl::InvalidArgumentError(
        absl::StrFormat("control message: bad magic 0x%08x (not a specnode control frame)", magic));
  }
  if (version != kControlProtocolVersion) {
    return absl::InvalidArgumentError(
        absl::StrFormat("control message: control protocol version %d; this build speaks %d",
                        version, kControlProtocolVersion));
  }
  if (kind < static_cast<uint16_t>(ControlKind::kHello) ||
      kind > static_cast<uint16_t>(ControlKind::kShutdown)) {
    return absl::InvalidArgumentError(absl::StrFormat("control message: unknown kind %d", kind));
  }
  if (payload != frame.size() - kControlHeaderBytes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("control message: header says %d payload bytes, frame has %d", payload,
                        frame.size() - kControlHeaderBytes));
  }
  return static_cast<ControlKind>(kind);
}

absl::StatusOr<HelloMessage> DecodeHello(std::string_view frame) {
  SPECNODE_ASSIGN_OR_RETURN(std::string_view payload, Payload(frame, ControlKind::kHello));
  Reader r(payload);
  HelloMessage m;
  m.protocol_version = r.Get<uint32_t>("protocol_version");
  m.model = GetFingerprint(r);
  m.tp_size = r.Get<int32_t>("tp_size");
  m.coordinator_pid = r.Get<int64_t>("coordinator_pid");
  m.coordinator_host = r.GetString("coordinator_host");
  if (r.ok() && m.tp_size < 1) r.Fail(absl::StrFormat("tp_size %d", m.tp_size));
  SPECNODE_RETURN_IF_ERROR(r.Done());
  return m;
}

absl::StatusOr<HelloAckMessage> DecodeHelloAck(std::string_view frame) {
  SPECNODE_ASSIGN_OR_RETURN(std::string_view payload, Payload(frame, ControlKind::kHelloAck));
  Reader r(payload);
  HelloAckMessage m;
  m.protocol_version = r.Get<uint32_t>("protocol_version");
  m.model = GetFingerprint(r);
  m.world_rank = r.Get<int32_t>("world_rank");
  m.tp_rank = r.Get<int32_t>("tp_rank");
  m.tp_size = r.Get<int32_t>("tp_size");
  m.kv_capacity_bytes = r.Get<int64_t>("kv_capacity_bytes");
  m.n_kv_heads_local = r.Get<int32_t>("n_kv_heads_local");
  m.kv_page_bytes = r.Get<int64_t>("kv_page_bytes");
  m.kv_page_tokens = r.Get<int32_t>("kv_page_tokens");
  m.kv_pass_boundary = r.Get<int32_t>("kv_pass_boundary");
  const uint8_t prefix_cache = r.Get<uint8_t>("kv_prefix_cache");
  m.kv_prefix_cache = prefix_cache == 1;
  const uint8_t tree_passes = r.Get<uint8_t>("kv_tree_passes");
  m.kv_tree_passes = tree_passes == 1;
  m.pid = r.Get<int64_t>("pid");
  m.host = r.GetString("host");
  m.status_code = r.Get<int32_t>("status_code");
  m.status_message = r.GetString("status_message");
  if (r.ok() && !ValidStatusCode(m.status_code)) {
    r.Fail(absl::StrFormat("status code %d", m.status_code));
  }
  if (r.ok() && prefix_cache > 1) r.Fail(absl::StrFormat("kv_prefix_cache %d", prefix_cache));
  if (r.ok() && tree_passes > 1) r.Fail(absl::StrFormat("kv_tree_passes %d", tree_passes));
  if (r.ok() && (m.kv_page_bytes < 0 || m.kv_page_tokens < 0 || m.kv_pass_boundary < 0)) {
    r.Fail(absl::StrFormat("KV page geometry (%d bytes, %d tokens, boundary %d)", m.kv_page_bytes,
                           m.kv_page_tokens, m.kv_pass_boundary));
  }
  if (r.ok() && (m.tp_size < 1 || m.tp_rank < 0 || m.tp_rank >= m.tp_size)) {
    r.Fail(absl::StrFormat("tp rank %d of %d", m.tp_rank, m.tp_size));
  }
  SPECNODE_RETURN_IF_ERROR(r.Done());
  return m;
}

absl::StatusOr<StepPlanMessage> DecodeStepPlan(std::string_view frame) {
  SPECNODE_ASSIGN_OR_RETURN(std::string_view payload, Payload(frame, ControlKind::kStepPlan));
  Reader r(payload);
  StepPlanMessage m;
  m.step = r.Get<uint64_t>("step");
  const uint32_t n_ops = r.GetCount("ops", kMaxStepOps, 13);
  m.ops.reserve(n_ops);
  for (uint32_t i = 0; i < n_ops && r.ok(); ++i) {
    StepOp op;
    const uint8_t kind = r.Get<uint8_t>("op.kind");
    op.seq = r.Get<int64_t>("op.seq");
    op.n = r.Get<int32_t>("op.n");
    if (!r.ok()) break;
    if (kind < static_cast<uint8_t>(StepOp::Kind::kTruncate) ||
        kind > static_cast<uint8_t>(StepOp::Kind::kKeepRows)) {
      r.Fail(absl::StrFormat("ops[%d]: unknown kind %d", i, kind));
      break;
    }
    op.kind = static_cast<StepOp::Kind>(kind);
    if (OpHasTokens(op.kind)) op.tokens = GetList<int32_t>(r, "op.tokens", kMaxEntryTokens);
    if (op.kind == StepOp::Kind::kTruncate && op.n < 0) {
      r.Fail(absl::StrFormat("ops[%d]: truncate to %d", i, op.n));
      break;
    }
    if (op.kind == StepOp::Kind::kKeepRows && (op.n < 0 || op.tokens.empty())) {
      r.Fail(absl::StrFormat("ops[%d]: keep %d rows from %d", i, op.tokens.size(), op.n));
      break;
    }
    m.ops.push_back(op);
  }
  const uint32_t n_entries = r.GetCount("entries", kMaxStepEntries, 17);
  m.entries.reserve(n_entries);
  for (uint32_t i = 0; i < n_entries && r.ok(); ++i) {
    StepEntry e;
    e.seq = r.Get<int64_t>("entry.seq");
    const uint8_t all = r.Get<uint8_t>("entry.all_logits");
    const uint32_t n_tok = r.GetCount("entry.tokens", kMaxEntryTokens, sizeof(int32_t));
    if (!r.ok()) break;
    if (all > 1) {
      r.Fail(absl::StrFormat("entries[%d]: all_logits %d", i, all));
      break;
    }
    if (n_tok == 0) {
      r.Fail(absl::StrFormat("entries[%d]: no tokens", i));
      break;
    }
    e.all_logits = all == 1;
    e.tokens.resize(n_tok);
    r.GetArray(e.tokens.data(), n_tok, "entry.tokens");
    e.parents = GetList<int32_t>(r, "entry.parents", kMaxEntryTokens);
    if (r.ok() && !e.parents.empty() && e.parents.size() != n_tok) {
      r.Fail(absl::StrFormat("entries[%d]: %d parents for %d tokens", i, e.parents.size(), n_tok));
      break;
    }
    m.entries.push_back(std::move(e));
  }
  SPECNODE_RETURN_IF_ERROR(r.Done());
  return m;
}

absl::StatusOr<StepReplyMessage> DecodeStepReply(std::string_view frame) {
  SPECNODE_ASSIGN_OR_RETURN(std::string_view payload, Payload(frame, ControlKind::kStepReply));
  Reader r(payload);
  StepReplyMessage m;
  m.step = r.Get<uint64_t>("step");
  m.tp_rank = r.Get<int32_t>("tp_rank");
  m.status_code = r.Get<int32_t>("status_code");
  m.status_message = r.GetString("status_message");
  const uint8_t local = r.Get<uint8_t>("local_failure");
  m.kv_hash = r.Get<uint64_t>("kv_hash");
  m.kv_tokens = r.Get<int64_t>("kv_tokens");
  m.kv_available_bytes = r.Get<int64_t>("kv_available_bytes");
  m.kv_used_bytes = r.Get<int64_t>("kv_used_bytes");
  for (int64_t& b : m.kv_class_bytes) b = r.Get<int64_t>("kv_class_bytes");
  for (int64_t& t : m.kv_class_tokens) t = r.Get<int64_t>("kv_class_tokens");
  m.kv_host_bytes = r.Get<int64_t>("kv_host_bytes");
  m.kv_cache_only_bytes = r.Get<int64_t>("kv_cache_only_bytes");
  m.matched = GetList<int32_t>(r, "matched", kMaxStepOps);
  const uint32_t n_events = r.GetCount("events", kMaxReplyEvents, kMinEventBytes);
  m.events.reserve(n_events);
  for (uint32_t i = 0; i < n_events && r.ok(); ++i) m.events.push_back(GetEvent(r, i));
  m.n_rows = r.Get<int64_t>("n_rows");
  m.vocab = r.Get<int32_t>("vocab");
  const uint64_t n_logits = r.Get<uint64_t>("logits count");
  if (r.ok() && !ValidStatusCode(m.status_code)) {
    r.Fail(absl::StrFormat("status code %d", m.status_code));
  }
  if (r.ok() && local > 1) r.Fail(absl::StrFormat("local_failure %d", local));
  if (r.ok() && (m.kv_available_bytes < -1 || m.kv_used_bytes < 0 || m.kv_host_bytes < -1 ||
                 m.kv_cache_only_bytes < -1 ||
                 *std::min_element(m.kv_class_bytes.begin(), m.kv_class_bytes.end()) < 0 ||
                 *std::min_element(m.kv_class_tokens.begin(), m.kv_class_tokens.end()) < -1)) {
    r.Fail(
        absl::StrFormat("KV bytes (available %d, used %d)", m.kv_available_bytes, m.kv_used_bytes));
  }
  if (r.ok() && std::any_of(m.matched.begin(), m.matched.end(), [](int32_t c) { return c < 0; })) {
    r.Fail("a negative MatchPrefix count");
  }
  if (r.ok() && (m.n_rows < 0 || m.vocab < 0 || m.kv_tokens < 0)) {
    r.Fail(absl::StrFormat("negative size (n_rows %d, vocab %d, kv_tokens %d)", m.n_rows, m.vocab,
                           m.kv_tokens));
  }
  if (r.ok() && (m.vocab != 0 && static_cast<uint64_t>(m.n_rows) >
                                     std::numeric_limits<uint64_t>::max() / 4 / m.vocab)) {
    r.Fail("n_rows * vocab overflows");
  }
  if (r.ok() && n_logits != static_cast<uint64_t>(m.n_rows) * static_cast<uint64_t>(m.vocab)) {
    r.Fail(absl::StrFormat("%d logits for %d rows of vocab %d", n_logits, m.n_rows, m.vocab));
  }
  if (r.ok()) {
    m.local_failure = local == 1;
    // Check the bytes left before sizing the vector (n_logits comes off the wire).
    if (n_logits > r.left() / sizeof(float)) {
      r.Fail(absl::StrFormat("truncated at logits (%d floats, %d bytes left)", n_logits, r.left()));
    } else {
      m.logits.resize(n_logits);
      r.GetArray(m.logits.data(), n_logits, "logits");
    }
  }
  SPECNODE_RETURN_IF_ERROR(r.Done());
  return m;
}

absl::StatusOr<ShutdownMessage> DecodeShutdown(std::string_view frame) {
  SPECNODE_ASSIGN_OR_RETURN(std::string_view payload, Payload(frame, ControlKind::kShutdown));
  Reader r(payload);
  ShutdownMessage m;
  m.reason = r.GetString("reason");
  SPECNODE_RETURN_IF_ERROR(r.Done());
  return m;
}

}  // namespace specnode
