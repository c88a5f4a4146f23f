// mkernel — which cluster preset a measurement file describes, from its "system" block (mk-validate and
// mk-calibrate default --cluster to it). No simulator: mk-calibrate builds without SimGrid.
#include "mk/validation/system_cluster.hpp"

#include <nlohmann/json.hpp>

#include <map>

#include "mk/error.hpp"
#include "mk/topology/topology.hpp"

namespace mk {
namespace {

using json = nlohmann::json;

std::string joined(const std::vector<std::string>& v) {
  std::string s;
  for (const auto& x : v) s += (s.empty() ? "" : ", ") + x;
  return s;
}

std::string jsonString(const std::map<std::string, std::string>& m, const char* key) {
  auto it = m.find(key);
  if (it == m.end()) return "";
  try {
    const json v = json::parse(it->second);
    return v.is_string() ? v.get<std::string>() : v.dump();
  } catch (const json::exception&) {
    return it->second;
  }
}

}  // namespace

std::string inferCluster(const MeasurementFile& f) {
  const std::string gpu = jsonString(f.system, "gpu");
  const std::string gpus = jsonString(f.system, "gpus");
  // The first preset with that GPU and count: the DGX presets are listed before the cloud nodes that carry
  // the same GPU (a measurement's system block does not say which NICs it had).
  for (const auto& name : topologyPresets()) {
    const Topology t = topologyPreset(name);
    if (t.node.gpu == gpu && std::to_string(t.node.gpus) == gpus) return name;
  }
  return "";
}

std::string resolveCluster(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                           const std::string& cluster) {
  if (!cluster.empty()) return cluster;
  std::string found, foundIn;
  for (std::size_t f = 0; f < files.size(); ++f) {
    const std::string name = f < names.size() ? names[f] : "file " + std::to_string(f);
    const std::string c = inferCluster(files[f]);
    if (c.empty())
      throw Error(ErrorCode::InvalidArgument, name + ": its system (gpu " + jsonString(files[f].system, "gpu") +
                                                  ", gpus " + jsonString(files[f].system, "gpus") +
                                                  ") matches no single cluster preset (" + joined(topologyPresets()) +
                                                  "): give --cluster (a preset or a topology JSON file)");
    if (!found.empty() && c != found)
      throw Error(ErrorCode::InvalidArgument, "the files come from different systems (" + foundIn + ": " + found +
                                                  ", " + name + ": " + c +
                                                  "): validate each system separately with its own profile");
    found = c;
    if (foundIn.empty()) foundIn = name;
  }
  if (found.empty()) throw Error(ErrorCode::InvalidArgument, "no measurement file given");
  return found;
}

}  // namespace mk
