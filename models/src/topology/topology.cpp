// mkernel — cluster description: presets, validation, JSON form (schema "mkernel.topology.v1").
#include "mk/topology/topology.hpp"

#include <cmath>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/io.hpp"
#include "mk/util/size.hpp"
#include "topology_internal.hpp"

namespace mk {

using detail::presetList;
using detail::presetOneNode;

namespace {

using Json = nlohmann::json;

constexpr const char* kTopologySchema = "mkernel.topology.v1";

// Bounds of what a node and a fabric can be, far above any datasheet: a node of 1024 GPUs (an NVL576 rack is
// the largest NVLink domain announced), 2^20 SMs, a leaf switch with 65536 node ports, 1000:1 oversubscription.
constexpr uint32_t kMaxGpusPerNode = 1024;
constexpr uint32_t kMaxSms = 1u << 20;
constexpr uint32_t kMaxNodesPerLeaf = 65536;
constexpr double kMaxOversubscription = 1e3;

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

/// A latency in microseconds: [0, kMaxLatencyUs].
double latency(const Json& obj, const std::string& path, const char* key) {
  return json_get::number(member(obj, path, key), "topology: " + childPath(path, key), 0, kMaxLatencyUs);
}

/// A bandwidth (GB/s) or compute rate (TFLOP/s): [kMinRate, kMaxRate].
double rate(const Json& obj, const std::string& path, const char* key) {
  return json_get::number(member(obj, path, key), "topology: " + childPath(path, key), kMinRate, kMaxRate);
}

uint32_t count32(const Json& j, const std::string& full) { return json_get::u32(j, "topology: " + full); }

uint32_t count32(const Json& obj, const std::string& path, const char* key) {
  return count32(member(obj, path, key), childPath(path, key));
}

std::string text(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  return json_get::text(j, "topology: " + childPath(path, key));
}

bool boolean(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  if (!j.is_boolean())
    throw Error(ErrorCode::ParseError,
                "topology: " + childPath(path, key) + " must be true or false (got " + typeName(j) + ")");
  return j.get<bool>();
}

/// A list of local indices ("gpus": [0, 1]).
std::vector<uint32_t> indexList(const Json& obj, const std::string& path, const char* key) {
  const Json& j = member(obj, path, key);
  if (!j.is_array())
    throw Error(ErrorCode::ParseError,
                "topology: " + childPath(path, key) + " must be an array of indices (got " + typeName(j) + ")");
  std::vector<uint32_t> out;
  for (std::size_t i = 0; i < j.size(); ++i)
    out.push_back(count32(j[i], childPath(path, key) + "[" + std::to_string(i) + "]"));
  return out;
}

/// "nics": a count with a uniform "nic" (the first form), or the list of NICs (the form we write).
void readNics(const Json& node, NodeSpec& n) {
  const Json& nics = member(node, "node", "nics");
  if (nics.is_array()) {
    if (node.contains("nic"))
      throw Error(ErrorCode::ParseError,
                  "topology: node.nic is only for the uniform form (node.nics a count); "
                  "with a NIC list give each NIC its fields");
    for (std::size_t i = 0; i < nics.size(); ++i) {
      const std::string path = "node.nics[" + std::to_string(i) + "]";
      if (!nics[i].is_object())
        throw Error(ErrorCode::ParseError, "topology: " + path + " must be an object (got " + typeName(nics[i]) + ")");
      onlyKeys(nics[i], path, {"name", "bwGBs", "latencyUs", "transport", "gpus"});
      NicSpec nic;
      if (nics[i].contains("name")) nic.name = text(nics[i], path, "name");
      nic.bwGBs = rate(nics[i], path, "bwGBs");
      nic.latencyUs = latency(nics[i], path, "latencyUs");
      if (nics[i].contains("transport")) nic.transport = text(nics[i], path, "transport");
      nic.gpus = indexList(nics[i], path, "gpus");
      n.nicList.push_back(nic);
    }
    n.nics = static_cast<uint32_t>(n.nicList.size());
    n.nic = n.nicList.empty() ? NicSpec{}
                              : NicSpec{n.nicList[0].bwGBs, n.nicList[0].latencyUs, n.nicList[0].transport, {}, {}};
  } else {
    n.nics = count32(node, "node", "nics");
    const Json& nic = object(node, "node", "nic");
    onlyKeys(nic, "node.nic", {"bwGBs", "latencyUs", "transport"});
    // Without NICs the block is unused: the single-node form written before NIC lists ("nics": 0 with a
    // zero-rate "nic") reads as it did then.
    n.nic.bwGBs = n.nics == 0
                      ? json_get::number(member(nic, "node.nic", "bwGBs"), "topology: node.nic.bwGBs", 0, kMaxRate)
                      : rate(nic, "node.nic", "bwGBs");
    n.nic.latencyUs = latency(nic, "node.nic", "latencyUs");
    if (nic.contains("transport")) n.nic.transport = text(nic, "node.nic", "transport");
  }
  if (!node.contains("pcieSwitches")) return;
  const Json& sws = member(node, "node", "pcieSwitches");
  if (!sws.is_array())
    throw Error(ErrorCode::ParseError, "topology: node.pcieSwitches must be an array (got " + typeName(sws) + ")");
  for (std::size_t i = 0; i < sws.size(); ++i) {
    const std::string path = "node.pcieSwitches[" + std::to_string(i) + "]";
    if (!sws[i].is_object())
      throw Error(ErrorCode::ParseError, "topology: " + path + " must be an object (got " + typeName(sws[i]) + ")");
    onlyKeys(sws[i], path, {"bwGBs", "gpus", "nics"});
    PcieSwitchSpec sw;
    sw.bwGBs = rate(sws[i], path, "bwGBs");
    if (sws[i].contains("gpus")) sw.gpus = indexList(sws[i], path, "gpus");
    if (sws[i].contains("nics")) sw.nics = indexList(sws[i], path, "nics");
    n.pcieSwitches.push_back(sw);
  }
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
  if (n.gpus == 0 || n.gpus > kMaxGpusPerNode)
    throw Error(ErrorCode::InvalidArgument, "node.gpus must be in [1, " + std::to_string(kMaxGpusPerNode) + "] (got " +
                                                std::to_string(n.gpus) + ")");
  if (static_cast<uint64_t>(t.nodes) * n.gpus > std::numeric_limits<uint32_t>::max())
    throw Error(ErrorCode::InvalidArgument, "nodes x node.gpus must fit in 32 bits (got " + std::to_string(t.nodes) +
                                                " x " + std::to_string(n.gpus) + ")");
  if (n.sms == 0 || n.sms > kMaxSms)
    throw Error(ErrorCode::InvalidArgument,
                "node.sms must be in [1, " + std::to_string(kMaxSms) + "] (got " + std::to_string(n.sms) + ")");
  requirePositive("node.bf16Tflops", n.bf16Tflops);
  requireNonNegative("node.fp8Tflops", n.fp8Tflops);
  requirePositive("node.hbmGBs", n.hbmGBs);
  requirePositive("node.nvlink.bwGBs", n.nvlink.bwGBs);
  requireNonNegative("node.nvlink.latencyUs", n.nvlink.latencyUs);
  requirePositive("node.pcie.bwGBs", n.pcie.bwGBs);
  requireNonNegative("node.pcie.latencyUs", n.pcie.latencyUs);
  detail::validateNics(t);
  const FabricSpec& f = t.fabric;
  if (f.kind != "rail-leaf-spine")
    throw Error(ErrorCode::InvalidArgument, "fabric.kind must be \"rail-leaf-spine\" (got \"" + f.kind + "\")");
  if (f.nodesPerLeaf == 0 || f.nodesPerLeaf > kMaxNodesPerLeaf)
    throw Error(ErrorCode::InvalidArgument, "fabric.nodesPerLeaf must be in [1, " + std::to_string(kMaxNodesPerLeaf) +
                                                "] (got " + std::to_string(f.nodesPerLeaf) + ")");
  if (!std::isfinite(f.oversubscription) || !(f.oversubscription >= 1) || f.oversubscription > kMaxOversubscription)
    throw Error(ErrorCode::InvalidArgument, "fabric.oversubscription must be in [1, " +
                                                formatNumber(kMaxOversubscription) + "] (got " +
                                                formatNumber(f.oversubscription) + ")");
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
      {"fp8Tflops", n.fp8Tflops},
      {"hbmGBs", n.hbmGBs},
      {"nvlink", {{"bwGBs", n.nvlink.bwGBs}, {"latencyUs", n.nvlink.latencyUs}, {"switched", n.nvlink.switched}}},
      {"pcie", {{"bwGBs", n.pcie.bwGBs}, {"latencyUs", n.pcie.latencyUs}}},
  };
  // The list form: every NIC with the GPUs it serves (the uniform form expanded).
  Json nics = Json::array();
  for (const NicSpec& nic : nicsOf(n)) {
    Json e = {{"bwGBs", nic.bwGBs}, {"latencyUs", nic.latencyUs}, {"transport", nic.transport}, {"gpus", nic.gpus}};
    if (!nic.name.empty()) e["name"] = nic.name;
    nics.push_back(e);
  }
  j["node"]["nics"] = nics;
  if (!n.pcieSwitches.empty()) {
    Json sw = Json::array();
    for (const PcieSwitchSpec& s : n.pcieSwitches)
      sw.push_back({{"bwGBs", s.bwGBs}, {"gpus", s.gpus}, {"nics", s.nics}});
    j["node"]["pcieSwitches"] = sw;
  }
  j["fabric"] = {{"kind", t.fabric.kind},
                 {"nodesPerLeaf", t.fabric.nodesPerLeaf},
                 {"oversubscription", t.fabric.oversubscription},
                 {"switchLatencyUs", t.fabric.switchLatencyUs}};
  return j.dump(indent);
}

Topology topologyFromJson(const std::string& textIn) {
  const Json j = parseJson(textIn, "topology", kMaxConfigJsonBytes);
  if (!j.is_object())
    throw Error(ErrorCode::ParseError, "topology: the document must be a JSON object (got " + typeName(j) + ")");
  if (j.contains("schema")) {
    const std::string schema = text(j, "", "schema");
    if (!schemaMatches(schema, kTopologySchema))
      throw Error(ErrorCode::ParseError, "topology: schema must be \"" + std::string(kTopologySchema) + "\" (got \"" +
                                             excerpt(schema) + "\")");
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
  onlyKeys(
      node, "node",
      {"gpu", "gpus", "sms", "bf16Tflops", "fp8Tflops", "hbmGBs", "nvlink", "pcie", "nics", "nic", "pcieSwitches"});
  t.node.gpu = text(node, "node", "gpu");
  t.node.gpus = count32(node, "node", "gpus");
  t.node.sms = count32(node, "node", "sms");
  t.node.bf16Tflops = rate(node, "node", "bf16Tflops");
  // Optional: a file without it describes a GPU without FP8 (training.dtype fp8 is refused on it).
  if (node.contains("fp8Tflops"))
    t.node.fp8Tflops = json_get::number(member(node, "node", "fp8Tflops"), "topology: node.fp8Tflops", 0, kMaxRate);
  t.node.hbmGBs = rate(node, "node", "hbmGBs");
  const Json& nvl = object(node, "node", "nvlink");
  onlyKeys(nvl, "node.nvlink", {"bwGBs", "latencyUs", "switched"});
  t.node.nvlink.bwGBs = rate(nvl, "node.nvlink", "bwGBs");
  t.node.nvlink.latencyUs = latency(nvl, "node.nvlink", "latencyUs");
  t.node.nvlink.switched = boolean(nvl, "node.nvlink", "switched");
  const Json& pcie = object(node, "node", "pcie");
  onlyKeys(pcie, "node.pcie", {"bwGBs", "latencyUs"});
  t.node.pcie.bwGBs = rate(pcie, "node.pcie", "bwGBs");
  t.node.pcie.latencyUs = latency(pcie, "node.pcie", "latencyUs");
  readNics(node, t.node);
  const Json& fab = object(j, "", "fabric");
  onlyKeys(fab, "fabric", {"kind", "nodesPerLeaf", "oversubscription", "switchLatencyUs"});
  t.fabric.kind = text(fab, "fabric", "kind");
  t.fabric.nodesPerLeaf = count32(fab, "fabric", "nodesPerLeaf");
  t.fabric.oversubscription =
      json_get::number(member(fab, "fabric", "oversubscription"), std::string("topology: fabric.oversubscription"), 1,
                       kMaxOversubscription);
  t.fabric.switchLatencyUs = latency(fab, "fabric", "switchLatencyUs");
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
