// `specnode serve` as an mpirun job (docs/serving.md, "Cluster (mpirun)"):
//
//   mpirun -np 1+T specnode serve --config cluster-configs/X.yaml
//   rank 0      coordinator: ZeroMQ front end, scheduler, speculative engine, draft; its
//               target is a RemoteTargetRunner over ranks 1..T
//   rank 1..T   target shards (shard_worker.h), tensor parallel over an MPI
//               Communicator among themselves
// With several groups (topology.groups), each group's target ranks form their own TP
// group and RemoteTargetRunner; the engine runs one pass per group per step, all groups'
// shards computing at once, and the router spreads requests over the groups (best recent
// goodput per domain, least loaded among near-equals). A group's draft runs on rank 0
// (n-gram, self-draft, or a draft model file) or, for a draft model file, on a rank of its
// own: a one-rank shard worker serving the draft file, driven by a ModelDrafter over a
// RemoteTargetRunner ("draft rank N" in errors).
//
// Start-up checks, on every rank alike and before any model weights load (only rank 0
// prints; the others exit quietly with the same status):
//   - launched by mpirun at all, and world size == topology.world_size
//     ("the config X.yaml needs 4 ranks, mpirun started 3 (use mpirun -np 4)");
//   - a group's draft on a rank other than 0 only for a draft model file (n-gram and
//     self-drafts run inside the coordinator);
//   - every rank's device can do what the config asks (runtime/runner_factory.h's
//     CheckRunnerOptions: a CUDA build, the KV mode, activations);
//   - the TP size fits the model (ShardPlan, from the GGUF header only).
// Then the MPI layer's start-up check (transport_check.h: short and 4 MiB frames to every
// rank and back, a barrier), which refuses a layer the node cannot work with, naming it and
// `--mca pml ob1`; every rank that sees the failure prints it and the job ends at once.
// Then the handshake (Hello / HelloAck: protocol version, model fingerprint, ranks).
//
// Faults: when the target is lost (a shard process gone, no answer within
// topology.timeout_s), the scheduler fails every request with `unavailable`, rank 0 prints
// the error naming the rank and ends the job with MPI_Abort (exit non-zero; no rank waits
// forever). Shards notice a vanished rank 0 themselves (same host) or are torn down by
// mpirun. A graceful drain (SIGINT/SIGTERM to rank 0) ends with Shutdown to every shard
// and exit 0.
#pragma once

#include "absl/status/status.h"
#include "node/serve/cluster_config.h"

namespace specnode {

// True when serve must run as a cluster: the topology has several ranks, or this process
// was started by mpirun with more than one rank (then the topology must say so).
bool NeedsCluster(const ServeConfig& cfg);

// The start-up checks above that every rank makes alike (all but "launched by mpirun"),
// against `world_size` ranks: the topology, each rank's device and options against the
// target's header (CheckRunnerOptions), the TP size, a draft rank's file. Reads GGUF
// headers only. `serve --check-config` runs it with the topology's own world size.
absl::Status CheckCluster(const ServeConfig& cfg, int world_size);

// Runs this rank's role; returns when the job ends. Error statuses with an empty message
// were already reported (by rank 0).
absl::Status RunServeCluster(const ServeConfig& cfg);

}  // namespace specnode
