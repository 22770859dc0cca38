// The life of a target-shard rank (ranks 1..T) of `specnode serve` under mpirun:
//   1. load this rank's Megatron shard of the target (ShardSpec{tp_rank, tp_size}) and
//      build a KV cache of its local kv heads;
//   2. wait for rank 0's Hello and answer HelloAck (a load failure is reported there, so
//      rank 0 prints it and exits non-zero instead of waiting);
//   3. loop: wait for the next control frame from rank 0 WITHOUT busy-waiting (MPI_Iprobe
//      with a 20 µs..1 ms sleeping backoff: an idle shard uses a few % of a core), run
//      StepPlans through a ShardExecutor over the group's Communicator, send StepReplies;
//      leave on Shutdown.
//
// Rank 0 gone. While idle the shard checks about once a second that rank 0 is alive (same
// host: its pid from Hello); if not, it returns Unavailable and the process exits 1. On
// other hosts a vanished rank 0 is noticed by mpirun, which tears the job down (OpenMPI
// kills every rank when one dies or exits non-zero).
//
// SIGTERM/SIGINT (*stop; what mpirun forwards to every rank on Ctrl-C): the shard keeps
// answering plans for up to stop_grace_s (rank 0's drain limit plus a margin) so that rank 0
// can finish its drain and send Shutdown, then returns Cancelled.
//
// Runs on the thread that initialised MPI; blocks until the shard is done.
#pragma once

#include <atomic>
#include <optional>
#include <string>

#include "absl/status/status.h"
#include "kvstore/kv_options.h"
#include "model/cpu/cpu_matmul.h"
#include "model/llama/device.h"
#include "node/cluster/control_channel.h"
#include "tensor-parallel/communicator.h"

namespace specnode {

struct ShardWorkerOptions {
  std::string model_path;
  int threads = 1;
  std::optional<ActQuant> activations;  // unset: the device's own
  // A GPU shard runs the graph on CudaBackend (runtime/runner_factory.h) and, in a group of
  // several ranks, all-reduces over NCCL (every rank of the group on a GPU; the group's
  // `comm` still carries the step agreement and NCCL's bootstrap).
  Device device;
  KvOptions kv;
  int world_rank = 1;
  int tp_rank = 0;
  int tp_size = 1;
  double timeout_s = 5.0;          // sends of replies
  double startup_timeout_s = 300;  // waiting for Hello
  const std::atomic<bool>* stop = nullptr;
  double stop_grace_s = 40.0;  // after *stop: serve.drain_timeout_s + kStopGraceMarginS
};

// What a shard waits beyond rank 0's drain limit before giving up on its Shutdown.
inline constexpr double kStopGraceMarginS = 10.0;

// `comm`: the group's communicator (TP ranks 0..T-1), borrowed. *started turns true once
// the shard loaded and answered Hello with OK (before that, errors such as a failed load
// went to rank 0 in the HelloAck, and rank 0 reports them). A Shutdown instead of Hello
// (rank 0 failed to start) returns OK.
absl::Status RunShardWorker(const ShardWorkerOptions& options, Communicator* comm,
                            ControlChannel* channel, bool* started);

}  // namespace specnode
