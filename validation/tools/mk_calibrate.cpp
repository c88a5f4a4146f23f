// mk-calibrate — fit the hardware profile from micro-benchmark measurement files (docs/calibration.md).
//
//   mk-calibrate [--cluster h200x2] --out profile.json f1.json [f2.json ...] [--summary fit.txt] [--base p.json]
//   mk-calibrate --cluster dgx-h100 --nodes 2 --import all_reduce_perf.txt [--import busbw.csv] --out profile.json
//
// Exit codes (mk/util/cli.hpp): 0 success, 2 bad input (a file breaking the measurement contract, an unknown
// cluster, a --base profile missing a parameter, a fit with too few points or an impossible value, an output that
// cannot be written): one line on stderr and no output file.
#include <algorithm>
#include <cstdio>
#include <ctime>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/io/output_paths.hpp"
#include "mk/schedule/io.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/build_commit.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/validation/calibrate.hpp"
#include "mk/validation/nccl_tests_import.hpp"
#include "mk/validation/system_cluster.hpp"

namespace {

constexpr const char* kTool = "mk-calibrate";

std::string utcDate() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%SZ", &tm);
  return buf;
}

/// --out and --summary: two different paths, neither one of the command's inputs (`inputs`, --base, --cluster).
void checkOutputs(std::vector<std::string> given, const std::string& base, const std::string& cluster,
                  const std::string& out, const std::string& summary) {
  given.push_back(base);
  given.push_back(cluster);
  mk::checkDistinctOutputs({{"--out", out, mk::OutputKind::File}, {"--summary", summary, mk::OutputKind::File}});
  mk::checkOutputPath("--out", out, given);
  mk::checkOutputPath("--summary", summary, given);
}

/// --import: nccl-tests output or bus-bandwidth tables of the cluster `cluster` (preset or topology file), its
/// efficiencies fitted through the layered model (docs/calibration.md, "Importing nccl-tests output").
int runImport(const std::vector<std::string>& imports, const std::string& cluster, uint32_t nodes,
              const std::string& base, const std::string& out, const std::string& summary, const std::string& tool) {
  checkOutputs(imports, base, cluster, out, summary);
  const mk::Topology topo = mk::loadTopology(cluster, nodes);
  std::vector<mk::BusBwRow> rows;
  for (const std::string& path : imports) {
    const mk::BusBwInput in = mk::readBusBwFile(path);
    if (in.ranks != 0 && in.ranks != topo.totalGpus())
      throw mk::Error(mk::ErrorCode::InvalidArgument,
                      path + ": the run reports " + std::to_string(in.ranks) + " ranks, --cluster " + cluster +
                          " has " + std::to_string(topo.totalGpus()) + " GPUs (" + std::to_string(topo.nodes) + " x " +
                          std::to_string(topo.node.gpus) + "): pass the --nodes it ran on");
    rows.insert(rows.end(), in.rows.begin(), in.rows.end());
  }
  const mk::Profile start = base.empty() ? mk::defaultProfile(topo) : mk::loadProfileFor(base, topo);
  mk::BusBwFit fit = mk::fitBusBw(rows, topo, start);
  fit.profile.source = "imported on " + topo.name + " (" + std::to_string(topo.nodes) + " x " +
                       std::to_string(topo.node.gpus) + " GPUs) from " + std::to_string(rows.size()) +
                       " bus-bandwidth rows: " + (fit.network ? "network" : "nvlink") + " efficiency " +
                       mk::formatNumber(fit.efficiency, 4) + (base.empty() ? "" : " (defaults from " + base + ")");
  mk::ProfileProvenance prov;
  prov.measurements = imports;
  prov.system = topo.name;
  prov.date = utcDate();
  prov.commit = mk::buildCommit();
  prov.tool = tool;
  const std::string table = mk::formatBusBwFit(fit);
  // The efficiency form where the cluster is a preset (its datasheet is what the fractions are of); a topology
  // file's profile holds that cluster's absolute rates (profileMachine: used as they are on any cluster).
  const auto presets = mk::topologyPresets();
  const bool preset = std::find(presets.begin(), presets.end(), cluster) != presets.end();
  if (!preset) prov.system = cluster;
  mk::OutputSet outputs;
  outputs.stage("--summary", summary, table);
  outputs.stage("--out", out,
                (preset ? mk::profileToEfficiencyJson(fit.profile, prov, mk::topologyPreset(cluster, 1))
                        : mk::profileToJson(fit.profile, prov)) +
                    "\n");
  outputs.commit();
  std::fputs(table.c_str(), stdout);
  std::printf("wrote %s (%s)\n", out.c_str(), fit.profile.source.c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "mk-calibrate: fit the hardware profile (alpha-beta per link class, rates, latencies) from "
      "micro-benchmark measurement files; collective records are never fitted",
      kTool};
  std::string cluster;
  uint32_t nodes = 1;
  std::string out;
  std::string reportOut;
  std::string base;
  std::vector<std::string> inputs;
  std::vector<std::string> imports;
  app.add_option("--cluster", cluster,
                 "topology preset whose datasheet defaults fill unmeasured parameters (default: the preset whose GPU "
                 "model and count match every file's system block, as mk-validate; an error when none or several do)");
  app.add_option("--nodes", nodes, "nodes of the preset")->capture_default_str();
  app.add_option("--out", out, "profile to write (mkernel.profile.v1, written atomically)")->required();
  app.add_option("--summary", reportOut, "also write the fit table (text, as printed on stdout) to this file");
  mk::cli::RetiredOption oldReport{"--report",
                                   "--report names an HTML folder in every tool now; mk-calibrate writes its fit table "
                                   "with --summary FILE (and on stdout)",
                                   {}};
  mk::cli::addRetiredOption(app, oldReport);
  app.add_option("--base", base,
                 "start from this profile (mkernel.profile.v1) instead of the cluster's datasheet "
                 "defaults: unmeasured parameters keep its values");
  app.add_option("files", inputs, "measurement files (mkernel.measurement.v1)");
  app.add_option("--import", imports,
                 "instead of measurement files: nccl-tests output (all_reduce_perf, ...) or a bus-bandwidth CSV "
                 "(op,bytes,busbw_GBs[,time_us]) of the cluster --cluster names (preset or topology file, with "
                 "--nodes); fits its efficiencies through the layered model (docs/calibration.md)");
  if (int rc = mk::cli::parse(app, argc, argv, kTool); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::requirePositive(app, kTool, {{"--nodes", nodes}}); rc != mk::cli::kContinue) return rc;
  if (int rc = mk::cli::refuseRetired(app, kTool, {&oldReport}); rc != mk::cli::kContinue) return rc;

  if (inputs.empty() == imports.empty() || (!imports.empty() && cluster.empty())) {
    std::fprintf(stderr, "%s: error: %s\n", kTool,
                 imports.empty() ? "give measurement files or --import FILE (nccl-tests output, a busbw table)"
                 : !inputs.empty()
                     ? "give measurement files or --import files, not both (they fit different things)"
                     : "--import needs --cluster: the preset or topology file the rows ran on (with --nodes)");
    return mk::cli::kExitBadInput;
  }

  return mk::cli::run(kTool, [&]() {
    if (!imports.empty())
      return runImport(imports, cluster, app.count("--nodes") > 0 ? nodes : 0, base, out, reportOut,
                       mk::cli::commandLine(kTool, argc, argv));
    checkOutputs(inputs, base, cluster, out, reportOut);
    const std::vector<mk::MeasurementFile> files = mk::loadMeasurementFiles(inputs);
    mk::ProfileProvenance prov;
    for (std::size_t i = 0; i < files.size(); ++i)
      prov.measurements.push_back(inputs[i] + " (run commit " + files[i].commit + ")");
    cluster = mk::resolveCluster(files, inputs, cluster);
    // The preset is resolved even with --base: an unknown cluster is an error either way.
    mk::Profile defaults = mk::defaultProfile(mk::topologyPreset(cluster, nodes));
    if (!base.empty()) defaults = mk::loadProfile(base);
    mk::FitReport report;
    mk::Profile profile = mk::calibrate(files, defaults, &report, inputs);
    // "calibrated from N records..." -> "calibrated on h200x2 from N records...": the system the numbers describe.
    const std::string kFrom = "calibrated ";
    if (profile.source.rfind(kFrom, 0) == 0) profile.source.insert(kFrom.size(), "on " + cluster + " ");
    if (!base.empty() && !report.defaulted().empty()) profile.source += " (defaults from " + base + ")";
    prov.system = cluster;
    prov.date = utcDate();
    prov.commit = mk::buildCommit();
    prov.tool = mk::cli::commandLine(kTool, argc, argv);
    const std::string table = mk::formatFitReport(report);

    // Both outputs or neither, and neither target replaced when one of them cannot be written.
    mk::OutputSet outputs;
    outputs.stage("--report", reportOut, table);
    // The efficiency form: fractions of the machine's datasheet rates, which every tool applies to the cluster it
    // plans or predicts (docs/calibration.md).
    outputs.stage("--out", out, mk::profileToEfficiencyJson(profile, prov, mk::topologyPreset(cluster, 1)) + "\n");
    outputs.commit();
    std::fputs(table.c_str(), stdout);
    std::printf("wrote %s (%s)\n", out.c_str(), profile.source.c_str());
    return 0;
  });
}
