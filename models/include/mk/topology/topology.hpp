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

/// Transports a NIC can speak (the profile's Transport model prices each; docs/transports.md).
/// "ib" (InfiniBand RC), "roce" (RoCE v2 RC), "efa" (AWS EFA, SRD), "tcp" (TCP-based GPUDirect or sockets).
std::vector<std::string> nicTransports();

/// One NIC port. In a node's NIC list (NodeSpec::nicList) NIC i sits on rail i and serves the local GPUs
/// `gpus`; in the uniform form (NodeSpec::nic) `gpus` is empty and nicsOf() derives the mapping.
struct NicSpec {
  double bwGBs = 0;  ///< per direction (400 Gb/s = 50 GB/s)
  double latencyUs = 0;
  std::string transport = "ib";  ///< one of nicTransports()
  std::vector<uint32_t> gpus;    ///< local GPUs it serves (list form), ascending
  std::string name;              ///< optional ("mlx5_0"); unique within a node when given
};

/// A PCIe switch: the network bytes of every GPU and NIC behind it cross its uplink (shared, per direction).
/// A GPU's network path is its own PCIe link, then the uplink of its switch, then that of its NIC's switch when
/// that is another one (each shared link counted once), then the NIC.
struct PcieSwitchSpec {
  double bwGBs = 0;            ///< uplink bandwidth per direction
  std::vector<uint32_t> gpus;  ///< local GPUs behind it
  std::vector<uint32_t> nics;  ///< NICs (indices into nicsOf()) behind it
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
  double fp8Tflops = 0;   ///< dense fp8 (e4m3) tensor peak per GPU; 0: no FP8 (training.dtype fp8 refused)
  double hbmGBs = 0;      ///< HBM bandwidth per GPU
  NvlinkSpec nvlink;
  PcieSpec pcie;
  /// Uniform form: `nics` identical NICs `nic` (0 = single-node system), shared evenly: with nics <= gpus GPU g
  /// uses NIC g * nics / gpus, with nics > gpus NIC i serves GPU i * gpus / nics. With a NIC list (below) they
  /// summarise it (its length and its first NIC) and the list rules.
  uint32_t nics = 0;
  NicSpec nic;
  /// List form: NIC i (rail i) with its rate, latency, transport and the local GPUs it serves. Empty: the
  /// uniform form. nicsOf() gives the list either way.
  std::vector<NicSpec> nicList;
  std::vector<PcieSwitchSpec> pcieSwitches;  ///< empty: every GPU reaches its NICs over its own PCIe link only
};

/// The NICs of a node as a list (the uniform form expanded: the even mapping above).
std::vector<NicSpec> nicsOf(const NodeSpec& n);
/// [gpu] -> the NICs (indices into nicsOf()) serving that local GPU, ascending.
std::vector<std::vector<uint32_t>> gpuNics(const NodeSpec& n);

/// The one rule for NIC sharing (docs/cost-model.md, "network share"): the rate, GB/s per direction, that the
/// network transfers of local GPU `gpu` get while the local GPUs marked in `sending` (all of them when null)
/// send at once. Each ProxyPut of a GPU is striped evenly over its k NICs, so it gets k x the least of its
/// NICs' fair shares (NIC rate / sending GPUs it serves), capped by its PCIe link and by its fair share of every
/// PCIe switch uplink on its path (uplink / sending GPUs crossing it). 0 for a GPU without NIC.
double gpuNetworkGBs(const NodeSpec& n, uint32_t gpu, const std::vector<bool>* sending = nullptr);
/// gpuNetworkGBs with only `gpu` sending: what its network path gives when nothing else of the node shares it.
double gpuNetworkAloneGBs(const NodeSpec& n, uint32_t gpu);
/// The least gpuNetworkAloneGBs over the node's GPUs (0 without NICs): the per-GPU network rate of a profile.
double nodeNetworkAloneGBs(const NodeSpec& n);

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

/// Per rank (rank r on node nodeOf[r], its local GPU = its position among the ranks of that node, as
/// Topology::layout and the simulator place them): the fraction of nodeNetworkAloneGBs its network transfers
/// get while the ranks marked in `sends` send at once (gpuNetworkGBs); 1 for a rank that does not send; at most 1 (the
/// replay caps a lane at the profile rate too).
std::vector<double> rankNetworkShares(const Topology& t, const std::vector<uint32_t>& nodeOf,
                                      const std::vector<bool>& sends);

/// The cluster every tool that generates or predicts uses when --cluster is not given (mk-schedule, mk-sim,
/// mk-plan): 8 H100 GPUs per node on NVSwitch, one 400 Gb/s NIC per GPU, so any GPU count up to thousands fits.
/// The measured 2 x H200 node (h200x2) has no NIC to grow by; tools that read measurements default to the
/// preset their files ran on instead.
inline constexpr const char* kDefaultCluster = "dgx-h100";

/// Names of the built-in presets: "h200x2", "dgx-h100", "dgx-h200", "a100-8x200", "cloud-efa-32x100",
/// "cloud-tcp-8x200" (sources: docs/transports.md).
std::vector<std::string> topologyPresets();
/// A preset with `nodes` nodes; throws Error(NotFound) listing the presets for an unknown name,
/// Error(InvalidArgument) for nodes == 0.
Topology topologyPreset(const std::string& name, uint32_t nodes = 1);
/// Throws Error(InvalidArgument) naming the field when a value is out of range (gpus == 0, negative
/// bandwidth, oversubscription < 1, nics == 0 with nodes > 1, a NIC list naming a GPU that does not exist,
/// a GPU without NIC in a multi-node cluster, duplicate NICs, ...).
void validateTopology(const Topology& t);

std::string topologyToJson(const Topology& t, int indent = 2);
/// Parse and validate; throws Error(ParseError) naming the field.
Topology topologyFromJson(const std::string& text);
/// "h200x2" / "dgx-h100" / ... (a preset) or a path to a JSON file; `nodes` > 0 overrides the node count.
Topology loadTopology(const std::string& presetOrPath, uint32_t nodes = 0);

}  // namespace mk
