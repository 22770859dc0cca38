// Writes control_fuzz's seed corpus (tests/fuzz/corpus/control/): one input per message
// kind, each a real encoded message in the fuzzer's layout (a mode byte naming the kind,
// then the payload; control_fuzz.cc), plus whole frames for the header checks. The
// committed seeds were made by `control_fuzz_seeds tests/fuzz/corpus/control`.

#include <cstdint>
#include <cstdio>
#include <fstream>
#include <string>
#include <vector>

#include "node/cluster/control_protocol.h"

namespace {

bool Write(const std::string& dir, const std::string& name, const std::string& bytes) {
  std::ofstream out(dir + "/" + name, std::ios::binary);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  return static_cast<bool>(out);
}

// The fuzzer's "header written for you" layout: kind byte + payload.
std::string Payload(specnode::ControlKind kind, const std::string& frame) {
  return std::string(1, static_cast<char>(kind)) + frame.substr(specnode::kControlHeaderBytes);
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    std::fprintf(stderr, "usage: control_fuzz_seeds DIR\n");
    return 2;
  }
  const std::string dir = argv[1];
  using specnode::ControlKind;
  specnode::ModelFingerprint fp{1000, 272, 49152, 30};

  specnode::HelloMessage hello;
  hello.model = fp;
  hello.tp_size = 3;
  hello.coordinator_pid = 4242;
  hello.coordinator_host = "node-a";

  specnode::HelloAckMessage ack;
  ack.model = fp;
  ack.world_rank = 2;
  ack.tp_rank = 1;
  ack.tp_size = 3;
  ack.kv_capacity_bytes = int64_t{1} << 30;
  ack.n_kv_heads_local = 1;
  ack.kv_page_bytes = 4096;
  ack.kv_page_tokens = 8;
  ack.kv_pass_boundary = 64;
  ack.kv_prefix_cache = true;
  ack.pid = 4343;
  ack.host = "node-b";

  specnode::StepPlanMessage plan;
  plan.step = 7;
  const std::vector<int32_t> prompt = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  plan.ops = {specnode::StepOp::Truncate(3, 12), specnode::StepOp::Free(4),
              specnode::StepOp::MatchPrefix(6, prompt), specnode::StepOp::PublishPrefix(3, prompt)};
  plan.entries = {{3, false, {1, 2, 3}}, {5, true, {9, 8, 7, 6, 5}}};

  specnode::StepReplyMessage reply;
  reply.step = 7;
  reply.tp_rank = 0;
  reply.kv_hash = 0x1234;
  reply.kv_tokens = 20;
  reply.kv_available_bytes = 1 << 20;
  reply.kv_used_bytes = 4096;
  reply.kv_class_bytes = {4096, 0, 0, 0};
  reply.kv_class_tokens = {20, 0, 0, 0};
  reply.kv_host_bytes = 0;
  reply.kv_cache_only_bytes = 0;
  reply.matched = {8};
  specnode::KvCacheEvent stored;
  stored.block_hashes = {11, 12};
  stored.parent_block_hash = 10;
  stored.token_ids = {1, 2, 3, 4, 5, 6, 7, 8};
  stored.block_size = 4;
  stored.medium = "CPU";
  specnode::KvCacheEvent removed;
  removed.kind = specnode::KvCacheEvent::Kind::kBlockRemoved;
  removed.block_hashes = {10};
  removed.medium = "CPU";
  reply.events = {stored, removed};
  reply.n_rows = 2;
  reply.vocab = 3;
  reply.logits = {0.5f, -1.0f, 2.0f, 0.0f, 1.0f, -0.25f};

  specnode::StepReplyMessage failed;
  failed.step = 8;
  failed.tp_rank = 1;
  failed.set_status(absl::InternalError("shard 1: KV fingerprint mismatch"));
  failed.local_failure = true;

  specnode::ShutdownMessage bye{"drained"};

  const std::string frames[] = {specnode::EncodeControl(hello),  specnode::EncodeControl(ack),
                                specnode::EncodeControl(plan),   specnode::EncodeControl(reply),
                                specnode::EncodeControl(failed), specnode::EncodeControl(bye)};
  const ControlKind kinds[] = {ControlKind::kHello,     ControlKind::kHelloAck,
                               ControlKind::kStepPlan,  ControlKind::kStepReply,
                               ControlKind::kStepReply, ControlKind::kShutdown};
  const char* names[] = {"hello",      "hello_ack",         "step_plan",
                         "step_reply", "step_reply_failed", "shutdown"};
  bool ok = true;
  for (int i = 0; i < 6; ++i) {
    ok &= Write(dir, std::string(names[i]) + ".bin", Payload(kinds[i], frames[i]));
  }
  // Whole frames (mode byte with the top bit set): header checks.
  ok &= Write(dir, "frame_step_plan.bin", "\x80" + frames[2]);
  ok &= Write(dir, "frame_hello.bin", "\x80" + frames[0]);
  if (!ok) {
    std::fprintf(stderr, "control_fuzz_seeds: cannot write to %s\n", dir.c_str());
    return 1;
  }
  return 0;
}
