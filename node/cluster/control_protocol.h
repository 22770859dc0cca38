// The coordinator <-> target-shard control protocol of `specnode serve` under mpirun
// (docs/control-protocol.md): what rank 0 (coordinator + draft) and ranks 1..T (the
// tensor-parallel target shards) say to each other over MPI. Tensor-parallel activations
// do not travel here; they go over the shards' Communicator (tensor-parallel/).
//
// Every message is one frame: a 16-byte header, then the payload, all little-endian.
//   u32 magic "SNCP" | u16 protocol version | u16 kind | u64 payload bytes | payload
// Strings are u32 length + bytes; vectors are u32 count + elements. Decoding checks every
// length against the bytes that are left before it allocates or reads anything, so a
// truncated, oversized or otherwise malformed frame is InvalidArgument (naming what is
// wrong), never a crash or a huge allocation. A frame of another protocol version is
// InvalidArgument too ("control protocol version 2; this build speaks 1").
//
// Conversation (rank 0 = C, each shard = S):
//   C -> S  Hello       protocol version, model fingerprint, TP size, C's pid + host
//   S -> C  HelloAck    protocol version, S's fingerprint, ranks, KV capacity, pid + host,
//                       and a status (a shard that failed to load says why here)
//   C -> S  StepPlan    step number; cache ops (Truncate, Free, MatchPrefix, PublishPrefix:
//                       applied first, in order); the batch
//   S -> C  StepReply   step number, status, KV fingerprint, the MatchPrefix outcomes;
//                       logits and the prefix cache's events from TP rank 0 only
//   C -> S  Shutdown    the shard leaves its loop and exits
//
// Thread-safety: plain value types and pure functions.
#pragma once

#include <array>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "kvstore/kv_precision.h"
#include "model/llama/kv_cache.h"
#include "model/llama/kv_cache_events.h"

namespace specnode {

inline constexpr uint32_t kControlMagic = 0x50434E53;  // "SNCP" little-endian
inline constexpr uint16_t kControlProtocolVersion = 7;
inline constexpr size_t kControlHeaderBytes = 16;

enum class ControlKind : uint16_t {
  kHello = 1,
  kHelloAck = 2,
  kStepPlan = 3,
  kStepReply = 4,
  kShutdown = 5,
};
const char* ControlKindName(ControlKind kind);  // "Hello", ..., "unknown"

// Identifies "the same model file" cheaply across ranks (every rank opens its own copy).
struct ModelFingerprint {
  uint64_t file_bytes = 0;
  uint64_t tensor_count = 0;
  int32_t vocab_size = 0;
  int32_t n_layers = 0;
  bool operator==(const ModelFingerprint&) const = default;
};
std::string DescribeFingerprint(const ModelFingerprint& f);  // "123 bytes, 272 tensors, ..."

struct HelloMessage {
  uint32_t protocol_version = kControlProtocolVersion;
  ModelFingerprint model;
  int32_t tp_size = 0;
  int64_t coordinator_pid = 0;
  std::string coordinator_host;
};

struct HelloAckMessage {
  uint32_t protocol_version = kControlProtocolVersion;
  ModelFingerprint model;
  int32_t world_rank = 0;
  int32_t tp_rank = 0;
  int32_t tp_size = 0;
  int64_t kv_capacity_bytes = 0;
  int32_t n_kv_heads_local = 0;
  // KV geometry for admission (v2): a new full-precision page's bytes and token slots; a
  // sequence of n new tokens needs at most (ceil(n / page_tokens) + 1) pages. 0 = the
  // shard's cache cannot tell (dense).
  int64_t kv_page_bytes = 0;
  int32_t kv_page_tokens = 0;
  // (v4) The shard cache's KvCache::PassBoundary (0: none): rank 0 keeps each sequence's
  // rows of a step between two of its multiples.
  int32_t kv_pass_boundary = 0;
  // (v5) The shard's cache has a prefix cache (the paged store): it answers MatchPrefix /
  // PublishPrefix ops and reports KV events. A dense cache does not.
  bool kv_prefix_cache = false;
  // (v6) The shard's cache verifies draft trees (KvCache::tree_passes): rank 0 may send
  // entries with parents and KeepRows ops.
  bool kv_tree_passes = false;
  int64_t pid = 0;
  std::string host;
  // Not OK when the shard could not start (e.g. its weights failed to load).
  int32_t status_code = 0;  // absl::StatusCode
  std::string status_message;

  void set_status(const absl::Status& s);
};

// A cache operation applied on every shard before the step's forward pass.
//   kTruncate      drop positions [n, length) of seq
//   kFree          forget seq
//   kMatchPrefix   (v5) attach the longest cached run of whole pages of `tokens` to the new
//                  sequence seq (KvCache::MatchPrefix). The shards agree on the shortest of
//                  their matches (one AllGather) and keep that many positions, so every
//                  shard's table stays the same even where their caches differ; the reply's
//                  `matched` carries the agreed count.
//   kPublishPrefix (v5) register seq's leading whole pages of `tokens` in the prefix cache
//                  (KvCache::PublishPrefix).
//   kKeepRows      (v6) after a draft-tree pass: keep the rows `tokens` (offsets from n, the
//                  pass's first position; ascending) at positions n, n + 1, .. and drop the
//                  rest (KvCache::KeepRows)
struct StepOp {
  enum class Kind : uint8_t {
    kTruncate = 1,
    kFree = 2,
    kMatchPrefix = 3,
    kPublishPrefix = 4,
    kKeepRows = 5,
  };
  Kind kind = Kind::kFree;
  SeqId seq = 0;
  int32_t n = 0;                // kTruncate: the new length
  std::vector<int32_t> tokens;  // kMatchPrefix / kPublishPrefix: the sequence's token ids
  bool operator==(const StepOp&) const = default;

  static StepOp Truncate(SeqId seq, int32_t n) { return {Kind::kTruncate, seq, n, {}}; }
  static StepOp Free(SeqId seq) { return {Kind::kFree, seq, 0, {}}; }
  static StepOp MatchPrefix(SeqId seq, std::span<const int32_t> tokens) {
    return {Kind::kMatchPrefix, seq, 0, {tokens.begin(), tokens.end()}};
  }
  static StepOp PublishPrefix(SeqId seq, std::span<const int32_t> tokens) {
    return {Kind::kPublishPrefix, seq, 0, {tokens.begin(), tokens.end()}};
  }
  static StepOp KeepRows(SeqId seq, int32_t pos0, std::span<const int32_t> rows) {
    return {Kind::kKeepRows, seq, pos0, {rows.begin(), rows.end()}};
  }
};

struct StepEntry {
  SeqId seq = 0;
  bool all_logits = false;
  std::vector<int32_t> tokens;
  // (v6) A draft tree's parent rows ([tokens.size()], BatchEntry::parents); empty: a chain.
  std::vector<int32_t> parents = {};
  bool operator==(const StepEntry&) const = default;
};

struct StepPlanMessage {
  uint64_t step = 0;  // 1, 2, ... per coordinator; replies echo it
  std::vector<StepOp> ops;
  std::vector<StepEntry> entries;  // may be empty (ops only)
};

struct StepReplyMessage {
  uint64_t step = 0;
  int32_t tp_rank = 0;
  int32_t status_code = 0;  // absl::StatusCode of the step on this shard
  std::string status_message;
  // True when this shard's own check failed (its message is the one to report); false
  // when it failed only because another shard did.
  bool local_failure = false;
  // Cheap block-table fingerprint after the step: a hash of the (seq, length) pairs of
  // every live sequence, and their total length. Every shard applies the same op
  // sequence, so every shard must report the same values (and the coordinator's own).
  uint64_t kv_hash = 0;
  int64_t kv_tokens = 0;
  // KV memory after the step (v2): bytes the shard's store could make available now
  // (-1 = cannot tell) and bytes in use; the coordinator's admission and metrics read them.
  int64_t kv_available_bytes = -1;
  int64_t kv_used_bytes = 0;
  // Bytes in pages per KvPrecision (v7: four classes, int2 added; three before).
  std::array<int64_t, kNumKvPrecisions> kv_class_bytes{};
  // (v3) Live tokens per class and swap-tier bytes; -1 = the shard's cache cannot tell.
  std::array<int64_t, kNumKvPrecisions> kv_class_tokens{-1, -1, -1, -1};
  int64_t kv_host_bytes = -1;
  // (v5) Of kv_used_bytes, the prefix cache's pages no sequence uses; -1 = cannot tell.
  int64_t kv_cache_only_bytes = -1;
  // (v5) One agreed count per kMatchPrefix op of the plan, in op order (the same on every
  // shard): positions of that sequence now cached.
  std::vector<int32_t> matched;
  // (v5) The prefix cache's events during this step (kv_cache_events.h), in order; only TP
  // rank 0 reports them (every shard's cache holds the same blocks).
  std::vector<KvCacheEvent> events;
  // Logits [n_rows, vocab] row-major; only TP rank 0 sends them (others: n_rows = 0).
  int64_t n_rows = 0;
  int32_t vocab = 0;
  std::vector<float> logits;

  absl::Status status() const;
  void set_status(const absl::Status& s);
};

struct ShutdownMessage {
  std::string reason;
};

// The block-table fingerprint of StepReplyMessage: FNV-1a over (seq, length) pairs in
// ascending seq order (zero lengths skipped); kv_tokens = Σ length.
struct KvFingerprint {
  uint64_t hash = 0;
  int64_t tokens = 0;
  bool operator==(const KvFingerprint&) const = default;
};
KvFingerprint FingerprintLengths(const std::vector<std::pair<SeqId, int32_t>>& sorted_lengths);

std::string EncodeControl(const HelloMessage& m);
std::string EncodeControl(const HelloAckMessage& m);
std::string EncodeControl(const StepPlanMessage& m);
std::string EncodeControl(const StepReplyMessage& m);
std::string EncodeControl(const ShutdownMessage& m);

// The kind of a frame after checking its header (magic, version, payload length ==
// frame length - 16). InvalidArgument otherwise.
absl::StatusOr<ControlKind> PeekControlKind(std::string_view frame);

// Each checks the header, that the kind matches, and the whole payload (no trailing
// bytes). InvalidArgument on any mismatch.
absl::StatusOr<HelloMessage> DecodeHello(std::string_view frame);
absl::StatusOr<HelloAckMessage> DecodeHelloAck(std::string_view frame);
absl::StatusOr<StepPlanMessage> DecodeStepPlan(std::string_view frame);
absl::StatusOr<StepReplyMessage> DecodeStepReply(std::string_view frame);
absl::StatusOr<ShutdownMessage> DecodeShutdown(std::string_view frame);

// Decoding limits (beyond them a frame is malformed).
inline constexpr uint32_t kMaxControlString = 1 << 16;
inline constexpr uint32_t kMaxStepEntries = 1 << 16;
inline constexpr uint32_t kMaxStepOps = 1 << 20;
inline constexpr uint32_t kMaxEntryTokens = 1 << 20;
inline constexpr uint32_t kMaxReplyEvents = 1 << 20;

}  // namespace specnode
