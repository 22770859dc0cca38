// ServeNode: the serving node on rank 0, or in a single process — front end + scheduler +
// speculative engine over the groups' targets — and ServeGroup, one group of it.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "coordinator/drafter.h"
#include "node/serve/cluster_config.h"
#include "node/serve/frontend.h"
#include "node/session/model_session.h"
#include "runtime/model_runner.h"

namespace specnode {

// One group of the serving node: a target (local, or TP shards on other ranks) and its
// drafter. A null drafter means "the config's draft, built in this process" (none: the
// group decodes directly).
struct ServeGroup {
  std::string name;
  ModelRunner* target = nullptr;  // not owned
  std::unique_ptr<Drafter> drafter;
};

// Front end + scheduler + engine over `groups` (at least one; the router spreads requests
// over them, see SpeculativeEngine), until SIGINT/SIGTERM (OK after the drain) or until a
// target is lost (that error). `ranks` (empty for one process) is listed in `health`.
// Does not return when the scheduler thread is stuck in the engine at the stop (not back
// within FrontendOptions::stop_wait_s after the drain limit): every request in flight is
// answered `unavailable` on both front doors, then the process ends with std::quick_exit(1)
// (no destructors: see ExitWithStuckScheduler in serve_node.cc).
// `groups` stays owned by the caller (ServeNode adds the drafters it makes to it), so that a
// remote draft runner outlives ServeNode and can still be shut down afterwards.
absl::Status ServeNode(const ServeConfig& cfg, ModelSession* session,
                       std::vector<ServeGroup>& groups, std::vector<RankInfo> ranks);

// The model ids the OpenAI API serves: serve.served_model_name, else the model file's name
// without its directory and ".gguf". Never empty; [0] is the metrics' model_name label.
std::vector<std::string> ServedModelNames(const ServeConfig& cfg);

// The longest sequence (prompt + completion) served: serve.max_model_len, else the target's
// context. InvalidArgument when max_model_len exceeds the target's context length.
absl::StatusOr<int32_t> EffectiveMaxModelLen(const ServeConfig& cfg, int32_t context_length);

// mpirun's teardown on Ctrl-C (OpenMPI 4.1): SIGCONT to every rank at once, SIGTERM
// odls_base_sigkill_timeout (T, seconds, default 1; mpirun passes it in the ranks'
// environment) later, SIGKILL after another T.
double MpirunSigkillTimeoutS();
// The drain a rank gets from that SIGCONT: 2T less a 1 s margin for the step in flight, the
// last replies and the shards' Shutdown (at least 0.1 s).
double MpirunTeardownWindowS();

}  // namespace specnode
