// mkernel — where a communication of the step runs, reduced to what the simulator needs (docs/planner.md,
// "Communication").
//
// Every instance of a group set runs at once (the data-parallel reduction of every tensor-parallel rank, the
// tensor-parallel collective of every replica). On the rail-optimised fabric of mk::Topology instances meet where
// their GPUs share a NIC (or its PCIe link) and on the uplink of a leaf (one per leaf and rail) that several
// instances cross. So the simulated set is instance 0 plus every instance reachable from it through shared NICs,
// and the simulated cluster keeps only the nodes, GPUs and NICs that set uses, with each node's leaf kept (nodes
// of one leaf stay together, nodes of different leaves stay apart). The other instances crossing its uplinks are
// not simulated when they are of its class (the same leaf pattern) and every uplink it crosses is shared alike:
// each instance then takes the same share of every uplink, and the reduced cluster's uplinks are scaled to that
// share (its oversubscription divided by it). Otherwise they are simulated with it. By the symmetry of the
// layout every other set of instances takes the same time.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/topology/topology.hpp"
#include "mk/workload/lowering.hpp"

namespace mk::plan {

/// Instance 0 of a group set and the instances it shares NICs with, on a reduced cluster.
struct ConcurrentPlacement {
  uint32_t groupSize = 0;   ///< ranks per instance
  uint32_t instances = 0;   ///< instances simulated together
  uint32_t groupNodes = 0;  ///< nodes instance 0 spans
  bool multiNode = false;   ///< instance 0 crosses nodes (uses the network)
  /// Node (0 .. groupNodes - 1, in order of appearance) of each rank of instance 0, as generate() takes it.
  std::vector<uint32_t> partNodeOf;
  /// The cluster the generator's choice is priced on: instance 0 alone, groupSize / groupNodes GPUs per node
  /// and the NICs it uses.
  Topology choice;
  /// The cluster simulated: the nodes, GPUs and NICs the instances use, leaves kept.
  Topology reduced;
  std::vector<uint32_t> nodeOf;             ///< node in `reduced` of each simulated rank
  std::vector<std::vector<uint32_t>> maps;  ///< instance i's rank j is simulated rank maps[i][j]
  /// The simulated set's share of the leaf uplinks it crosses (1: crosses none or shares none); `reduced`'s
  /// oversubscription is the cluster's divided by it.
  double uplinkShare = 1;
};

/// Place `groups` of a stage on `cluster` (ranks node-major: rank r on node r / GPUs per node). Throws
/// Error(Unsupported) naming the group for placements the reduction cannot represent (instances of different
/// shapes, nodes that use different GPUs, a NIC sharing pattern the platform's even split cannot express).
/// `everyInstance`: simulate every instance, uplinks unscaled (the full simulation the reduction is checked on).
ConcurrentPlacement placeConcurrent(const GroupSet& groups, const Topology& cluster, bool everyInstance = false);

/// A stable text of everything a simulation of the placement depends on (for cache keys): the reduced cluster
/// (NIC and fabric fields dropped when it is one node), the simulated ranks' nodes and the maps.
std::string placementKey(const ConcurrentPlacement& p);

}  // namespace mk::plan
