#include "node/cluster/serve_cluster.h"

#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <string>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "coordinator/model_drafter.h"
#include "model/gguf/gguf_reader.h"
#include "model/llama/llama_config.h"
#include "model/status_macros.h"
#include "runtime/runner_factory.h"

#ifdef SPECNODE_HAVE_MPI
#include <mpi.h>

#include "node/cluster/control_channel.h"
#include "node/cluster/remote_target_runner.h"
#include "node/cluster/shard_worker.h"
#include "node/cluster/transport_check.h"
#include "node/serve/loading_listeners.h"
#include "node/serve/serve_node.h"
#include "node/serve/startup_summary.h"
#include "tensor-parallel/mpi_check.h"
#include "tensor-parallel/mpi_communicator.h"
#include "tensor-parallel/mpi_layer.h"
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

// The start-up check's bound on each wait: topology.timeout_s, but never less than this
// (a first contact over a fabric can take a while to set up).
constexpr double kTransportCheckMinTimeoutS = 30.0;
void OnShardSignal(int) { g_shard_stop.store(true); }

// A draft spec that runs inside the coordinator (no model file of its own).
bool CoordinatorDraft(const DraftSpec& spec) { return !spec.is_model(); }

// What one rank does in the job.
struct Role {
  enum class Kind { kCoordinator, kTarget, kDraft } kind = Kind::kCoordinator;
  std::string model;    // the file a shard serves
  std::vector<int> tp;  // the shard's TP group (world ranks in TP order)
  Device device;
};

Role RoleOf(const ServeConfig& cfg, int rank) {
  Role role;
  if (rank == 0) return role;
  for (const GroupTopology& g : cfg.topology.groups) {
    if (g.draft.rank == rank) return {Role::Kind::kDraft, cfg.draft.path, {rank}, g.draft.device};
    for (const RankPlacement& p : g.target) {
      if (p.rank != rank) continue;
      role = {Role::Kind::kTarget, cfg.model, {}, p.device};
      for (const RankPlacement& q : g.target) role.tp.push_back(q.rank);
      return role;
    }
  }
  return role;  // unreachable: CheckCluster matched the world size to the ranks 0..n-1
}

std::vector<int> NonCoordinatorRanks(const Topology& t) {
  std::vector<int> ranks;
  for (int r = 1; r < t.world_size; ++r) ranks.push_back(r);
  return ranks;
}

void ShutdownShards(ControlChannel* channel, const std::vector<int>& ranks,
                    const std::string& reason) {
  const std::string frame = EncodeControl(ShutdownMessage{reason});
  for (int r : ranks) (void)channel->Send(r, frame, 1.0, absl::StrFormat("rank %d", r));
}

ModelFingerprint FingerprintOf(const LlamaModel& m) {
  return {m.file().file_size(), m.file().tensors().size(), m.config().vocab_size,
          m.config().n_layers};
}

// Ctrl-C in mpirun's terminal (SIGINT or SIGTERM to mpirun): OpenMPI sends every rank
// SIGCONT at once, SIGTERM odls_base_sigkill_timeout (T, default 1) seconds later and SIGKILL
// after another T. Rank 0 drains from the SIGCONT (serve_node.cc), so the drain gets 2T less
// a margin; mpirun hands MCA parameters to the ranks' environment, so rank 0 can say at
// start-up what T would give the whole serve.drain_timeout_s.
// The start-up line of a group's TP target: the plan, and per rank its device, host,
// weight bytes (the plan's, from the file's header) and the KV budget it sized.
absl::StatusOr<std::string> TargetRanks(const GroupTopology& g, const LlamaModel& m,
                                        const std::vector<ShardInfo>& shards) {
  SPECNODE_ASSIGN_OR_RETURN(
      const ShardPlan plan,
      ShardPlan::ForFile(m.file(), m.config(), static_cast<int>(g.target.size())));
  std::vector<RankMemory> ranks;
  for (const ShardInfo& s : shards) {
    if (s.tp_rank < 0 || s.tp_rank >= plan.size()) continue;
    ranks.push_back({s.world_rank, g.target[s.tp_rank].device.name(), s.host,
                     plan.rank(s.tp_rank).weight_bytes(), s.kv_capacity_bytes});
  }
  return TargetRanksLine(g.name, plan.Summary(), ranks);
}

void WarnIfMpirunKillsBeforeTheDrain(const ServeConfig& cfg) {
  const double t = MpirunSigkillTimeoutS();
  const double window = MpirunTeardownWindowS();
  if (window >= cfg.drain_timeout_s) return;
  std::fprintf(stderr,
               "specnode serve: warning: Ctrl-C on mpirun SIGKILLs every rank %g s later "
               "(2 x odls_base_sigkill_timeout): requests still running after %g s then end "
               "with a `cancelled` reply instead of finishing (serve.drain_timeout_s %g). "
               "Start mpirun with --mca odls_base_sigkill_timeout %d for the whole drain "
               "(docs/serving.md)\n",
               2 * t, window, cfg.drain_timeout_s,
               static_cast<int>(std::ceil((cfg.drain_timeout_s + 1.0) / 2)));
}

// Rank 0: connects every group's target (and remote draft), then serves.
absl::Status RunCoordinator(const ServeConfig& cfg) {
  WarnIfMpirunKillsBeforeTheDrain(cfg);
  ControlChannel channel;
  const Topology& t = cfg.topology;
  std::vector<RemoteTargetRunner*> remotes;  // every remote runner, owned below
  std::vector<std::unique_ptr<RemoteTargetRunner>> targets;
  std::vector<ServeGroup> groups;
  auto fail_start = [&](absl::Status st) {
    for (RemoteTargetRunner* r : remotes) r->Shutdown("rank 0 failed to start");
    ShutdownShards(&channel, NonCoordinatorRanks(t), "rank 0 failed to start");
    return st;
  };
  // Health answers "loading" (503) while the ranks load and connect.
  absl::StatusOr<std::unique_ptr<LoadingListeners>> loading = LoadingListeners::Start(cfg);
  if (!loading.ok()) return fail_start(loading.status());
  absl::StatusOr<std::unique_ptr<ModelSession>> session =
      ModelSession::Open(cfg.model, cfg.threads, false, cfg.kv,
                         ComputeOptions{cfg.activations, Device::Cpu(), cfg.chat_template});
  if (!session.ok()) return fail_start(session.status());
  const LlamaModel& m = (*session)->model();
  auto connect = [&](const std::vector<int>& ranks, const LlamaModel& model,
                     const char* what) -> absl::StatusOr<std::unique_ptr<RemoteTargetRunner>> {
    RemoteTargetOptions ro;
    ro.shard_ranks = ranks;
    ro.timeout_s = t.timeout_s;
    ro.model = FingerprintOf(model);
    ro.vocab_size = model.config().vocab_size;
    ro.max_positions = model.config().context_length;
    ro.role = what;
    SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<RemoteTargetRunner> r,
                              RemoteTargetRunner::Connect(&channel, ro));
    remotes.push_back(r.get());
    return r;
  };
  std::vector<RankInfo> ranks = {{0, "coordinator", getpid(), ThisHost()}};
  for (const GroupTopology& g : t.groups) {
    std::vector<int> tp;
    for (const RankPlacement& p : g.target) tp.push_back(p.rank);
    absl::StatusOr<std::unique_ptr<RemoteTargetRunner>> target = connect(tp, m, "target");
    if (!target.ok()) return fail_start(target.status());
    for (const ShardInfo& s : (*target)->shards()) {
      ranks.push_back({s.world_rank, "target", s.pid, s.host});
    }
    if (absl::StatusOr<std::string> line = TargetRanks(g, m, (*target)->shards()); line.ok()) {
      std::fprintf(stderr, "specnode serve: %s\n", line->c_str());
    }
    ServeGroup group;
    group.name = g.name;
    group.target = target->get();
    targets.push_back(*std::move(target));
    // A draft model file drafts through a runner of its own: on its rank (a one-rank shard
    // worker) or on rank 0's GPU. Drafts on rank 0's CPU are made by ServeNode.
    ModelDrafter::ConnectFn connect_draft;
    if (g.draft.rank != 0) {
      const int draft_rank = g.draft.rank;
      connect_draft =
          [&, draft_rank](const LlamaModel& d) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<RemoteTargetRunner> r,
                                  connect({draft_rank}, d, "draft"));
        const ShardInfo& s = r->shards()[0];
        ranks.push_back({s.world_rank, "draft", s.pid, s.host});
        return std::unique_ptr<ModelRunner>(std::move(r));
      };
    } else if (!g.draft.device.is_cpu()) {
      connect_draft = [&cfg, device = g.draft.device](
                          const LlamaModel& d) -> absl::StatusOr<std::unique_ptr<ModelRunner>> {
        RunnerOptions ro;
        ro.device = device;
        ro.kv = cfg.kv;
        SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<LocalModelRunner> r,
                                  MakeRunner(d.config(), d.weights(), ro));
        return std::unique_ptr<ModelRunner>(std::move(r));
      };
    }
    if (connect_draft) {
      absl::StatusOr<std::unique_ptr<LlamaModel>> draft = LlamaModel::Load(cfg.draft.path);
      if (!draft.ok()) return fail_start(draft.status());
      absl::StatusOr<std::unique_ptr<ModelDrafter>> drafter =
          ModelDrafter::Remote(*std::move(draft), cfg.draft.path, m, connect_draft);
      if (!drafter.ok()) return fail_start(drafter.status());
      group.drafter = *std::move(drafter);
    }
    groups.push_back(std::move(group));
  }
  // groups (and the remote draft runners inside their drafters) outlive ServeNode: every
  // runner in `remotes` is shut down below, on success and on failure alike.
  (*loading)->Stop();  // ServeNode binds the addresses again, serving
  absl::Status st = ServeNode(cfg, session->get(), groups, ranks);
  absl::Status lost;
  for (RemoteTargetRunner* r : remotes) {
    if (lost.ok()) lost = r->broken();
  }
  // A rank lost during the drain still ends the job as a failure.
  if (st.ok() && !lost.ok()) st = lost;
  if (!lost.ok()) {
    // A rank is gone or hung: MPI_Finalize could wait for it forever. End the whole job.
    std::fprintf(stderr, "specnode serve: the target failed: %s; ending the job\n",
                 std::string(st.message()).c_str());
    std::fflush(stderr);
    MPI_Abort(MPI_COMM_WORLD, 1);
  }
  for (RemoteTargetRunner* r : remotes) r->Shutdown(st.ok() ? "rank 0 drained" : "rank 0 failed");
  return st;
}

// SPECNODE_TRANSPORT_CHECK_FAULT=<rank> (testing, transport_check.h): the rank whose echo
// of the start-up check's large frame comes back changed. -1 when unset.
absl::StatusOr<int> TransportFaultRank(int world_size) {
  const char* v = std::getenv("SPECNODE_TRANSPORT_CHECK_FAULT");
  if (v == nullptr || *v == '\0') return -1;
  int rank = -1;
  if (!absl::SimpleAtoi(v, &rank) || rank < 1 || rank >= world_size) {
    return absl::InvalidArgumentError(absl::StrFormat(
        "SPECNODE_TRANSPORT_CHECK_FAULT=%s: expected a rank from 1 to %d", v, world_size - 1));
  }
  return rank;
}

// Every rank, before any weights load: the MPI layer's start-up check (transport_check.h).
// A failure is printed by each rank that sees it, naming the layer and the setting that
// works, and ends the job at once: its peers may be waiting on it.
void CheckTransportOrAbort(const ServeConfig& cfg, int rank, int world_size, int fault_rank) {
  TransportCheckOptions o;
  o.timeout_s = std::max(cfg.topology.timeout_s, kTransportCheckMinTimeoutS);
  o.corrupt_echo_rank = fault_rank;
  ControlChannel channel;
  const absl::Status st = CheckMpiTransport(&channel, rank, world_size, o);
  const MpiLayer layer = CurrentMpiLayer();
  if (st.ok()) {
    if (rank == 0) {
      std::fprintf(stderr, "specnode serve: MPI: %s; %s: %d ranks passed the start-up check\n",
                   layer.library.c_str(), layer.Describe().c_str(), world_size);
    }
    return;
  }
  const std::string who = rank == 0 ? "" : absl::StrFormat(" (rank %d)", rank);
  std::fprintf(stderr, "specnode serve%s: %s\n", who.c_str(),
               std::string(RefuseMpiLayer(st, layer).message()).c_str());
  std::fflush(stderr);
  MPI_Abort(MPI_COMM_WORLD, 1);
}

absl::Status RunShard(const ServeConfig& cfg, int world_rank, const Role& role) {
  struct sigaction sa = {};
  sa.sa_handler = OnShardSignal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, nullptr);
  sigaction(SIGTERM, &sa, nullptr);
  const std::vector<int>& ranks = role.tp;
  ShardWorkerOptions o;
  o.model_path = role.model;
  o.threads = cfg.threads;
  o.activations = cfg.activations;
  o.device = role.device;
  o.kv = cfg.kv;
  o.world_rank = world_rank;
  o.tp_rank = static_cast<int>(std::find(ranks.begin(), ranks.end(), world_rank) - ranks.begin());
  o.tp_size = static_cast<int>(ranks.size());
  o.timeout_s = cfg.topology.timeout_s;
  o.stop = &g_shard_stop;
  o.stop_grace_s = cfg.drain_timeout_s + kStopGraceMarginS;
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

absl::Status CheckCluster(const ServeConfig& cfg, int world_size) {
  const Topology& t = cfg.topology;
  if (world_size != t.world_size) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the config %s needs %d ranks, mpirun started %d (use mpirun -np %d)",
                        cfg.source, t.world_size, world_size, t.world_size));
  }
  // What each rank's device can do (a CUDA build, the KV mode, activations; with `model`,
  // its architecture too), as far as it can be told here: whether the GPU itself is there
  // is the rank's own check.
  auto check_ranks = [&](const LlamaConfig* model) -> absl::Status {
    for (const GroupTopology& g : t.groups) {
      std::vector<const RankPlacement*> placed = {&g.draft};
      for (const RankPlacement& p : g.target) placed.push_back(&p);
      for (const RankPlacement* p : placed) {
        RunnerOptions ro;
        ro.device = p->device;
        ro.kv = cfg.kv;
        ro.activations = cfg.activations;
        if (absl::Status st = CheckRunnerOptions(ro, model, /*probe_device=*/false); !st.ok()) {
          return absl::Status(st.code(), absl::StrFormat("%s places rank %d on %s: %s", cfg.source,
                                                         p->rank, p->device.name(), st.message()));
        }
      }
    }
    return absl::OkStatus();
  };
  for (const GroupTopology& g : t.groups) {
    // Devices: shard ranks (targets, draft-model ranks) may take a GPU in a CUDA build, a
    // TP group all alike; rank 0 only for a draft model file (n-gram and self drafts are
    // part of the coordinator, which runs on the CPU).
    if (g.draft.rank == 0 && !g.draft.device.is_cpu() && CoordinatorDraft(cfg.draft)) {
      return absl::FailedPreconditionError(absl::StrFormat(
          "%s places rank 0 on %s, but the draft '%s' runs inside the coordinator on the CPU "
          "(use device: cpu, or a draft model file)",
          cfg.source, g.draft.device.name(), cfg.draft.text()));
    }
    for (const RankPlacement& p : g.target) {
      if (p.device.is_cpu() != g.target[0].device.is_cpu()) {
        return absl::InvalidArgumentError(
            absl::StrFormat("%s: group %s mixes cpu and cuda target ranks (%d on %s, %d on %s): a "
                            "tensor-parallel group runs on one kind of device",
                            cfg.source, g.name, g.target[0].rank, g.target[0].device.name(), p.rank,
                            p.device.name()));
      }
    }
    if (g.draft.rank != 0 && CoordinatorDraft(cfg.draft)) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: group %s places its draft on rank %d, but the draft '%s' runs inside the "
          "coordinator: place it on rank 0 (draft: {rank: 0}), or give a draft model file",
          cfg.source, g.name, g.draft.rank, cfg.draft.text()));
    }
  }
  // Placements first (a bad one is refused without the model), then what needs its header.
  SPECNODE_RETURN_IF_ERROR(check_ranks(nullptr));
  // The target's shape, from the GGUF header only (the file is mapped, no weight page read).
  SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> file, GgufFile::Open(cfg.model));
  SPECNODE_ASSIGN_OR_RETURN(LlamaConfig config, LlamaConfig::FromGguf(*file));
  SPECNODE_RETURN_IF_ERROR(check_ranks(&config));
  for (const GroupTopology& g : t.groups) {
    absl::StatusOr<ShardPlan> plan = ShardPlan::Create(config, static_cast<int>(g.target.size()));
    if (!plan.ok()) {
      return absl::InvalidArgumentError(absl::StrFormat(
          "%s: group %s: a tensor-parallel target over %d ranks does not fit %s: %s", cfg.source,
          g.name, g.target.size(), cfg.model, plan.status().message()));
    }
    if (g.draft.rank != 0) {
      SPECNODE_ASSIGN_OR_RETURN(std::unique_ptr<GgufFile> draft, GgufFile::Open(cfg.draft.path));
      SPECNODE_RETURN_IF_ERROR(LlamaConfig::FromGguf(*draft).status());
    }
  }
  return absl::OkStatus();
}

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
  absl::StatusOr<int> fault_rank = TransportFaultRank(env->world_size());
  if (pre.ok() && !fault_rank.ok()) pre = fault_rank.status();
  if (pre.ok()) CheckTransportOrAbort(cfg, rank, env->world_size(), *fault_rank);
  absl::Status st = pre;
  if (!pre.ok()) {
    if (rank != 0) st = Quiet(pre);  // every rank failed alike; rank 0 says why
  } else {
    st = rank == 0 ? RunCoordinator(cfg) : RunShard(cfg, rank, RoleOf(cfg, rank));
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
