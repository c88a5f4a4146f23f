// mkernel — cluster description: nodes of identical GPUs, NVLink, PCIe, NICs and a rail-optimised fabric.
//
// Units everywhere: bandwidth in GB/s (1e9 bytes/s) per direction, latency in microseconds.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace mk {

/// NVLink of one GPU.
struct NvlinkSpec {
  double bwGBs = 0;       ///< per GPU, per direction, to the switch (or summed over direct links)
  double latencyUs = 0;   ///< one-way, GPU store to peer visibility
  bool switched = false;  ///< true: NVSwitch backplane (all-to-all at full bw); false: direct links
};

/// PCIe between a GPU and its NIC.
struct PcieSpec {
  double bwGBs = 0;
  double latencyUs = 0;
};

/// One NIC (one per rail).
struct NicSpec {
  double bwGBs = 0;  ///< per direction (400 Gb/s = 50 GB/s)
  double latencyUs = 0;
};

/// Inter-node fabric: rail-optimised leaf/spine. Rail g connects NIC g of every node to leaf switches of
/// rail g; leaves connect to spines with `oversubscription` = leaf down-bandwidth / up-bandwidth.
struct FabricSpec {
  std::string kind = "rail-leaf-spine";
  uint32_t nodesPerLeaf = 32;     ///< leaf radix towards nodes (per rail)
  double oversubscription = 1.0;  ///< >= 1; 1 = non-blocking
  double switchLatencyUs = 0.5;   ///< per switch hop
};

/// One node type: GPU model and count, links, NICs.
struct NodeSpec {
  std::string gpu;        ///< "NVIDIA H200"
  uint32_t gpus = 0;      ///< per node
  uint32_t sms = 0;       ///< streaming multiprocessors per GPU
  double bf16Tflops = 0;  ///< dense bf16 tensor peak per GPU
  double hbmGBs = 0;      ///< HBM bandwidth per GPU
  NvlinkSpec nvlink;
  PcieSpec pcie;
  uint32_t nics = 0;  ///< per node (0 = single-node system)
  NicSpec nic;
};

/// A cluster of `nodes` identical nodes.
struct Topology {
  std::string name;  ///< preset name or file stem
  uint32_t nodes = 1;
  NodeSpec node;
  FabricSpec fabric;

  uint32_t totalGpus() const noexcept { return nodes * node.gpus; }
  /// Node index of each of `nRanks` ranks placed node-major (rank r on node r / gpus). Throws
  /// Error(InvalidArgument) if nRanks is 0 or exceeds totalGpus().
  std::vector<uint32_t> layout(uint32_t nRanks) const;
};

/// Names of the built-in presets: "h200x2", "dgx-h100", "dgx-h200".
std::vector<std::string> topologyPresets();
/// A preset with `nodes` nodes; throws Error(NotFound) listing the presets for an unknown name,
/// Error(InvalidArgument) for nodes == 0.
Topology topologyPreset(const std::string& name, uint32_t nodes = 1);
/// Throws Error(InvalidArgument) naming the field when a value is out of range (gpus == 0, negative
/// bandwidth, oversubscription < 1, nics == 0 with nodes > 1, ...).
void validateTopology(const Topology& t);

std::string topologyToJson(const Topology& t, int indent = 2);
/// Parse and validate; throws Error(ParseError) naming the field.
Topology topologyFromJson(const std::string& text);
/// "h200x2" / "dgx-h100" / ... (a preset) or a path to a JSON file; `nodes` > 0 overrides the node count.
Topology loadTopology(const std::string& presetOrPath, uint32_t nodes = 0);

}  // namespace mk
