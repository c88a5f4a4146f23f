// mkernel — a cluster (mk::Topology) as a SimGrid 3.32 platform, built in C++ (docs/simulator.md).
//
// Two routing worlds share one root zone and never route into each other:
//  * NVLink: one star zone per node ("n3"); a host per GPU ("n3.gpu5") with two cores (memory pipe and
//    tensor pipe, see replay.cpp); an NVSwitch node gives every GPU a split-duplex link to the star's centre
//    ("n3.nvl5"), a direct-link node (switched = false) a split-duplex link per GPU pair ("n3.nvl0-1").
//  * Network: a star zone "fabric" whose children are the rail leaves ("rail5.leaf0"; rail i = NIC i of every
//    node's NIC list, nicsOf()); a leaf holds one endpoint host per (GPU, NIC) pair of its nodes ("n3.gpu5.net"
//    for a GPU's first NIC, "n3.gpu5.net2" for NIC 2 when it is not the first) whose up path is the GPU's PCIe
//    link ("n3.pcie5"), the uplinks of the PCIe switches on the way ("n3.pcieSw1"), and the NIC's link
//    ("n3.nic5"), so GPUs served by one NIC share it; the leaf reaches the (aggregated, non-blocking) spine layer
//    through one split-duplex uplink ("rail5.leaf0.up") of nodesPerLeaf x NIC bandwidth / oversubscription.
// Every link has zero latency: CM02 shares a bottleneck in inverse proportion to route latency, so latency
// is paid explicitly by the replay (profile alphas) to keep sharing fair.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/topology/topology.hpp"

namespace simgrid::s4u {
class Host;
class Link;
}  // namespace simgrid::s4u

namespace mk::sim {

/// SimGrid settings every run uses, applied by configureEngine().
struct EngineConfig {
  bool verbose = false;         ///< SimGrid log threshold "info" instead of "critical"
  uint32_t actorStackKiB = 32;  ///< contexts/stack-size: actors are small loops; 10k+ of them must fit
};

/// Pin the network model (network/model:CM02, network/crosstraffic:0, network/TCP-gamma:0), the log threshold
/// and the actor stack size. Call once, in a process that has created an Engine and no platform yet.
void configureEngine(const EngineConfig& cfg);

/// Link bandwidths of the platform, bytes per second (per direction). Derived once from a topology and a
/// profile by platformRates().
struct PlatformRates {
  double nvlinkBps = 0;      ///< per GPU (switched) or per GPU pair (direct links): profile.nvlink.bwGBs based
  double pcieBps = 0;        ///< GPU <-> NIC
  double nicBps = 0;         ///< NIC 0's port (nicBpsOf: every NIC's)
  double leafUplinkBps = 0;  ///< one rail-0 leaf to the spine layer
  /// profile.network.bwGBs / nodeNetworkAloneGBs of the topology (1 = datasheet): every network link's factor
  double networkScale = 1;
  std::vector<double> nicBpsOf;     ///< [nic] its port, scaled
  std::vector<double> switchBpsOf;  ///< [PCIe switch] its uplink, scaled
};

/// The profile calibrates, the topology gives structure: NVLink links carry profile.nvlink.bwGBs; the network
/// path's datasheet bandwidths (PCIe, PCIe switches, NICs, leaf uplinks) are scaled by one factor so that what one
/// GPU's path gives alone (nodeNetworkAloneGBs) equals profile.network.bwGBs; sharing then comes from the links. Throws
/// Error(InvalidArgument) naming the field when a needed rate is not > 0.
PlatformRates platformRates(const Topology& topo, const Profile& profile);

/// Handles into a built platform. Ranks of a schedule map onto GPUs with placeRanks() (replay.hpp).
struct Platform {
  uint32_t nodes = 0;                           ///< Topology::nodes
  uint32_t gpusPerNode = 0;                     ///< NodeSpec::gpus
  uint32_t nodesPerLeaf = 1;                    ///< FabricSpec::nodesPerLeaf
  uint32_t nicsPerNode = 0;                     ///< NodeSpec::nics (= rails)
  std::vector<std::vector<uint32_t>> gpuRails;  ///< [local GPU] its NICs (= rails), gpuNics(); empty: even rule
  double switchLatencyUs = 0;                   ///< FabricSpec::switchLatencyUs (paid per extra hop by the replay)
  PlatformRates rates;                          ///< the link bandwidths used
  std::vector<simgrid::s4u::Host*> gpu;         ///< [node * gpusPerNode + local]: executes steps, NVLink endpoint
  std::vector<simgrid::s4u::Host*>
      net;  ///< same index: network endpoint behind PCIe + its first NIC (empty: single node)
  /// Same index: an endpoint per NIC of the GPU, in gpuRails order (net[g] == netVia[g][0]). A ProxyPut is
  /// striped evenly over them: stripe j leaves through NIC j of the sender and enters the receiver's NIC
  /// j mod (its NIC count).
  std::vector<std::vector<simgrid::s4u::Host*>> netVia;

  /// Rail (= NIC index within the node) of GPU `local`'s first NIC: gpuRails when set, else the even rule
  /// (local * nics / gpus).
  uint32_t railOf(uint32_t local) const noexcept;
  /// Rail of stripe `stripe` of GPU `local` (its NIC stripe mod its NIC count).
  uint32_t railOf(uint32_t local, uint32_t stripe) const noexcept;
  /// Switch hops a route between the NICs of two GPUs takes beyond the one leaf of a same-rail, same-leaf
  /// route: 0 there, 2 (spine + second leaf) otherwise. The replay adds hops x switchLatencyUs to the profile's
  /// network alpha, which describes a same-leaf route.
  uint32_t extraSwitchHops(uint32_t gpuA, uint32_t gpuB) const noexcept;
  /// The same for stripe `stripe` of a transfer from gpuA to gpuB.
  uint32_t extraSwitchHops(uint32_t gpuA, uint32_t gpuB, uint32_t stripe) const noexcept;
};

/// Build the platform of `topo` in the running process's Engine (configureEngine() first); ends with the root
/// zone's seal(). Throws Error(InvalidArgument) for a topology the model cannot represent (a multi-node cluster
/// without NICs, a needed rate of 0). With `nvlink` false the NVLink links and routes
/// are left out (the GPU hosts stay, to run the lanes): fast mode never simulates an NVLink transfer, and
/// SimGrid checks every new link's name against all earlier ones, so a third fewer links saves about half of
/// that quadratic cost at 8192 GPUs.
Platform buildPlatform(const Topology& topo, const Profile& profile, bool nvlink = true);

/// Names of the links of the route between two hosts, in order ("n0.nvl0_UP", "n0.nvl1_DOWN"): for tests and
/// --verbose output.
std::vector<std::string> routeLinks(const simgrid::s4u::Host* from, const simgrid::s4u::Host* to);

}  // namespace mk::sim
