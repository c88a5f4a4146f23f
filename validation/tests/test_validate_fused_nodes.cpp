// The fused operators across nodes from a manifest (mk/validation/validate_fused_nodes.hpp): the chain gives what
// mk-calibrate then mk-validate give, and a broken manifest is refused naming the file and field.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/schedule/io.hpp"
#include "mk/topology/topology.hpp"
#include "mk/validation/calibrate.hpp"
#include "mk/validation/validate_fused_nodes.hpp"

namespace {

namespace fs = std::filesystem;

const std::string kFusedDir = std::string(MK_MEASURED_DIR) + "/internode/fused-nodes";
const std::string kManifest = std::string(MK_FUSED_VALIDATION_DIR) + "/h100-mps-loopback-2x1.json";
const std::string kRingManifest = std::string(MK_FUSED_VALIDATION_DIR) + "/h100-mps-loopback-ring-attention-2x1.json";

bool endsWith(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

/// The committed directory's files whose names `pick` accepts, sorted.
template <class Pick>
std::vector<std::string> committed(Pick pick) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(kFusedDir))
    if (e.is_regular_file() && pick(e.path().filename().string())) out.push_back(e.path().string());
  std::sort(out.begin(), out.end());
  return out;
}

/// A scratch directory: a data directory "data" with one measurement file copied from the committed one, a topology
/// file beside it, and a manifest "m.json" written per case.
struct ScratchDir {
  ScratchDir() : path(fs::temp_directory_path() / ("mk-fused-nodes-test-" + std::to_string(::getpid()))) {
    fs::remove_all(path);
    fs::create_directories(path / "data");
    for (const auto& f : committed([](const std::string& n) { return endsWith(n, "-calibrate-network.json"); }))
      fs::copy_file(f, path / "data" / "calib.json");
    std::ofstream(path / "topo.json") << "{}";
  }
  ~ScratchDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string manifest(const std::string& text) const {
    std::ofstream(path / "m.json") << text;
    return (path / "m.json").string();
  }
  fs::path path;
};

std::string manifestText(const std::string& base, const std::string& topology, const std::string& calib,
                         const std::string& gated, const std::string& extra = "", const std::string& data = "data") {
  return "{\"schema\": \"mkernel.fused-validation.v1\", \"regime\": \"test\", \"data\": \"" + data +
         "\", \"topology\": \"" + topology + "\", \"calibration_base\": \"" + base + "\", \"calibration\": [" + calib +
         "], \"gated\": [" + gated + "]" + extra + "}";
}

}  // namespace

TEST_CASE("fused nodes: the committed chain is mk-calibrate then mk-validate on the manifest's files") {
  mk::ValidationOptions vo;
  vo.jobs = 2;
  const mk::FusedNodesValidation v = mk::validateFusedNodes(kManifest, vo);
  // The manifest's patterns pick what ci_gate.sh globbed before it had one.
  const auto calib = committed([](const std::string& n) { return endsWith(n, "-calibrate-network.json"); });
  const auto gated =
      committed([](const std::string& n) { return endsWith(n, ".json") && n.find("-2x1-") != std::string::npos; });
  CHECK(fs::equivalent(v.manifest.dir, kFusedDir));
  CHECK(v.manifest.calibration == calib);
  CHECK(v.manifest.gated == gated);
  CHECK(v.manifest.base == "dgx-h100");
  CHECK(v.gpu == "NVIDIA H100 80GB HBM3");
  REQUIRE(v.fused.rows.size() == 9);
  CHECK(v.fused.skipped.empty());

  // The two tools chained: the profile file mk-calibrate --cluster dgx-h100 writes, read as mk-validate reads it.
  const fs::path profilePath = fs::temp_directory_path() / ("mk-fused-nodes-profile-" + std::to_string(::getpid()));
  mk::ProfileProvenance prov;
  prov.system = "dgx-h100";
  const mk::Topology machine = mk::topologyPreset("dgx-h100", 1);
  const mk::Profile fitted =
      mk::calibrate(mk::loadMeasurementFiles(calib), mk::defaultProfile(machine), nullptr, calib);
  std::ofstream(profilePath) << mk::profileToEfficiencyJson(fitted, prov, machine);
  const std::string topology = std::string(MK_FUSED_VALIDATION_DIR) + "/../topologies/h100-mps-loopback.json";
  const mk::Profile read = mk::loadProfileFor(profilePath.string(), mk::loadTopology(topology));
  fs::remove(profilePath);
  const mk::FusedValidation twoStep = mk::validateFused(mk::loadMeasurementFiles(gated), gated, topology, read, vo);
  REQUIRE(twoStep.rows.size() == v.fused.rows.size());
  for (std::size_t i = 0; i < twoStep.rows.size(); ++i) {
    CAPTURE(twoStep.rows[i].file);
    CHECK(v.fused.rows[i].simUs == twoStep.rows[i].simUs);
    CHECK(v.fused.rows[i].measuredUs == twoStep.rows[i].measuredUs);
  }
  CHECK(v.fused.sim.n == 9);
  CHECK(v.fused.sim.medianAbsPct == twoStep.sim.medianAbsPct);
  CHECK(v.fused.sim.maxAbsPct == twoStep.sim.maxAbsPct);
}

TEST_CASE("fused nodes: the ring-attention manifest prices every record with the attention rate it fits") {
  mk::ValidationOptions vo;
  vo.jobs = 2;
  const mk::FusedNodesValidation v = mk::validateFusedNodes(kRingManifest, vo);
  REQUIRE(v.manifest.calibration.size() == 2);  // the same call's calibrate-network and calib-attention
  REQUIRE(v.manifest.gated.size() == 1);
  CHECK(v.fused.skipped.empty());
  REQUIRE(v.fused.rows.size() == 4);  // L 16384 and 32768 per rank, causal and not
  for (const auto& r : v.fused.rows) {
    CAPTURE(r.file);
    CHECK(r.ring.has_value());
    CHECK(r.opName() == "ring-attention");
    CHECK(r.simUs > 0);
    CHECK(r.measuredUs > r.simUs * 0.5);  // the same order of magnitude (docs/results.md: 9 to 30 % too fast)
  }
}

TEST_CASE("fused nodes: the planner finds the committed manifests, and none among the measurements") {
  const auto found = mk::findFusedNodesManifests(MK_FUSED_VALIDATION_DIR);
  REQUIRE(found.size() == 2);
  CHECK(std::any_of(found.begin(), found.end(), [](const std::string& f) { return fs::equivalent(f, kManifest); }));
  CHECK(std::any_of(found.begin(), found.end(), [](const std::string& f) { return fs::equivalent(f, kRingManifest); }));
  CHECK(mk::findFusedNodesManifests("").empty());
  CHECK(mk::findFusedNodesManifests(kFusedDir + "/no-such-dir").empty());
  // A manifest is not a measurement (DESIGN.md, "Data contracts"): none lives among the measurement files.
  for (const auto& e : fs::recursive_directory_iterator(MK_MEASURED_DIR))
    if (e.path().extension() == ".json") {
      CAPTURE(e.path().string());
      CHECK(mk::readFile(e.path().string()).find(mk::kFusedNodesSchema) == std::string::npos);
    }
}

TEST_CASE("fused nodes: a broken manifest is refused naming the file and the field") {
  ScratchDir d;
  auto refused = [&](const std::string& text, const std::string& what) {
    const std::string path = d.manifest(text);
    CAPTURE(text);
    try {
      (void)mk::loadFusedNodesManifest(path);
      FAIL("accepted");
    } catch (const mk::Error& e) {
      const std::string msg = e.what();
      CHECK(msg.find(path) != std::string::npos);
      CHECK_MESSAGE(msg.find(what) != std::string::npos, msg);
    }
  };
  refused(manifestText("dgx-h100", "topo.json", "\"calib*.json\"", "\"calib.json\""), "both calibration and gated");
  refused(manifestText("dgx-h100", "topo.json", "\"calib.json\"", "\"*-2x1-*.json\""), "gated[0]");
  refused(manifestText("dgx-h100", "topo.json", "\"../calib.json\"", "\"calib.json\""), "calibration[0]");
  refused(manifestText("dgx-h100", "topo.json", "", "\"calib.json\""), "calibration");
  refused(manifestText("h100-loopback", "topo.json", "\"calib.json\"", "\"x\""), "calibration_base");
  refused(manifestText("dgx-h100", "nowhere.json", "\"calib.json\"", "\"x\""), "topology");
  refused(manifestText("dgx-h100", "topo.json", "\"calib.json\"", "\"x\"", ", \"gate\": 10"), "unknown field 'gate'");
  refused("{\"schema\": \"mkernel.profile.v1\"}", "schema");
  refused(manifestText("dgx-h100", "topo.json", "\"calib.json\"", "\"x\"", "", "nodata"), "field 'data'");
  refused(manifestText("dgx-h100", "topo.json", "\"calib.json\"", "\"x\"", "", "topo.json"), "field 'data'");
  refused("{\"schema\": \"mkernel.fused-validation.v1\"}", "missing field 'regime'");
  refused("[", "m.json");
  // A directory or a path that does not exist is not a manifest.
  for (const std::string& p : {d.path.string(), (d.path / "none.json").string()}) {
    CAPTURE(p);
    CHECK_THROWS_WITH_AS((void)mk::loadFusedNodesManifest(p), doctest::Contains(p.c_str()), mk::Error);
  }
}

TEST_CASE("fused nodes: a manifest judges ring-attention records on an attention rate calibrated in its session") {
  ScratchDir d;
  // The session's calibration: the committed network calibration and a calib-attention file at 431.5 TFLOP/s.
  mk::MeasurementFile attn = mk::loadMeasurementFiles({(d.path / "data" / "calib.json").string()})[0];
  attn.records.clear();
  for (double seq : {2048.0, 4096.0, 8192.0}) {
    mk::MeasurementRecord a;
    a.op = mk::kCalibAttention;
    a.impl = "mkernel";
    a.dtype = "bfloat16";
    a.ranks = 1;
    a.iters = 10;
    a.stat = "median";
    const double flops = 4.0 * 32 * 128 * seq * seq;
    a.timeUs = 6.0 + flops / (431.5 * 1e6);
    a.extra["flops"] = std::to_string(static_cast<uint64_t>(flops));
    attn.records.push_back(a);
  }
  mk::saveMeasurementFile(attn, (d.path / "data" / "calib-attention.json").string());
  // The gated file: two ring-attention records of 2 ranks as nodes sharing the GPU.
  mk::MeasurementFile ring = attn;
  ring.records.clear();
  for (double us : {900.0, 1100.0}) {
    mk::MeasurementRecord r;
    r.op = "ring-attention";
    r.impl = "mkernel";
    r.algo = "ring-zigzag";
    r.dtype = "bfloat16";
    r.ranks = 2;
    r.bytes = 1;
    r.timeUs = us;
    r.iters = 10;
    r.stat = "median";
    r.extra = {{"batch", "1"},      {"seq_per_rank", "2048"},    {"q_heads", "8"}, {"kv_heads", "2"},
               {"head_dim", "128"}, {"causal", "true"},          {"nodes", "2"},   {"shared_gpu", "true"},
               {"processes", "2"},  {"transport", "\"socket\""}, {"ctas", "63"},   {"compute_ctas", "48"},
               {"comm_ctas", "15"}};
    ring.records.push_back(r);
  }
  mk::saveMeasurementFile(ring, (d.path / "data" / "ring.json").string());
  fs::copy_file(std::string(MK_FUSED_VALIDATION_DIR) + "/../topologies/h100-mps-loopback.json", d.path / "h100.json");
  const std::string m = d.manifest(manifestText("dgx-h100", "h100.json", "\"calib*.json\"", "\"ring.json\""));
  mk::ValidationOptions vo;
  vo.jobs = 1;
  const mk::FusedNodesValidation v = mk::validateFusedNodes(m, vo);
  CHECK(v.manifest.calibration.size() == 2);
  CHECK(v.profile.attentionTflops == doctest::Approx(431.5).epsilon(1e-9));
  bool fitted = false;
  for (const mk::ParameterFit& p : v.fit.parameters) fitted = fitted || (p.name == "attentionTflops" && p.measured);
  CHECK(fitted);
  REQUIRE(v.fused.rows.size() == 2);
  CHECK(v.fused.skipped.empty());
  for (const mk::FusedRow& r : v.fused.rows) {
    CHECK(r.opName() == "ring-attention");
    CHECK(r.simUs > 0);
  }
  CHECK(v.fused.sim.n == 2);
  // The same rows as mk-validate gives them on that profile.
  const mk::FusedValidation direct = mk::validateFused(mk::loadMeasurementFiles(v.manifest.gated), v.manifest.gated,
                                                       v.manifest.topology, v.profile, vo);
  REQUIRE(direct.rows.size() == 2);
  CHECK(direct.rows[0].simUs == v.fused.rows[0].simUs);
}
