// mkernel — cluster description: presets, validation, JSON form (schema "mkernel.topology.v1").
#include "mk/topology/topology.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "mk/error.hpp"
#include "mk/schedule/io.hpp"
#include "mk/util/size.hpp"

namespace mk {

namespace {

using Json = nlohmann::json;

constexpr const char* kTopologySchema = "mkernel.topology.v1";

/// "h200x2, dgx-h100, dgx-h200": the list every "unknown preset" message shows.
std::string presetList() {
  std::string out;
  for (const auto& p : topologyPresets()) out += (out.empty() ? "" : ", ") + p;
  return out;
}

// Hopper SXM figures shared by the DGX presets and the lent node.
constexpr uint32_t kHopperSxmSms =
    132;  // H100/H200 SXM5: 132 SMs (NVIDIA H100 Tensor Core GPU Architecture whitepaper)
constexpr double kHopperBf16DenseTflops =
    989;  // H100/H200 SXM datasheet: 1979 TFLOP/s bf16 "with sparsity" / 2 = dense
constexpr double kNvlink4PerDirGBs =
    450;  // NVLink 4: 18 links x 25 GB/s per direction = 900 GB/s bidirectional (datasheet)
constexpr double kNvlinkLatencyUs = 0.65;  // measured on the lent H200 pair: P2P flag round trip 1.25 us / 2
constexpr double kPcieGen5x16GBs = 64;     // PCIe Gen5 x16: 32 GT/s x 16 lanes, 128b/130b ~ 63-64 GB/s per direction
constexpr double kPcieLatencyUs =
    1.0;  // typical PCIe Gen5 round-trip-halved latency for a posted write + completion (order of 1 us)
constexpr uint32_t kDgxNics = 8;  // DGX H100/H200: 8 x ConnectX-7 for the compute fabric, one per GPU (DGX user guide)
constexpr double kCx7PerDirGBs = 50;  // ConnectX-7 NDR 400 Gb/s = 50 GB/s per direction (datasheet)
constexpr double kCx7LatencyUs =
    2.5;  // RDMA WRITE one-way small-message latency through a ConnectX-7, ~2-3 us incl. PCIe

Topology dgx(const std::string& name, const std::string& gpu, double hbmGBs) {
  Topology t;
  t.name = name;
  t.node.gpu = gpu;
  t.node.gpus = 8;  // DGX H100/H200: 8 GPUs per system
  t.node.sms = kHopperSxmSms;
  t.node.bf16Tflops = kHopperBf16DenseTflops;
  t.node.hbmGBs = hbmGBs;
  t.node.nvlink = NvlinkSpec{kNvlink4PerDirGBs, kNvlinkLatencyUs, true};  // 4 NVSwitch chips: all-to-all at full bw
  t.node.pcie = PcieSpec{kPcieGen5x16GBs, kPcieLatencyUs};
  t.node.nics = kDgxNics;
  t.node.nic = NicSpec{kCx7PerDirGBs, kCx7LatencyUs};
  return t;  // fabric: the FabricSpec defaults (rail-leaf-spine, 32 nodes per leaf, non-blocking, 0.5 us per hop)
}

Topology presetOneNode(const std::string& name) {
  if (name == "h200x2") {
    // The lent GPU machine: two H200 SXM joined by NV18 (nvidia-smi topo -m), no RDMA NIC.
    Topology t;
    t.name = name;
    t.node.gpu = "NVIDIA H200";
    t.node.gpus = 2;
    t.node.sms = kHopperSxmSms;
    t.node.bf16Tflops = kHopperBf16DenseTflops;
    t.node.hbmGBs = 4800;  // H200 datasheet: 4.8 TB/s HBM3e
    // NV18 direct: all 18 NVLink 4 links go to the one peer, so the per-direction total equals NVSwitch's.
    t.node.nvlink = NvlinkSpec{kNvlink4PerDirGBs, kNvlinkLatencyUs, false};
    t.node.pcie = PcieSpec{kPcieGen5x16GBs, kPcieLatencyUs};
    t.node.nics = 0;  // no RDMA NIC on that machine: single node only
    t.node.nic = NicSpec{0, 0};
    return t;
  }
  if (name == "dgx-h100") return dgx(name, "NVIDIA H100", 3350);  // H100 SXM datasheet: 3.35 TB/s HBM3
  if (name == "dgx-h200") return dgx(name, "NVIDIA H200", 4800);  // H200 SXM datasheet: 4.8 TB/s HBM3e
  throw Error(ErrorCode::NotFound, "unknown topology preset '" + name + "' (known: " + presetList() + ")");
}

// ---- validation ------------------------------------------------------------------------------------------

// ---- JSON reading with the path of every field in the error ---------------------------------------------

std::string typeName(const Json& j) { return j.type_name(); }

const Json& member(const Json& obj, const std::string& path, const char* key) {
  auto it = obj.find(key);
  const std::string full = path.empty() ? std::string(key) : path + "." + key;
  if (it == obj.end()) throw Error(ErrorCode::ParseError, "topology: missing field " + full);
  return *it;
}

std::string childPath(const std::string& path, const char* key) {
  return path.empty() ? std::string(key) : path + "." + key;
}

/// Reject keys we do not know: a misspelt "bwGbs" silently keeping a default is worse than an error.
void onlyKeys(const Json& obj, const std::string& path, std::initializer_list<const char*> keys) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known = known || it.key() == k;
    if (!known) {
      std::string list;
      for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
      throw Error(ErrorCode::ParseError,
                  "topology: unknown field " + childPath(path, it.key().c_str()) + " (expected: " + list + ")");
    }
  }
}

const Json& object(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  if (!j.is_object())
    throw Error(ErrorCode::ParseError,
                "topology: " + childPath(path, key) + " must be an object (got " + typeName(j) + ")");
  return j;
}

double number(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  if (!j.is_number())
    throw Error(ErrorCode::ParseError,
                "topology: " + childPath(path, key) + " must be a number (got " + typeName(j) + ")");
  return j.get<double>();
}

uint32_t count32(const Json& j, const std::string& full) {
  if (!j.is_number_integer() || (!j.is_number_unsigned() && j.get<int64_t>() < 0))
    throw Error(ErrorCode::ParseError, "topology: " + full + " must be a non-negative integer (got " +
                                           (j.is_number() ? j.dump() : typeName(j)) + ")");
  const uint64_t v = j.get<uint64_t>();
  if (v > std::numeric_limits<uint32_t>::max())
    throw Error(ErrorCode::ParseError, "topology: " + full + " is too large (got " + j.dump() + ")");
  return static_cast<uint32_t>(v);
}

uint32_t count32(const Json& obj, const std::string& path, const char* key) {
  return count32(member(obj, path, key), childPath(path, key));
}

std::string text(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  if (!j.is_string())
    throw Error(ErrorCode::ParseError,
                "topology: " + childPath(path, key) + " must be a string (got " + typeName(j) + ")");
  return j.get<std::string>();
}

bool boolean(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  if (!j.is_boolean())
    throw Error(ErrorCode::ParseError,
                "topology: " + childPath(path, key) + " must be true or false (got " + typeName(j) + ")");
  return j.get<bool>();
}

}  // namespace

std::vector<uint32_t> Topology::layout(uint32_t nRanks) const {
  const uint32_t total = totalGpus();
  if (nRanks == 0 || nRanks > total || node.gpus == 0)
    throw Error(ErrorCode::InvalidArgument, "topology '" + name + "' has " + std::to_string(total) + " GPUs (" +
                                                std::to_string(nodes) + " nodes x " + std::to_string(node.gpus) +
                                                "): cannot place " + std::to_string(nRanks) + " ranks (need 1.." +
                                                std::to_string(total) + ")");
  std::vector<uint32_t> nodeOf(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) nodeOf[r] = r / node.gpus;
  return nodeOf;
}

std::vector<std::string> topologyPresets() { return {"h200x2", "dgx-h100", "dgx-h200"}; }

Topology topologyPreset(const std::string& name, uint32_t nodes) {
  Topology t = presetOneNode(name);  // unknown names fail first: that is the more useful message
  if (nodes == 0) throw Error(ErrorCode::InvalidArgument, "topology preset '" + name + "': nodes must be >= 1 (got 0)");
  t.nodes = nodes;
  validateTopology(t);
  return t;
}

void validateTopology(const Topology& t) {
  if (t.nodes == 0) throw Error(ErrorCode::InvalidArgument, "nodes must be >= 1 (got 0)");
  const NodeSpec& n = t.node;
  if (n.gpus == 0) throw Error(ErrorCode::InvalidArgument, "node.gpus must be >= 1 (got 0)");
  if (static_cast<uint64_t>(t.nodes) * n.gpus > std::numeric_limits<uint32_t>::max())
    throw Error(ErrorCode::InvalidArgument, "nodes x node.gpus must fit in 32 bits (got " + std::to_string(t.nodes) +
                                                " x " + std::to_string(n.gpus) + ")");
  if (n.sms == 0) throw Error(ErrorCode::InvalidArgument, "node.sms must be >= 1 (got 0)");
  requirePositive("node.bf16Tflops", n.bf16Tflops);
  requirePositive("node.hbmGBs", n.hbmGBs);
  requirePositive("node.nvlink.bwGBs", n.nvlink.bwGBs);
  requireNonNegative("node.nvlink.latencyUs", n.nvlink.latencyUs);
  requirePositive("node.pcie.bwGBs", n.pcie.bwGBs);
  requireNonNegative("node.pcie.latencyUs", n.pcie.latencyUs);
  if (n.nics > 0) {
    requirePositive("node.nic.bwGBs", n.nic.bwGBs);
  } else {
    requireNonNegative("node.nic.bwGBs", n.nic.bwGBs);  // unused without NICs, but must still be a sane number
  }
  requireNonNegative("node.nic.latencyUs", n.nic.latencyUs);
  if (n.nics == 0 && t.nodes > 1)
    throw Error(ErrorCode::InvalidArgument,
                "node.nics: " + (t.name.empty() ? std::string("this topology") : t.name) +
                    " has no NICs: a multi-node cluster (nodes = " + std::to_string(t.nodes) +
                    ") needs nics > 0 (use dgx-h200 or a JSON file)");
  const FabricSpec& f = t.fabric;
  if (f.kind != "rail-leaf-spine")
    throw Error(ErrorCode::InvalidArgument, "fabric.kind must be \"rail-leaf-spine\" (got \"" + f.kind + "\")");
  if (f.nodesPerLeaf == 0) throw Error(ErrorCode::InvalidArgument, "fabric.nodesPerLeaf must be >= 1 (got 0)");
  if (!std::isfinite(f.oversubscription) || !(f.oversubscription >= 1))
    throw Error(ErrorCode::InvalidArgument,
                "fabric.oversubscription must be >= 1 (got " + formatNumber(f.oversubscription) + ")");
  requireNonNegative("fabric.switchLatencyUs", f.switchLatencyUs);
}

std::string topologyToJson(const Topology& t, int indent) {
  Json j;
  j["schema"] = kTopologySchema;
  j["name"] = t.name;
  j["nodes"] = t.nodes;
  const NodeSpec& n = t.node;
  j["node"] = {
      {"gpu", n.gpu},
      {"gpus", n.gpus},
      {"sms", n.sms},
      {"bf16Tflops", n.bf16Tflops},
      {"hbmGBs", n.hbmGBs},
      {"nvlink", {{"bwGBs", n.nvlink.bwGBs}, {"latencyUs", n.nvlink.latencyUs}, {"switched", n.nvlink.switched}}},
      {"pcie", {{"bwGBs", n.pcie.bwGBs}, {"latencyUs", n.pcie.latencyUs}}},
      {"nics", n.nics},
      {"nic", {{"bwGBs", n.nic.bwGBs}, {"latencyUs", n.nic.latencyUs}}},
  };
  j["fabric"] = {{"kind", t.fabric.kind},
                 {"nodesPerLeaf", t.fabric.nodesPerLeaf},
                 {"oversubscription", t.fabric.oversubscription},
                 {"switchLatencyUs", t.fabric.switchLatencyUs}};
  return j.dump(indent);
}

Topology topologyFromJson(const std::string& textIn) {
  Json j;
  try {
    j = Json::parse(textIn);
  } catch (const Json::parse_error& e) {
    throw Error(ErrorCode::ParseError, std::string("topology: not valid JSON: ") + e.what());
  }
  if (!j.is_object())
    throw Error(ErrorCode::ParseError, "topology: the document must be a JSON object (got " + typeName(j) + ")");
  if (j.contains("schema")) {
    const std::string schema = text(j, "", "schema");
    if (schema != kTopologySchema)
      throw Error(ErrorCode::ParseError,
                  "topology: schema must be \"" + std::string(kTopologySchema) + "\" (got \"" + schema + "\")");
  }

  // Short form: a preset, optionally with a node count.
  if (j.contains("preset")) {
    onlyKeys(j, "", {"schema", "preset", "nodes"});
    const std::string preset = text(j, "", "preset");
    const uint32_t nodes = j.contains("nodes") ? count32(j, "", "nodes") : 1;
    if (nodes == 0) throw Error(ErrorCode::ParseError, "topology: nodes must be >= 1 (got 0)");
    return topologyPreset(preset, nodes);
  }

  if (!j.contains("schema"))
    throw Error(ErrorCode::ParseError, "topology: missing field schema (or use {\"preset\": ...})");
  onlyKeys(j, "", {"schema", "name", "nodes", "node", "fabric"});
  Topology t;
  t.name = text(j, "", "name");
  t.nodes = count32(j, "", "nodes");
  const Json& node = object(j, "", "node");
  onlyKeys(node, "node", {"gpu", "gpus", "sms", "bf16Tflops", "hbmGBs", "nvlink", "pcie", "nics", "nic"});
  t.node.gpu = text(node, "node", "gpu");
  t.node.gpus = count32(node, "node", "gpus");
  t.node.sms = count32(node, "node", "sms");
  t.node.bf16Tflops = number(node, "node", "bf16Tflops");
  t.node.hbmGBs = number(node, "node", "hbmGBs");
  const Json& nvl = object(node, "node", "nvlink");
  onlyKeys(nvl, "node.nvlink", {"bwGBs", "latencyUs", "switched"});
  t.node.nvlink.bwGBs = number(nvl, "node.nvlink", "bwGBs");
  t.node.nvlink.latencyUs = number(nvl, "node.nvlink", "latencyUs");
  t.node.nvlink.switched = boolean(nvl, "node.nvlink", "switched");
  const Json& pcie = object(node, "node", "pcie");
  onlyKeys(pcie, "node.pcie", {"bwGBs", "latencyUs"});
  t.node.pcie.bwGBs = number(pcie, "node.pcie", "bwGBs");
  t.node.pcie.latencyUs = number(pcie, "node.pcie", "latencyUs");
  t.node.nics = count32(node, "node", "nics");
  const Json& nic = object(node, "node", "nic");
  onlyKeys(nic, "node.nic", {"bwGBs", "latencyUs"});
  t.node.nic.bwGBs = number(nic, "node.nic", "bwGBs");
  t.node.nic.latencyUs = number(nic, "node.nic", "latencyUs");
  const Json& fab = object(j, "", "fabric");
  onlyKeys(fab, "fabric", {"kind", "nodesPerLeaf", "oversubscription", "switchLatencyUs"});
  t.fabric.kind = text(fab, "fabric", "kind");
  t.fabric.nodesPerLeaf = count32(fab, "fabric", "nodesPerLeaf");
  t.fabric.oversubscription = number(fab, "fabric", "oversubscription");
  t.fabric.switchLatencyUs = number(fab, "fabric", "switchLatencyUs");
  validateTopology(t);
  return t;
}

Topology loadTopology(const std::string& presetOrPath, uint32_t nodes) {
  const auto presets = topologyPresets();
  for (const auto& p : presets)
    if (p == presetOrPath) return topologyPreset(p, nodes > 0 ? nodes : 1);

  std::error_code ec;
  if (presetOrPath.empty() || !std::filesystem::is_regular_file(presetOrPath, ec))
    throw Error(ErrorCode::NotFound,
                "unknown cluster '" + presetOrPath + "': not a preset (" + presetList() + ") and no such file");
  Topology t;
  try {
    t = topologyFromJson(readFile(presetOrPath));
  } catch (const Error& e) {
    // Keep the code (ParseError / InvalidArgument / IoError) and add the file that carried the problem.
    throw Error(e.code(), presetOrPath + ": " + e.message());
  }
  if (t.name.empty()) t.name = std::filesystem::path(presetOrPath).stem().string();
  if (nodes > 0) {
    t.nodes = nodes;
    validateTopology(t);
  }
  return t;
}

}  // namespace mk
