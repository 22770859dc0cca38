// Where the ranks of an mpirun job land and which GPU each opens: `serve --check-config`'s
// check of a topology (cluster_config.h) against the GPUs every node's ranks will see
// (docs/serving.md, "Multi-node GPU launch (2 nodes x 8 GPUs)").
//
// The mapping is the documented launch's, `mpirun --map-by ppr:R:node` (ranks in order,
// OpenMPI's default `--rank-by slot`): rank r runs on node r / R as local rank r % R
// (its OMPI_COMM_WORLD_LOCAL_RANK). specnode does not read the local rank: a rank placed on
// `cuda:N` opens the N-th GPU its process sees, i.e. the N-th entry of CUDA_VISIBLE_DEVICES
// when that is set, else the node's GPU N. Every rank of a node sees the same list (mpirun
// -x forwards one CUDA_VISIBLE_DEVICES to every rank).
//
// Pure: the caller supplies each node's GPUs (node/serve/gpu_inventory.h reads this host's).
#pragma once

#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "model/llama/device.h"
#include "node/serve/cluster_config.h"

namespace specnode {

// The GPUs one node's ranks see, in the CUDA runtime's order: visible[N] is the GPU that
// `cuda:N` opens, named as the node numbers it ("3") or as CUDA_VISIBLE_DEVICES named it (a
// "GPU-..." or "MIG-..." UUID). Two equal names are one physical GPU.
struct NodeGpus {
  std::vector<std::string> visible;
  std::string origin;  // how the list was found, for messages: "--gpus-per-node 8", ...
  std::string note;    // what CUDA_VISIBLE_DEVICES hid, "" if nothing
};

// CUDA_VISIBLE_DEVICES as written ("0,1", "GPU-8f3a...,GPU-1c2b...", "" for none): its
// entries in order, whitespace around each stripped. InvalidArgument when an entry repeats
// (CUDA does not document what a repeat does; a layout must not rely on it).
absl::StatusOr<std::vector<std::string>> ParseCudaVisibleDevices(const std::string& text);

// A node with `gpus` GPUs (0..gpus-1) as a process there sees it with CUDA_VISIBLE_DEVICES
// = `cuda_visible_devices` (nullopt: unset, every GPU in order). Set, CUDA's rule applies:
// the listed GPUs in the listed order, up to the first entry naming none of them (an index
// >= gpus, or neither an index nor a UUID), which CUDA hides with every entry after it
// (said in `note`). A UUID entry is taken as one of the node's GPUs: only the node can
// tell. InvalidArgument for gpus < 0 or a repeated entry.
absl::StatusOr<NodeGpus> NodeWithGpus(int gpus,
                                      const std::optional<std::string>& cuda_visible_devices,
                                      std::string origin);

// What a CUDA runtime that reports `count` devices (CUDA_VISIBLE_DEVICES already applied)
// shows: visible[N] is CUDA_VISIBLE_DEVICES' entry N when it is set, else "N".
// InvalidArgument for count < 0, a repeated entry, or more devices than entries.
absl::StatusOr<NodeGpus> NodeSeenByRuntime(int count,
                                           const std::optional<std::string>& cuda_visible_devices,
                                           std::string origin);

// One placement of a rank: its draft or target role in one group. Rank 0 has one per group
// whose draft it runs (and is the coordinator); other ranks have one.
struct RankGpu {
  int rank = 0;
  int node = 0;        // rank / ranks_per_node
  int local_rank = 0;  // rank % ranks_per_node: OMPI_COMM_WORLD_LOCAL_RANK under ppr:R:node
  std::string host;    // the config's `host` for this placement, "" if none
  std::string role;    // "coordinator + draft of group a", "target of group a (TP rank 2 of 7)"
  Device device;
  std::string gpu;      // what `cuda:N` opens on its node (NodeGpus::visible[N]); "" otherwise
  std::string problem;  // why this placement would fail; "" when it would not
};

struct GpuLayout {
  int world_size = 1;
  int ranks_per_node = 1;
  std::string ranks_per_node_origin;  // "--ranks-per-node 8", "the config's hosts", ...
  std::vector<NodeGpus> nodes;        // [node]: what that node's ranks see
  std::vector<RankGpu> ranks;         // by rank, then group order
  std::string hint;                   // advice when the hosts disagree with the mapping

  bool ok() const;
  std::vector<int> FailingRanks() const;  // ascending, each once
};

// True when some rank of `t` is placed on a GPU (the layout check is about those).
bool UsesGpus(const Topology& t);

// The ranks per node the config's `host` names imply: when every rank names a host and, in
// rank order, the names form runs of one length R (the last may be shorter) with no name
// repeated across runs, R; otherwise nullopt.
std::optional<int> RanksPerNodeFromHosts(const Topology& t);

// Places every rank of `t` with `ranks_per_node` ranks per node and node i's GPUs in
// nodes[i]; needs ceil(world_size / ranks_per_node) entries. Each placement's problem, if
// any: `cuda:N` beyond its node's visible GPUs; a GPU that another rank of its node also
// opens (one GPU per rank); a `host` different from the one another rank of its node
// names, or the same as a rank's on another node. InvalidArgument for ranks_per_node < 1
// or the wrong number of nodes.
absl::StatusOr<GpuLayout> PlanGpuLayout(const Topology& t, int ranks_per_node,
                                        std::string ranks_per_node_origin,
                                        std::vector<NodeGpus> nodes);

// The layout as text, one line each: the mapping, each node's GPUs (one line when all
// nodes are alike), every placement ("rank 9: node 1 (host nodeB), local rank 1, target of
// group nodeB (TP rank 0 of 7), cuda:1 = GPU 1" or "..., cuda:1: <problem>"). Lines start
// with `indent` except the first.
std::string DescribeGpuLayout(const GpuLayout& layout, const std::string& indent);

// "0-7, 9, 12-13".
std::string RankRanges(const std::vector<int>& ascending);

}  // namespace specnode
