#include "node/serve_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/str_format.h"
#include "model/gguf_reader.h"
#include "model/llama_config.h"
#include "model/status_macros.h"

#ifdef SPECNODE_HAVE_MPI
#include <mpi.h>

#include "node/control_channel.h"
#include "node/remote_target_runner.h"
#include "node/shard_worker.h"
#include "tensor-parallel/mpi_check.h"
#include "tensor-parallel/mpi_communicator.h"
#include "tensor-parallel/shard_plan.h"
#endif

namespace specnode {
namespace {

// World size mpirun announced in the environment (1 when not under mpirun).
int LaunchedWorldSize() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_SIZE"}) {
    const char* v = std::getenv(name);
    if (v != nullptr && *v != '\0') return std::max(1, std::atoi(v));
  }
  return 0;  // not launched by an MPI launcher
}

#ifdef SPECNODE_HAVE_MPI

// Same code, empty message: "already reported by rank 0" (RunModelCommand prints nothing).
absl::Status Quiet(const absl::Status& s) { return absl::Status(s.code(), ""); }

std::atomic<bool> g_shard_stop{false};
void OnShardSignal(int) { g_shard_stop.store(true); }

// Checks every rank makes alike, before any weights load.
absl::Status CheckCluster(const ServeConfig& cfg, int world_size) {
  const Topology& t = cfg.topology;
  if (world_size != t.world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "the config %s needs %d ranks, mpirun started %d (use mpirun -np %d)", cfg.source,
        t.world_size, world_size, t.world_size));
  }
  if (t.groups.size() != 1) {
    return absl::UnimplementedError(absl::StrFormat(
        "%s describes %d groups; serving several draft/target groups is not implemented yet "
        "(the engine has one target): use one group",
        cfg.source, t.groups.size()));
  }
  const GroupTopology& g = t.groups[0];
  std::vector<const RankPlacement*> placed = {&g.draft};
  for (const RankPlacement& p : g.target) placed.push_back(&p);
  for (const RankPlacement* p : placed) {
    if (p->device != "cpu") {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s places rank %d on %s, which is not available: this build of specnode runs the "
          "forward pass on cpu only (use device: cpu)",
          cfg.source, p->rank, p->device));
    }
  }
  // The TP split, from the GGUF header only (the file is mapped, no weight page is read).
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(cfg.model));
  SPECNODE_ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfig::FromGguf(*file));
  absl::StatusOr<ShardPlan> plan = ShardPlan::Create(config, static_cast<int>(g.target.size()));
  if (!plan.ok()) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "%s: a tensor-parallel target over %d ranks does not fit %s: %s", cfg.source,
        g.target.size(), cfg.model, plan.status().message()));
  }
  return absl::OkStatus();
}

void ShutdownShards(ControlChannel* channel, const std::vector<int>& ranks,
                    const std::string& reason) {
  const std::string frame = EncodeControl(ShutdownMessage{reason});
  for (int r : ranks) (void)channel->Send(r, frame, 1.0, absl::StrFormat("target rank %d", r));
}

absl::Status RunCoordinator(const ServeConfig& cfg, const std::vector<int>& target_ranks) {
  ControlChannel channel;
  absl::StatusOr<std::unique_ptr<ModelSession>> session =
      ModelSession::Open(cfg.model, cfg.threads, false, cfg.kv);
  if (!session.ok()) {
    ShutdownShards(&channel, target_ranks, "rank 0 failed to start");
    return session.status();
  }
  const LlamaModel& m = (*session)->model();
  RemoteTargetOptions ro;
  ro.shard_ranks = target_ranks;
  ro.timeout_s = cfg.topology.timeout_s;
  ro.model = {m.file().file_size(), m.file().tensors().size(), m.config().vocab_size,
              m.config().n_layers};
  ro.vocab_size = m.config().vocab_size;
  ro.max_positions = m.config().context_length;
  absl::StatusOr<std::unique_ptr<RemoteTargetRunner>> runner =
      RemoteTargetRunner::Connect(&channel, ro);
  if (!runner.ok()) {
    ShutdownShards(&channel, target_ranks, "rank 0 failed to start");
    return runner.status();
  }
  std::vector<RankInfo> ranks = {{0, "coordinator", getpid(), ThisHost()}};
  for (const ShardInfo& s : (*runner)->shards()) {
    ranks.push_back({s.world_rank, "target", s.pid, s.host});
  }
  absl::Status st = ServeNode(cfg, session->get(), runner->get(), ranks);
  // A target lost during the drain still ends the job as a failure.
  if (st.ok() && !(*runner)->broken().ok()) st = (*runner)->broken();
  if (st.ok()) {
    (*runner)->Shutdown("rank 0 drained");
    return st;
  }
  if (!(*runner)->broken().ok()) {
    // A rank is gone or hung: MPI_Finalize could wait for it forever. End the whole job.
    std::fprintf(stderr, "specnode serve: the target failed: %s; ending the job\n",
                 std::string(st.message()).c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  (*runner)->Shutdown("rank 0 failed");
  return st;
}

absl::Status RunShard(const ServeConfig& cfg, int world_rank, const std::vector<int>& ranks) {
  struct sigaction sa = {};
  sa.sa_handler = OnShardSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  ShardWorkerOptions o;
  o.model_path = cfg.model;
  o.threads = cfg.threads;
  o.kv = cfg.kv;
  o.world_rank = world_rank;
  o.tp_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), world_rank) - ranks.begin());
  o.tp_size = static_cast<int>(ranks.size());
  o.timeout_s = cfg.topology.timeout_s;
  o.stop = &g_shard_stop;
  CommunicatorOptions co;
  // Every collective's deadline, and the check-in's: the shards reach it together (after
  // the same header-only checks), before loading any weights.
  co.timeout_s = cfg.topology.timeout_s;
  absl::StatusOr<std::unique_ptr<MpiCommunicator>> comm =
      MpiCommunicator::CreateFromWorldRanks(ranks, co);
  if (!comm.ok()) {
    std::fprintf(stderr, "specnode serve (rank %d): %s\n", world_rank,
                 std::string(comm.status().message()).c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  ControlChannel channel;
  bool started = false;
  absl::Status st = RunShardWorker(o, comm->get(), &channel, &started);
  if (st.ok()) return st;
  if (!started) return Quiet(st);  // rank 0 reports it (HelloAck)
  std::fprintf(stderr, "specnode serve (rank %d): %s; ending the job\n", world_rank,
               std::string(st.message()).c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
  return st;
}

#endif  // SPECNODE_HAVE_MPI

}  // namespace

bool NeedsCluster(const ServeConfig& cfg) {
  return !cfg.topology.single_process() || LaunchedWorldSize() > 1;
}

absl::Status RunServeCluster(const ServeConfig& cfg) {
  const Topology& t = cfg.topology;
  const int launched = LaunchedWorldSize();
  if (launched == 0) {
    return absl::FailedPreconditionError(absl::StrFormat(
        "%s describes a %d-rank layout: start it with `mpirun -np %d specnode serve --config "
        "%s` (this process was not started by mpirun)",
        cfg.source, t.world_size, t.world_size, cfg.source));
  }
#ifndef SPECNODE_HAVE_MPI
  return absl::UnimplementedError(absl::StrFormat(
      "%s describes a %d-rank layout (mpirun -np %d), but this specnode was built without MPI",
      cfg.source, t.world_size, t.world_size));
#else
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<MpiEnvironment> env,
                            MpiEnvironment::Init(nullptr, nullptr));
  const int rank = env->world_rank();
  absl::Status pre = CheckCluster(cfg, env->world_size());
  if (pre.ok() && env->provided() < MPI_THREAD_SERIALIZED) {
    pre = absl::FailedPreconditionError(
        "the MPI library does not provide MPI_THREAD_SERIALIZED (rank 0's scheduler thread "
        "talks to the target ranks)");
  }
  absl::Status st = pre;
  if (!pre.ok()) {
    if (rank != 0) st = Quiet(pre);  // every rank failed alike; rank 0 says why
  } else {
    std::vector<int> target_ranks;
    for (const RankPlacement& p : t.groups[0].target) target_ranks.push_back(p.rank);
    st = rank == 0 ? RunCoordinator(cfg, target_ranks) : RunShard(cfg, rank, target_ranks);
  }
  // Print before MPI_Finalize (env's destructor): once every rank has finalised, mpirun
  // tears the job down as soon as one exits non-zero, and a later print could be lost.
  if (!st.ok() && !st.message().empty()) {
    if (rank == 0) {
      std::fprintf(stderr, "specnode serve: %s\n", std::string(st.message()).c_str());
    } else {
      std::fprintf(stderr, "specnode serve (rank %d): %s\n", rank,
                   std::string(st.message()).c_str());
    }
    std::fflush(stderr);
    st = Quiet(st);
  }
  return st;
#endif
}

}  // namespace specnode
