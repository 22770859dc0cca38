// `specnode serve` as an mpirun job (docs/serving.md, "Cluster (mpirun)"):
//
//   mpirun -np 1+T specnode serve --config cluster-configs/X.yaml
//   rank 0      coordinator: ZeroMQ front end, scheduler, speculative engine, draft; its
//               target is a RemoteTargetRunner over ranks 1..T
//   rank 1..T   target shards (node/shard_worker.h), tensor parallel over an MPI
//               Communicator among themselves
//
// Start-up checks, on every rank alike and before any model weights load (only rank 0
// prints; the others exit quietly with the same status):
//   - launched by mpirun at all, and world size == topology.world_size
//     ("the config X.yaml needs 4 ranks, mpirun started 3 (use mpirun -np 4)");
//   - one group (several groups: Unimplemented — the engine has one target today);
//   - every device available (cuda:N on this CPU-only forward pass: FailedPrecondition);
//   - the TP size fits the model (ShardPlan, from the GGUF header only).
// Then the handshake (Hello / HelloAck: protocol version, model fingerprint, ranks).
//
// Faults: when the target is lost (a shard process gone, no answer within
// topology.timeout_s), the scheduler fails every request with `unavailable`, rank 0 prints
// the error naming the rank and ends the job with MPI_Abort (exit non-zero; no rank waits
// forever). Shards notice a vanished rank 0 themselves (same host) or are torn down by
// mpirun. A graceful drain (SIGINT/SIGTERM to rank 0) ends with Shutdown to every shard
// and exit 0.
#pragma once

#include <vector>

#include "absl/status/status.h"
#include "coordinator/model_runner.h"
#include "node/cluster_config.h"
#include "node/frontend.h"
#include "node/model_session.h"

namespace specnode {

// True when serve must run as a cluster: the topology has several ranks, or this process
// was started by mpirun with more than one rank (then the topology must say so).
bool NeedsCluster(const ServeConfig& cfg);

// Runs this rank's role; returns when the job ends. Error statuses with an empty message
// were already reported (by rank 0).
absl::Status RunServeCluster(const ServeConfig& cfg);

// The serving node on rank 0 (or in a single process): front end + scheduler + engine over
// `target`, until SIGINT/SIGTERM (OK after the drain) or until the target is lost (that
// error). `ranks` (empty for one process) is listed in `health`. Defined in cmd_serve.cc.
absl::Status ServeNode(const ServeConfig& cfg, ModelSession* session, ModelRunner* target,
                       std::vector<RankInfo> ranks);

}  // namespace specnode
