// mkernel — concurrent instances of a communication on a reduced cluster (placement.hpp).
#include "mk/plan/placement.hpp"

#include <algorithm>
#include <deque>
#include <map>
#include <set>

#include "mk/error.hpp"
#include "mk/sim/platform.hpp"

namespace mk::plan {

namespace {

[[noreturn]] void unsupported(const GroupSet& g, const std::string& what) {
  throw Error(ErrorCode::Unsupported, "the " + g.name + " groups: " + what);
}

/// NIC of a GPU: the simulated platform's rail rule (GPUs share a node's NICs evenly).
uint32_t railOf(uint32_t local, const NodeSpec& n) {
  sim::Platform p;
  p.gpusPerNode = n.gpus;
  p.nicsPerNode = n.nics;
  return p.railOf(local);
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

}  // namespace

ConcurrentPlacement placeConcurrent(const GroupSet& groups, const Topology& cluster) {
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

  // The instances that share a NIC with instance 0, transitively (only instances that use the network).
  std::vector<uint32_t> chosen{0};
  if (p.multiNode && node.nics > 0) {
    std::map<uint64_t, std::vector<uint32_t>> byNic;
    for (uint32_t i = 0; i < groups.instances.size(); ++i)
      for (uint32_t r : groups.instances[i]) byNic[uint64_t{r / G} * node.nics + railOf(r % G, node)].push_back(i);
    std::vector<bool> in(groups.instances.size(), false);
    in[0] = true;
    std::deque<uint32_t> todo{0};
    while (!todo.empty()) {
      const uint32_t i = todo.front();
      todo.pop_front();
      for (uint32_t r : groups.instances[i])
        for (uint32_t j : byNic[uint64_t{r / G} * node.nics + railOf(r % G, node)])
          if (!in[j]) {
            in[j] = true;
            chosen.push_back(j);
            todo.push_back(j);
          }
    }
    std::sort(chosen.begin(), chosen.end());
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
  }
  p.reduced.node.gpus = static_cast<uint32_t>(U.size());
  if (!p.multiNode || node.nics == 0) {
    p.reduced.node.nics = 0;  // one node: no network path is ever taken
  } else {
    std::vector<uint32_t> rails;
    for (uint32_t u : U) rails.push_back(railOf(u, node));
    rails.erase(std::unique(rails.begin(), rails.end()), rails.end());  // U sorted, railOf monotone
    p.reduced.node.nics = static_cast<uint32_t>(rails.size());
    for (uint32_t i = 0; i < U.size(); ++i) {
      const uint32_t want =
          static_cast<uint32_t>(std::lower_bound(rails.begin(), rails.end(), railOf(U[i], node)) - rails.begin());
      if (want != railOf(i, p.reduced.node))
        unsupported(groups, "its GPUs share NICs in a way an even split over " + std::to_string(rails.size()) +
                                " NICs cannot express");
    }
  }
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
  p.choice.node.gpus = p.groupSize / p.groupNodes;
  if (!p.multiNode || node.nics == 0) {
    p.choice.node.nics = 0;
  } else {
    std::set<uint32_t> rails0;
    for (uint32_t r : first) rails0.insert(railOf(r % G, node));
    p.choice.node.nics = std::min<uint32_t>(p.choice.node.gpus, static_cast<uint32_t>(rails0.size()));
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
