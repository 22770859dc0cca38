#include "node/serve/gpu_layout.h"

#include <algorithm>
#include <map>
#include <set>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"

namespace specnode {
namespace {

bool IsUuid(const std::string& e) { return e.rfind("GPU-", 0) == 0 || e.rfind("MIG-", 0) == 0; }

// A decimal index entry's value; nullopt for anything else (signs, spaces, UUIDs).
std::optional<int> IndexOf(const std::string& e) {
  int n = 0;
  if (e.empty() || e.find_first_not_of("0123456789") != std::string::npos ||
      !absl::SimpleAtoi(e, &n)) {
    return std::nullopt;
  }
  return n;
}

std::vector<std::string> FirstN(int n) {
  std::vector<std::string> v;
  for (int i = 0; i < n; ++i) v.push_back(std::to_string(i));
  return v;
}

// "GPU 3" for the node's numbering, the UUID itself otherwise.
std::string GpuName(const std::string& id) { return IsUuid(id) ? id : absl::StrCat("GPU ", id); }

std::string NodeGpusText(const NodeGpus& g) {
  std::string s =
      absl::StrFormat("%d GPU%s visible", g.visible.size(), g.visible.size() == 1 ? "" : "s");
  if (!g.visible.empty() && g.visible != FirstN(static_cast<int>(g.visible.size()))) {
    absl::StrAppend(&s, ": ", absl::StrJoin(g.visible, ","));
  }
  absl::StrAppend(&s, " (", g.origin, ")");
  if (!g.note.empty()) absl::StrAppend(&s, "; ", g.note);
  return s;
}

void AddProblem(RankGpu* p, const std::string& why) {
  p->problem = p->problem.empty() ? why : absl::StrCat(p->problem, "; ", why);
}

// Every placement of `t`, one per (rank, device), roles of the same pair joined; by rank.
std::vector<RankGpu> Placements(const Topology& t) {
  std::vector<RankGpu> out;
  auto add = [&out](const RankPlacement& p, std::string role) {
    for (RankGpu& q : out) {
      if (q.rank != p.rank || q.device != p.device) continue;
      absl::StrAppend(&q.role, ", ", role);
      if (q.host.empty()) q.host = p.host;
      return;
    }
    RankGpu g;
    g.rank = p.rank;
    g.host = p.host;
    g.device = p.device;
    g.role = p.rank == 0 ? absl::StrCat("coordinator + ", role) : std::move(role);
    out.push_back(std::move(g));
  };
  for (const GroupTopology& g : t.groups) {
    add(g.draft, absl::StrCat("draft of group ", g.name));
    for (size_t i = 0; i < g.target.size(); ++i) {
      add(g.target[i],
          absl::StrFormat("target of group %s (TP rank %d of %d)", g.name, i, g.target.size()));
    }
  }
  std::stable_sort(out.begin(), out.end(),
                   [](const RankGpu& a, const RankGpu& b) { return a.rank < b.rank; });
  return out;
}

// One GPU per rank: a GPU of a node that several ranks open fails each of them.
void MarkSharedGpus(std::vector<RankGpu>* ranks) {
  std::map<std::pair<int, std::string>, std::set<int>> users;
  for (const RankGpu& p : *ranks) {
    if (!p.gpu.empty()) users[{p.node, p.gpu}].insert(p.rank);
  }
  for (RankGpu& p : *ranks) {
    if (p.gpu.empty()) continue;
    std::vector<int> others;
    for (int r : users[{p.node, p.gpu}]) {
      if (r != p.rank) others.push_back(r);
    }
    if (others.empty()) continue;
    AddProblem(&p, absl::StrFormat("%s of node %d is opened by rank%s %s too (one GPU per rank)",
                                   GpuName(p.gpu), p.node, others.size() == 1 ? "" : "s",
                                   RankRanges(others)));
  }
}

// A node's host is the one its lowest-numbered rank naming a host names; a rank naming
// another, or a host another node already has, fails. Returns whether any did.
bool MarkHostsAgainstNodes(std::vector<RankGpu>* ranks, int n_nodes) {
  std::vector<const RankGpu*> node_host(n_nodes, nullptr);
  for (const RankGpu& p : *ranks) {
    if (!p.host.empty() && node_host[p.node] == nullptr) node_host[p.node] = &p;
  }
  bool any = false;
  for (RankGpu& p : *ranks) {
    if (p.host.empty()) continue;
    const RankGpu* mine = node_host[p.node];
    if (mine->host != p.host) {
      AddProblem(&p, absl::StrFormat("host %s, but it lands on node %d, whose rank %d names "
                                     "host %s",
                                     p.host, p.node, mine->rank, mine->host));
      any = true;
      continue;
    }
    for (int k = 0; k < p.node; ++k) {
      if (node_host[k] == nullptr || node_host[k]->host != p.host) continue;
      AddProblem(&p, absl::StrFormat("host %s, but it lands on node %d and rank %d, on node "
                                     "%d, names host %s too",
                                     p.host, p.node, node_host[k]->rank, k, p.host));
      any = true;
      break;
    }
  }
  return any;
}

}  // namespace

absl::StatusOr<std::vector<std::string>> ParseCudaVisibleDevices(const std::string& text) {
  std::vector<std::string> entries;
  if (absl::StripAsciiWhitespace(text).empty()) return entries;
  std::set<std::string> seen;
  for (absl::string_view raw : absl::StrSplit(text, ',')) {
    std::string e(absl::StripAsciiWhitespace(raw));
    if (const std::optional<int> i = IndexOf(e)) e = std::to_string(*i);  // "01" is GPU 1
    if (!e.empty() && !seen.insert(e).second) {
      return absl::InvalidArgumentError(
          absl::StrFormat("CUDA_VISIBLE_DEVICES=%s lists %s twice (what CUDA makes of a repeat "
                          "is not documented: list each GPU once)",
                          text, e));
    }
    entries.push_back(std::move(e));
  }
  return entries;
}

absl::StatusOr<NodeGpus> NodeWithGpus(int gpus,
                                      const std::optional<std::string>& cuda_visible_devices,
                                      std::string origin) {
  if (gpus < 0)
    return absl::InvalidArgumentError(absl::StrCat("a node cannot have ", gpus, " GPUs"));
  NodeGpus node;
  node.origin = std::move(origin);
  if (!cuda_visible_devices.has_value()) {
    node.visible = FirstN(gpus);
    return node;
  }
  absl::StatusOr<std::vector<std::string>> entries = ParseCudaVisibleDevices(*cuda_visible_devices);
  if (!entries.ok()) return entries.status();
  for (size_t i = 0; i < entries->size(); ++i) {
    const std::string& e = (*entries)[i];
    const std::optional<int> index = IndexOf(e);
    if ((index.has_value() && *index < gpus) || IsUuid(e)) {
      node.visible.push_back(e);
      continue;
    }
    const size_t after = entries->size() - i - 1;
    node.note = absl::StrFormat(
        "CUDA_VISIBLE_DEVICES entry \"%s\" names none of the node's %d GPUs: CUDA hides it%s", e,
        gpus,
        after == 0   ? ""
        : after == 1 ? " and the entry after it"
                     : absl::StrFormat(" and the %d entries after it", after));
    break;
  }
  return node;
}

absl::StatusOr<NodeGpus> NodeSeenByRuntime(int count,
                                           const std::optional<std::string>& cuda_visible_devices,
                                           std::string origin) {
  if (count < 0) return absl::InvalidArgumentError(absl::StrCat("a device count of ", count));
  NodeGpus node;
  node.origin = std::move(origin);
  if (!cuda_visible_devices.has_value()) {
    node.visible = FirstN(count);
    return node;
  }
  absl::StatusOr<std::vector<std::string>> entries = ParseCudaVisibleDevices(*cuda_visible_devices);
  if (!entries.ok()) return entries.status();
  if (static_cast<size_t>(count) > entries->size()) {
    return absl::InvalidArgumentError(
        absl::StrFormat("the CUDA runtime reports %d devices, but CUDA_VISIBLE_DEVICES=%s lists %d",
                        count, *cuda_visible_devices, entries->size()));
  }
  node.visible.assign(entries->begin(), entries->begin() + count);
  if (static_cast<size_t>(count) < entries->size()) {
    node.note = absl::StrFormat("CUDA_VISIBLE_DEVICES lists %d, the runtime shows %d",
                                entries->size(), count);
  }
  return node;
}

bool GpuLayout::ok() const { return FailingRanks().empty(); }

std::vector<int> GpuLayout::FailingRanks() const {
  std::set<int> failing;
  for (const RankGpu& p : ranks) {
    if (!p.problem.empty()) failing.insert(p.rank);
  }
  return {failing.begin(), failing.end()};
}

bool UsesGpus(const Topology& t) {
  for (const GroupTopology& g : t.groups) {
    if (!g.draft.device.is_cpu()) return true;
    for (const RankPlacement& p : g.target) {
      if (!p.device.is_cpu()) return true;
    }
  }
  return false;
}

std::optional<int> RanksPerNodeFromHosts(const Topology& t) {
  std::vector<std::string> host(t.world_size);
  for (const RankGpu& p : Placements(t)) {
    if (p.rank < t.world_size && host[p.rank].empty()) host[p.rank] = p.host;
  }
  std::vector<int> runs;
  std::set<std::string> seen;
  for (int r = 0; r < t.world_size; ++r) {
    if (host[r].empty()) return std::nullopt;
    if (r > 0 && host[r] == host[r - 1]) {
      ++runs.back();
      continue;
    }
    if (!seen.insert(host[r]).second) return std::nullopt;
    runs.push_back(1);
  }
  if (runs.empty()) return std::nullopt;
  for (size_t i = 0; i + 1 < runs.size(); ++i) {
    if (runs[i] != runs[0]) return std::nullopt;
  }
  if (runs.back() > runs[0]) return std::nullopt;
  return runs[0];
}

absl::StatusOr<GpuLayout> PlanGpuLayout(const Topology& t, int ranks_per_node,
                                        std::string ranks_per_node_origin,
                                        std::vector<NodeGpus> nodes) {
  if (ranks_per_node < 1) {
    return absl::InvalidArgumentError(
        absl::StrCat("ranks per node must be >= 1, got ", ranks_per_node));
  }
  const int n_nodes = (t.world_size + ranks_per_node - 1) / ranks_per_node;
  if (static_cast<int>(nodes.size()) != n_nodes) {
    return absl::InvalidArgumentError(
        absl::StrFormat("%d ranks at %d per node need %d nodes' GPUs, got %d", t.world_size,
                        ranks_per_node, n_nodes, nodes.size()));
  }
  GpuLayout layout;
  layout.world_size = t.world_size;
  layout.ranks_per_node = ranks_per_node;
  layout.ranks_per_node_origin = std::move(ranks_per_node_origin);
  layout.nodes = std::move(nodes);
  layout.ranks = Placements(t);
  for (RankGpu& p : layout.ranks) {
    p.node = p.rank / ranks_per_node;
    p.local_rank = p.rank % ranks_per_node;
    if (p.device.is_cpu()) continue;
    const std::vector<std::string>& visible = layout.nodes[p.node].visible;
    if (p.device.index < static_cast<int>(visible.size())) {
      p.gpu = visible[p.device.index];
    } else {
      AddProblem(&p, absl::StrFormat("does not exist on node %d (%d GPU%s visible)", p.node,
                                     visible.size(), visible.size() == 1 ? "" : "s"));
    }
  }
  MarkSharedGpus(&layout.ranks);
  if (MarkHostsAgainstNodes(&layout.ranks, n_nodes)) {
    const std::optional<int> r = RanksPerNodeFromHosts(t);
    layout.hint =
        r.has_value() && *r != ranks_per_node
            ? absl::StrFormat(
                  "the config's hosts hold %d ranks each: check with "
                  "--ranks-per-node %d and launch with mpirun --map-by ppr:%d:node",
                  *r, *r, *r)
            : "mpirun --map-by ppr:R:node puts ranks 0..R-1 on the hostfile's first node, the "
              "next R on the second, ...: the config's hosts must follow that order";
  }
  return layout;
}

std::string DescribeGpuLayout(const GpuLayout& l, const std::string& indent) {
  const int n_nodes = static_cast<int>(l.nodes.size());
  const int r = l.ranks_per_node;
  std::vector<std::string> lines;
  lines.push_back(absl::StrFormat(
      "%d ranks on %d node%s, %d per node (%s): mpirun --map-by ppr:%d:node puts rank r on "
      "node r / %d as local rank r %% %d",
      l.world_size, n_nodes, n_nodes == 1 ? "" : "s", r, l.ranks_per_node_origin, r, r, r));
  bool alike = true;
  for (const NodeGpus& g : l.nodes) {
    alike = alike && g.visible == l.nodes[0].visible && g.origin == l.nodes[0].origin &&
            g.note == l.nodes[0].note;
  }
  if (alike && !l.nodes.empty()) {
    lines.push_back(
        absl::StrCat(n_nodes == 1 ? "the node: " : "each node: ", NodeGpusText(l.nodes[0])));
  } else {
    for (int k = 0; k < n_nodes; ++k) {
      lines.push_back(absl::StrFormat("node %d: %s", k, NodeGpusText(l.nodes[k])));
    }
  }
  for (const RankGpu& p : l.ranks) {
    std::string line = absl::StrFormat("rank %d: node %d%s, local rank %d, %s, %s", p.rank, p.node,
                                       p.host.empty() ? "" : absl::StrCat(" (host ", p.host, ")"),
                                       p.local_rank, p.role, p.device.name());
    if (!p.gpu.empty()) absl::StrAppend(&line, " = ", GpuName(p.gpu));
    if (!p.problem.empty()) absl::StrAppend(&line, ": ", p.problem);
    lines.push_back(std::move(line));
  }
  if (!l.hint.empty()) lines.push_back(absl::StrCat("(", l.hint, ")"));
  return absl::StrJoin(lines, absl::StrCat("\n", indent));
}

std::string RankRanges(const std::vector<int>& ascending) {
  std::vector<std::string> parts;
  for (size_t i = 0; i < ascending.size();) {
    size_t j = i;
    while (j + 1 < ascending.size() && ascending[j + 1] == ascending[j] + 1) ++j;
    parts.push_back(j == i ? std::to_string(ascending[i])
                           : absl::StrCat(ascending[i], "-", ascending[j]));
    i = j + 1;
  }
  return absl::StrJoin(parts, ", ");
}

}  // namespace specnode
