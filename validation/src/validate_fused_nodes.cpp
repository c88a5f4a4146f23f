// mkernel — the fused operators across nodes, judged as one manifest says (validate_fused_nodes.hpp).
#include "mk/validation/validate_fused_nodes.hpp"

#include <nlohmann/json.hpp>

#include "mk/io/measurement.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

FusedNodesValidation validateFusedNodes(const std::string& manifestPath, const ValidationOptions& options) {
  FusedNodesValidation out;
  out.manifest = loadFusedNodesManifest(manifestPath);
  const FusedNodesManifest& m = out.manifest;
  const Topology topo = loadTopology(m.topology);

  // mk-calibrate --cluster <base>: the base preset's datasheet, the calibration records fitted over it.
  const std::vector<MeasurementFile> calib = loadMeasurementFiles(m.calibration);
  const Topology machine = topologyPreset(m.base, 1);
  Profile fitted = calibrate(calib, defaultProfile(machine), &out.fit, m.calibration);
  for (std::size_t i = 0; i < calib.size(); ++i)
    out.provenance.measurements.push_back(m.calibration[i] + " (run commit " + calib[i].commit + ")");
  out.provenance.system = m.base;
  out.provenance.tool = "validateFusedNodes " + m.path;
  // Through the efficiency form mk-calibrate writes and mk-validate reads: the rates are fractions of the base's
  // datasheet applied to the topology's, exactly as the two tools chained give them.
  const Profile read = profileFromJson(profileToEfficiencyJson(fitted, out.provenance, machine));
  out.profile = profileOnCluster(read, profileMachine(out.provenance, topo), topo);

  const std::vector<MeasurementFile> gated = loadMeasurementFiles(m.gated);
  out.gpu = topo.node.gpu;
  for (const MeasurementFile& f : gated) {
    const auto it = f.system.find("gpu");
    if (it == f.system.end()) continue;
    const auto v = nlohmann::json::parse(it->second, nullptr, false);
    if (v.is_string()) out.gpu = v.get<std::string>();
    break;
  }
  ValidationOptions vo = options;
  vo.ops.clear();
  vo.algos.clear();
  vo.cluster = m.topology;
  out.fused = validateFused(gated, m.gated, m.topology, out.profile, vo);
  return out;
}

}  // namespace mk
