// mkernel — concurrent instances of a communication on a reduced cluster (placement.hpp).
#include "mk/plan/placement.hpp"

#include <algorithm>
#include <cstdint>
#include <map>
#include <optional>
#include <set>

#include "mk/error.hpp"

namespace mk::plan {

namespace {

/// The largest oversubscription validateTopology accepts: a share scaling an uplink past it is simulated whole.
constexpr double kMaxScaledOversubscription = 1e3;

[[noreturn]] void unsupported(const GroupSet& g, const std::string& what) {
  throw Error(ErrorCode::Unsupported, "the " + g.name + " groups: " + what);
}

/// The node with only the local GPUs `keep` (ascending), renumbered 0.., their NICs in the list form (each
/// with the kept GPUs it serves) and the PCIe switches on their paths; no NICs when `network` is false (one node:
/// no network path is ever taken).
NodeSpec restrictNode(const NodeSpec& n, const std::vector<uint32_t>& keep, bool network) {
  NodeSpec r = n;
  r.gpus = static_cast<uint32_t>(keep.size());
  r.nicList.clear();
  r.pcieSwitches.clear();
  r.nics = 0;
  if (!network) return r;
  std::map<uint32_t, uint32_t> gpuAt;  // old local index -> new
  for (uint32_t i = 0; i < keep.size(); ++i) gpuAt[keep[i]] = i;
  const std::vector<NicSpec> nics = nicsOf(n);
  std::map<uint32_t, uint32_t> nicAt;  // old NIC index -> new
  for (uint32_t i = 0; i < nics.size(); ++i) {
    NicSpec nic = nics[i];
    nic.gpus.clear();
    for (uint32_t g : nics[i].gpus)
      if (gpuAt.count(g)) nic.gpus.push_back(gpuAt[g]);
    if (nic.gpus.empty()) continue;
    nicAt[i] = static_cast<uint32_t>(r.nicList.size());
    r.nicList.push_back(std::move(nic));
  }
  r.nics = static_cast<uint32_t>(r.nicList.size());
  for (const PcieSwitchSpec& sw : n.pcieSwitches) {
    PcieSwitchSpec k{sw.bwGBs, {}, {}};
    for (uint32_t g : sw.gpus)
      if (gpuAt.count(g)) k.gpus.push_back(gpuAt[g]);
    for (uint32_t i : sw.nics)
      if (nicAt.count(i)) k.nics.push_back(nicAt[i]);
    if (!k.gpus.empty() || !k.nics.empty()) r.pcieSwitches.push_back(std::move(k));
  }
  return r;
}

/// What a GPU's network transfers share with other GPUs of its node: its NICs, and the PCIe switches on its path
/// (ids: NICs first, then switches).
std::vector<std::vector<uint32_t>> sharedResources(const NodeSpec& n) {
  auto out = gpuNics(n);
  const uint32_t nicCount = static_cast<uint32_t>(nicsOf(n).size());
  for (uint32_t s = 0; s < n.pcieSwitches.size(); ++s) {
    std::set<uint32_t> onPath(n.pcieSwitches[s].gpus.begin(), n.pcieSwitches[s].gpus.end());
    for (uint32_t g = 0; g < n.gpus; ++g)
      for (uint32_t i : out[g])
        if (std::find(n.pcieSwitches[s].nics.begin(), n.pcieSwitches[s].nics.end(), i) != n.pcieSwitches[s].nics.end())
          onPath.insert(g);
    for (uint32_t g : onPath)
      if (g < n.gpus) out[g].push_back(nicCount + s);
  }
  return out;
}

std::vector<uint32_t> normalizedNodes(const std::vector<uint32_t>& ranks, uint32_t gpusPerNode) {
  std::map<uint32_t, uint32_t> seen;
  std::vector<uint32_t> out;
  for (uint32_t r : ranks) {
    const uint32_t node = r / gpusPerNode;
    auto it = seen.emplace(node, static_cast<uint32_t>(seen.size())).first;
    out.push_back(it->second);
  }
  return out;
}

/// The instances reachable from instance 0 through a shared resource, ascending: `resources(i, r, emit)` calls
/// emit(id) for what rank r of instance i passes through on the network. Resources are found in one sorted list
/// of (resource, instance): a layout search places every collective of thousands of layouts, and a map of
/// vectors per resource made its allocations the planner's largest cost.
template <typename Resources>
std::vector<uint32_t> closureOf(const GroupSet& groups, Resources resources) {
  std::vector<std::pair<uint64_t, uint32_t>> users;
  for (uint32_t i = 0; i < groups.instances.size(); ++i)
    for (uint32_t r : groups.instances[i]) resources(i, r, [&](uint64_t x) { users.emplace_back(x, i); });
  std::sort(users.begin(), users.end());
  std::vector<bool> in(groups.instances.size(), false);
  in[0] = true;
  std::vector<uint32_t> chosen{0};
  for (std::size_t next = 0; next < chosen.size(); ++next)
    for (uint32_t r : groups.instances[chosen[next]])
      resources(chosen[next], r, [&](uint64_t x) {
        for (auto it = std::lower_bound(users.begin(), users.end(), std::make_pair(x, uint32_t{0}));
             it != users.end() && it->first == x; ++it)
          if (!in[it->second]) {
            in[it->second] = true;
            chosen.push_back(it->second);
          }
      });
  std::sort(chosen.begin(), chosen.end());
  return chosen;
}

/// The leaf uplinks (one per leaf and rail) of a group set: which instances cross leaves (instances inside one
/// leaf never reach an uplink) and how many of their ranks load each uplink.
struct UplinkLoad {
  std::vector<uint32_t> all;                   ///< per uplink (leaf x rails + rail): ranks of crossing instances
  std::vector<bool> crosses;                   ///< per instance: spans more than one leaf
  std::vector<std::vector<uint32_t>> railsOf;  ///< per local GPU: its NICs (rails)
  uint32_t gpus = 0, perLeaf = 1, rails = 0;
  /// Calls emit(uplink) for each uplink of global rank `rank`.
  template <typename Emit>
  void uplinksOf(uint32_t rank, Emit emit) const {
    for (uint32_t rail : railsOf[rank % gpus]) emit(uint64_t{rank / gpus / perLeaf} * rails + rail);
  }
};

UplinkLoad uplinkLoad(const GroupSet& groups, const Topology& cluster) {
  UplinkLoad u;
  u.gpus = cluster.node.gpus;
  u.perLeaf = std::max<uint32_t>(1, cluster.fabric.nodesPerLeaf);
  u.railsOf = gpuNics(cluster.node);
  u.rails = static_cast<uint32_t>(nicsOf(cluster.node).size());
  uint32_t lastRank = 0;
  for (const auto& ranks : groups.instances)
    for (uint32_t r : ranks) lastRank = std::max(lastRank, r);
  u.all.assign((uint64_t{lastRank} / u.gpus / u.perLeaf + 1) * u.rails, 0);
  const uint32_t perLeafGpus = u.gpus * u.perLeaf;
  for (const auto& ranks : groups.instances) {
    const bool crosses = std::any_of(ranks.begin(), ranks.end(),
                                     [&](uint32_t r) { return r / perLeafGpus != ranks.front() / perLeafGpus; });
    u.crosses.push_back(crosses);
    if (!crosses) continue;
    for (uint32_t r : ranks) u.uplinksOf(r, [&](uint64_t x) { ++u.all[x]; });
  }
  return u;
}

/// The fraction of its uplinks' bandwidth the instances `chosen` get when every instance crossing those uplinks
/// is in their class (the same leaf pattern as instance 0) and every uplink they use is shared alike (the same
/// ranks of theirs and in all on each): each then takes the same share of every uplink, so the set runs alone on
/// uplinks scaled by that share. 1 when they cross no uplink; nullopt when the sharing is not uniform.
std::optional<double> uplinkShare(const GroupSet& groups, const UplinkLoad& u, const std::vector<uint32_t>& chosen) {
  std::map<uint64_t, uint32_t> mine;
  for (uint32_t i : chosen)
    if (u.crosses[i])
      for (uint32_t r : groups.instances[i]) u.uplinksOf(r, [&](uint64_t x) { ++mine[x]; });
  if (mine.empty()) return 1.0;
  const uint32_t own = mine.begin()->second, total = u.all[mine.begin()->first];
  for (const auto& [x, n] : mine)
    if (n != own || u.all[x] != total) return std::nullopt;
  if (own == total) return 1.0;  // nobody else on its uplinks
  const uint32_t perLeafGpus = u.gpus * u.perLeaf;
  const std::vector<uint32_t> pattern = normalizedNodes(groups.instances[0], perLeafGpus);
  for (uint32_t i = 0; i < groups.instances.size(); ++i) {
    if (!u.crosses[i]) continue;
    bool meets = false;
    for (uint32_t r : groups.instances[i]) u.uplinksOf(r, [&](uint64_t x) { meets = meets || mine.count(x) > 0; });
    // Another class on one of its uplinks: that load is not an image of its own.
    if (meets && normalizedNodes(groups.instances[i], perLeafGpus) != pattern) return std::nullopt;
  }
  return static_cast<double>(own) / static_cast<double>(total);
}

}  // namespace

ConcurrentPlacement placeConcurrent(const GroupSet& groups, const Topology& cluster, bool everyInstance) {
  if (groups.instances.empty() || groups.instances[0].empty()) unsupported(groups, "no instance");
  const NodeSpec& node = cluster.node;
  const uint32_t G = node.gpus;
  ConcurrentPlacement p;
  const auto& first = groups.instances[0];
  p.groupSize = static_cast<uint32_t>(first.size());
  p.partNodeOf = normalizedNodes(first, G);
  p.groupNodes = *std::max_element(p.partNodeOf.begin(), p.partNodeOf.end()) + 1;
  p.multiNode = p.groupNodes > 1;
  if (p.groupSize % p.groupNodes != 0) unsupported(groups, "instance 0 holds a different number of ranks per node");

  // The instances that share a NIC (or a PCIe switch on the network path) with instance 0, transitively (only
  // instances that use the network); then the leaf uplinks they share with the other instances of their class
  // (docs/planner.md, "Communication").
  std::vector<uint32_t> chosen{0};
  if (everyInstance) {
    chosen.resize(groups.instances.size());
    for (uint32_t i = 0; i < chosen.size(); ++i) chosen[i] = i;
  } else if (p.multiNode && node.nics > 0) {
    const auto shared = sharedResources(node);
    const uint64_t kinds = nicsOf(node).size() + node.pcieSwitches.size();
    auto nicsOfRank = [&](uint32_t, uint32_t r, auto emit) {
      for (uint32_t x : shared[r % G]) emit(uint64_t{r / G} * kinds + x);
    };
    chosen = closureOf(groups, nicsOfRank);
    const UplinkLoad uplinks = uplinkLoad(groups, cluster);
    const std::optional<double> share = uplinkShare(groups, uplinks, chosen);
    const double scaled = cluster.fabric.oversubscription / share.value_or(1.0);
    if (share && scaled <= kMaxScaledOversubscription) {
      p.uplinkShare = *share;
    } else {
      // Sharing the reduction cannot scale: every instance meeting the set on an uplink is simulated with it.
      constexpr uint64_t kUplink = uint64_t{1} << 63;  // uplink ids apart from the NICs' node x kinds ids
      chosen = closureOf(groups, [&](uint32_t i, uint32_t r, auto emit) {
        nicsOfRank(i, r, emit);
        if (uplinks.crosses[i]) uplinks.uplinksOf(r, [&](uint64_t x) { emit(kUplink | x); });
      });
    }
  }
  p.instances = static_cast<uint32_t>(chosen.size());
  for (uint32_t i : chosen)
    if (groups.instances[i].size() != p.groupSize || normalizedNodes(groups.instances[i], G) != p.partNodeOf)
      unsupported(groups, "instance " + std::to_string(i) + " is shaped unlike instance 0 across nodes");

  // The GPUs the set uses: the same local indices on every node it touches.
  std::map<uint32_t, std::set<uint32_t>> localsOf;
  for (uint32_t i : chosen)
    for (uint32_t r : groups.instances[i]) localsOf[r / G].insert(r % G);
  const std::set<uint32_t> used = localsOf.begin()->second;
  for (const auto& [n, locals] : localsOf)
    if (locals != used)
      unsupported(groups, "node " + std::to_string(n) + " uses other GPUs than node " +
                              std::to_string(localsOf.begin()->first) + " (choose a GPU count that fills nodes)");
  const std::vector<uint32_t> U(used.begin(), used.end());

  // Nodes: leaves kept. Node n sits under leaf n / nodesPerLeaf of every rail.
  const uint32_t perLeaf = cluster.fabric.nodesPerLeaf;
  std::map<uint32_t, uint32_t> reducedNode;
  std::map<uint32_t, std::vector<uint32_t>> byLeaf;
  for (const auto& [n, locals] : localsOf) byLeaf[n / perLeaf].push_back(n);
  uint32_t leafIdx = 0;
  for (const auto& [leaf, nodes] : byLeaf) {
    for (uint32_t pos = 0; pos < nodes.size(); ++pos)
      reducedNode[nodes[pos]] = leafIdx * perLeaf + static_cast<uint32_t>(pos);
    ++leafIdx;
  }
  uint32_t reducedNodes = 0;
  for (const auto& [n, rn] : reducedNode) reducedNodes = std::max(reducedNodes, rn + 1);

  p.reduced = cluster;
  p.reduced.nodes = reducedNodes;
  if (byLeaf.size() == 1) {
    // Under one leaf no route reaches the spine: the uplinks' size does not matter, so it is fixed here and
    // what-ifs on oversubscription or leaf size share this simulation.
    p.reduced.fabric.oversubscription = 1;
    p.reduced.fabric.nodesPerLeaf = std::max<uint32_t>(1, reducedNodes);
  } else {
    // The instances of its class not simulated take their share of every uplink the set crosses.
    p.reduced.fabric.oversubscription = cluster.fabric.oversubscription / p.uplinkShare;
  }
  p.reduced.node = restrictNode(node, U, p.multiNode && node.nics > 0);
  validateTopology(p.reduced);

  // Simulated ranks: ordered by (reduced node, local GPU), so that the node-major placement of the replay puts
  // rank k of a node on the k-th GPU kept.
  std::vector<std::pair<uint64_t, uint32_t>> order;  // (sort key, global rank)
  for (uint32_t i : chosen)
    for (uint32_t r : groups.instances[i]) order.push_back({uint64_t{reducedNode[r / G]} * G + r % G, r});
  std::sort(order.begin(), order.end());
  std::map<uint32_t, uint32_t> simRank;
  for (uint32_t k = 0; k < order.size(); ++k) {
    simRank[order[k].second] = k;
    p.nodeOf.push_back(reducedNode[order[k].second / G]);
  }
  for (uint32_t i : chosen) {
    std::vector<uint32_t> m;
    for (uint32_t r : groups.instances[i]) m.push_back(simRank[r]);
    p.maps.push_back(std::move(m));
  }

  // Instance 0 alone, for the generator's choice (closed forms price one instance).
  p.choice = cluster;
  p.choice.nodes = p.groupNodes;
  {
    // Its GPUs on its first node (every node of an instance holds as many: checked above).
    std::set<uint32_t> locals0;
    const uint32_t firstNode = first[0] / G;
    for (uint32_t r : first)
      if (r / G == firstNode) locals0.insert(r % G);
    p.choice.node =
        restrictNode(node, std::vector<uint32_t>(locals0.begin(), locals0.end()), p.multiNode && node.nics > 0);
  }
  validateTopology(p.choice);
  return p;
}

std::string placementKey(const ConcurrentPlacement& p) {
  Topology t = p.reduced;
  if (!p.multiNode) {  // one node: the NICs and the fabric are never used
    t.node.nic = NicSpec{};
    t.node.pcie = PcieSpec{};
    t.fabric = FabricSpec{};
  }
  t.name.clear();
  std::string key = topologyToJson(t, -1) + "|nodes";
  for (uint32_t n : p.nodeOf) key += "," + std::to_string(n);
  key += "|maps";
  for (const auto& m : p.maps) {
    key += ";";
    for (uint32_t r : m) key += std::to_string(r) + ",";
  }
  return key;
}

}  // namespace mk::plan
