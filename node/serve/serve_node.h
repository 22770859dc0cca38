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
// `groups` stays owned by the caller (ServeNode adds the drafters it makes to it), so that a
// remote draft runner outlives ServeNode and can still be shut down afterwards.
absl::Status ServeNode(const ServeConfig& cfg, ModelSession* session,
                       std::vector<ServeGroup>& groups, std::vector<RankInfo> ranks);

}  // namespace specnode
