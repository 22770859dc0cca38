#include "node/cluster/shard_worker.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <memory>
#include <optional>

#include "absl/strings/str_format.h"
#include "model/llama/llama_model.h"
#include "model/status_macros.h"
#include "model/cpu/thread_pool.h"
#include "node/cluster/control_protocol.h"
#include "node/cluster/shard_executor.h"
#include "runtime/runner_factory.h"

namespace specnode {
namespace {

using Clock = std::chrono::steady_clock;

ModelFingerprint FingerprintOf(const LlamaModel& m) {
  return {m.file().file_size(), m.file().tensors().size(), m.config().vocab_size,
          m.config().n_layers};
}

}  // namespace

absl::Status RunShardWorker(const ShardWorkerOptions& o, Communicator* comm,
                            ControlChannel* channel, bool* started) {
  *started = false;
  // 1. Load (errors are reported to rank 0 in the HelloAck).
  std::unique_ptr<LlamaModel> model;
  std::unique_ptr<ThreadPool> pool;
  std::unique_ptr<GpuShardLink> gpu;               // NCCL + its reducer: outlives exec
  std::unique_ptr<CommunicatorReducer> cpu_sum;   // the CPU pass's all-reduce: outlives exec
  std::unique_ptr<ShardExecutor> exec;
  HelloAckMessage ack;
  ack.world_rank = o.world_rank;
  ack.tp_rank = o.tp_rank;
  ack.tp_size = o.tp_size;
  ack.pid = getpid();
  ack.host = ThisHost();
  absl::Status load = [&]() -> absl::Status {
    RunnerOptions ro;
    ro.device = o.device;
    ro.kv = o.kv;
    ro.activations = o.activations;
    // What the device cannot do is refused before the weights are read.
    SPECNODE_RETURN_IF_ERROR(CheckRunnerOptions(ro));
    LoadOptions lo;
    lo.shard = ShardSpec{o.tp_rank, o.tp_size};
    lo.activations = o.activations.value_or(ActQuant::kInt16);
    SPECNODE_ASSIGN_OR_RETURN(model, LlamaModel::Load(o.model_path, lo));
    if (!o.device.is_cpu()) {
      // The pass all-reduces over NCCL; `comm` still carries the step agreement.
      SPECNODE_ASSIGN_OR_RETURN(gpu, GpuShardLink::Create(comm, o.device, o.timeout_s));
      ro.reducer = gpu->reducer();
    } else {
      pool = std::make_unique<ThreadPool>(o.threads);  // the CPU pass's workers
      ro.pool = pool.get();
      if (comm->size() > 1) {
        cpu_sum = std::make_unique<CommunicatorReducer>(comm);
        ro.reducer = cpu_sum.get();
      }
    }
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<LocalModelRunner> runner,
                              MakeRunner(model->config(), model->weights(), ro));
    exec = std::make_unique<ShardExecutor>(model->config(), std::move(runner), comm);
    ack.model = FingerprintOf(*model);
    ack.n_kv_heads_local = model->weights().n_kv_heads_local;
    // The store's own (kv.memory_utilization sizes it from this rank's device).
    const std::optional<ModelRunner::KvMemory> memory = exec->model().Memory();
    ack.kv_capacity_bytes = memory.has_value() ? memory->capacity_bytes : o.kv.capacity_bytes;
    if (const std::optional<ModelRunner::KvRoom> room = exec->model().Room(0)) {
      ack.kv_page_bytes = room->needed;  // Room(0): one page
      ack.kv_page_tokens = o.kv.page_tokens;
    }
    ack.kv_pass_boundary = exec->model().PassBoundary();
    ack.kv_prefix_cache = exec->prefix_cache();
    ack.kv_tree_passes = exec->model().TreePasses();
    return absl::OkStatus();
  }();
  ack.set_status(load);

  // 2. Handshake.
  auto stop_check = [&o]() -> absl::Status {
    if (o.stop != nullptr && o.stop->load()) return absl::CancelledError("stopped by a signal");
    return absl::OkStatus();
  };
  SPECNODE_ASSIGN_OR_RETURN(std::string frame,
                            channel->Recv(0, o.startup_timeout_s, "rank 0 (Hello)", stop_check));
  if (absl::StatusOr<ControlKind> k = PeekControlKind(frame);
      k.ok() && *k == ControlKind::kShutdown) {
    return absl::OkStatus();  // rank 0 failed to start and said so
  }
  absl::StatusOr<HelloMessage> hello = DecodeHello(frame);
  if (!hello.ok()) {
    HelloAckMessage bad = ack;
    bad.set_status(hello.status());
    (void)channel->Send(0, EncodeControl(bad), o.timeout_s, "rank 0");
    return hello.status();
  }
  SPECNODE_RETURN_IF_ERROR(channel->Send(0, EncodeControl(ack), o.timeout_s, "rank 0"));
  if (!load.ok()) return load;
  *started = true;
  const int64_t coordinator_pid = hello->coordinator_pid;
  const std::string coordinator_host = hello->coordinator_host;

  // 3. Serve plans until Shutdown.
  PollBackoff backoff;
  auto next_check = Clock::now() + std::chrono::seconds(1);
  std::optional<Clock::time_point> stop_since;
  auto coordinator_alive = [&]() -> absl::Status {
    if (PeerAlive(coordinator_pid, coordinator_host)) return absl::OkStatus();
    return absl::UnavailableError(absl::StrFormat("rank 0 (pid %d) is gone", coordinator_pid));
  };
  while (true) {
    SPECNODE_ASSIGN_OR_RETURN(bool arrived, channel->TryRecv(0, &frame, coordinator_alive));
    if (!arrived) {
      const auto now = Clock::now();
      if (now >= next_check) {
        next_check = now + std::chrono::seconds(1);
        SPECNODE_RETURN_IF_ERROR(coordinator_alive());
        if (o.stop != nullptr && o.stop->load()) {
          if (!stop_since) stop_since = now;
          if (now - *stop_since > std::chrono::duration<double>(o.stop_grace_s)) {
            return absl::CancelledError("stopped by a signal (no Shutdown from rank 0)");
          }
        }
      }
      backoff.Sleep();
      continue;
    }
    backoff.Reset();
    absl::StatusOr<ControlKind> kind = PeekControlKind(frame);
    if (!kind.ok()) {
      std::fprintf(stderr, "specnode serve (rank %d): ignoring a frame: %s\n", o.world_rank,
                   std::string(kind.status().message()).c_str());
      continue;
    }
    if (*kind == ControlKind::kShutdown) return absl::OkStatus();
    if (*kind != ControlKind::kStepPlan) {
      std::fprintf(stderr, "specnode serve (rank %d): ignoring an unexpected %s\n", o.world_rank,
                   ControlKindName(*kind));
      continue;
    }
    absl::StatusOr<StepPlanMessage> plan = DecodeStepPlan(frame);
    StepReplyMessage reply;
    if (!plan.ok()) {
      reply.tp_rank = o.tp_rank;
      reply.set_status(plan.status());
      reply.local_failure = true;
    } else {
      reply = exec->Execute(*plan);
    }
    SPECNODE_RETURN_IF_ERROR(channel->Send(0, EncodeControl(reply), o.timeout_s, "rank 0"));
  }
}

}  // namespace specnode
