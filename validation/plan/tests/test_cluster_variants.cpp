// Tests of what a plan's cluster means (issue 33 item 4): NIC lists, several NICs per GPU and PCIe switches
// through the placement's reduced cluster and every what-if, and a calibrated profile applied to the chosen
// cluster's datasheet rates (never another machine's absolute rates).
// And (item 5) the confidence of a plan's collectives from the layered model's own validation error.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/plan/confidence.hpp"
#include "mk/plan/placement.hpp"
#include "mk/plan/what_if.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

const std::string kNicList = std::string(MK_PLAN_TEST_DATA) + "/nic-list-cluster.json";

/// One instance per local GPU: rank g of every node `nodes` together (data parallelism across nodes).
GroupSet acrossNodes(uint32_t gpus, uint32_t nodes) {
  GroupSet g;
  g.name = "dp";
  for (uint32_t local = 0; local < gpus; ++local) {
    std::vector<uint32_t> ranks;
    for (uint32_t n = 0; n < nodes; ++n) ranks.push_back(n * gpus + local);
    g.instances.push_back(ranks);
  }
  return g;
}

std::vector<std::vector<uint32_t>> served(const NodeSpec& n) {
  std::vector<std::vector<uint32_t>> out;
  for (const NicSpec& nic : nicsOf(n)) out.push_back(nic.gpus);
  return out;
}

}  // namespace

TEST_CASE("placement: a NIC-list cluster reduces to the GPUs, NICs and switches the instances use") {
  const Topology t = loadTopology(kNicList);
  // Inside one node (TP): no network, and the list goes with the count (it was kept while the count was 0).
  GroupSet tp;
  tp.name = "tp";
  tp.instances = {{0, 1, 2, 3, 4, 5, 6, 7}};
  const ConcurrentPlacement one = placeConcurrent(tp, t);
  CHECK(one.reduced.node.nics == 0);
  CHECK(one.reduced.node.nicList.empty());
  CHECK(one.reduced.node.pcieSwitches.empty());
  // Across nodes: GPU 0 shares mlx5_0 and its switch with GPU 1, so both instances run together on that NIC.
  const ConcurrentPlacement dp = placeConcurrent(acrossNodes(8, 4), t);
  CHECK(dp.instances == 2);
  CHECK(dp.reduced.node.gpus == 2);
  CHECK(served(dp.reduced.node) == std::vector<std::vector<uint32_t>>{{0, 1}});
  CHECK(dp.reduced.node.nicList[0].name == "mlx5_0");
  REQUIRE(dp.reduced.node.pcieSwitches.size() == 1);
  CHECK(dp.reduced.node.pcieSwitches[0].gpus == std::vector<uint32_t>{0, 1});
  // The generator's choice: instance 0 alone, one GPU on its NIC.
  CHECK(dp.choice.node.gpus == 1);
  CHECK(served(dp.choice.node) == std::vector<std::vector<uint32_t>>{{0}});
}

TEST_CASE("placement: a GPU with several NICs keeps all of them") {
  const Topology efa = topologyPreset("cloud-efa-32x100", 2);
  const ConcurrentPlacement dp = placeConcurrent(acrossNodes(8, 2), efa);
  CHECK(dp.instances == 1);
  CHECK(dp.reduced.node.gpus == 1);
  CHECK(dp.reduced.node.nics == 4);
  CHECK(nodeNetworkAloneGBs(dp.reduced.node) == doctest::Approx(nodeNetworkAloneGBs(efa.node)));
  CHECK(dp.choice.node.nics == 4);
}

TEST_CASE("what-if: several NICs per GPU, NIC lists and the profile through the datasheet rule") {
  // The baseline of a preset with 4 NICs per GPU is the cluster as given (it blamed a what-if never given).
  Topology efa = topologyPreset("cloud-efa-32x100", 1);
  Profile p = defaultProfile(efa);
  const Profile before = p;
  applyWhatIf(parseWhatIf("noise=0.01"), efa, p);
  CHECK(p.network.bwGBs == before.network.bwGBs);
  Topology more = efa;
  applyWhatIf(parseWhatIf("nics=16"), more, p);
  CHECK(more.node.nics == 16);
  // A NIC list: nic-bw sets every NIC's rate and the profile's network rate follows.
  Topology list = loadTopology(kNicList);
  Profile q = defaultProfile(list);
  const double net = q.network.bwGBs;
  applyWhatIf(parseWhatIf("nic-bw=2x"), list, q);
  for (const NicSpec& nic : list.node.nicList) CHECK(nic.bwGBs == 100);
  CHECK(q.network.bwGBs == doctest::Approx(std::min(2 * net, list.node.pcie.bwGBs)));
  // nics= on a list: the uniform form with the first NIC's rate, a valid topology.
  Topology fewer = loadTopology(kNicList);
  Profile r = defaultProfile(fewer);
  applyWhatIf(parseWhatIf("nics=2"), fewer, r);
  CHECK(fewer.node.nics == 2);
  CHECK(fewer.node.nicList.empty());
  CHECK(served(fewer.node) == std::vector<std::vector<uint32_t>>{{0, 1, 2, 3}, {4, 5, 6, 7}});
}

TEST_CASE("profile: efficiencies applied to the chosen cluster, the measured machine unchanged to the last digit") {
  ProfileProvenance prov;
  const Profile measured = loadProfile(MK_DEFAULT_PROFILE, &prov);
  REQUIRE(prov.system == "h200x2");
  const Topology machine = profileMachine(prov, topologyPreset("dgx-h100", 1));
  CHECK(machine.name == "h200x2");
  // On its own machine: every number as read (the committed records' predictions do not move).
  const Profile same = profileOnCluster(measured, machine, topologyPreset("h200x2", 1));
  CHECK(profileToJson(same, prov) == profileToJson(measured, prov));
  // On A100 nodes: A100's NVLink and HBM, the same fractions of them.
  const Topology a100 = topologyPreset("a100-8x200", 2);
  const Profile ap = profileOnCluster(measured, machine, a100);
  const Profile dm = defaultProfile(machine), da = defaultProfile(a100);
  CHECK(ap.nvlink.bwGBs / da.nvlink.bwGBs == doctest::Approx(measured.nvlink.bwGBs / dm.nvlink.bwGBs));
  CHECK(ap.nvlink.bwGBs < measured.nvlink.bwGBs);
  CHECK(ap.local.bwGBs / da.local.bwGBs == doctest::Approx(measured.local.bwGBs / dm.local.bwGBs));
  CHECK(ap.reduceGBs / da.reduceGBs == doctest::Approx(measured.reduceGBs / dm.reduceGBs));
  CHECK(ap.network.bwGBs == doctest::Approx(da.network.bwGBs * measured.network.bwGBs / dm.network.bwGBs));
  CHECK(ap.dispatchUs == measured.dispatchUs);  // our engine's fixed costs stay
  // TCP NICs: their rate and their transport model, not InfiniBand's.
  const Topology tcp = topologyPreset("cloud-tcp-8x200", 2);
  const Profile tp = profileOnCluster(measured, machine, tcp);
  CHECK(tp.transport.kind == "tcp");
  CHECK(tp.network.bwGBs ==
        doctest::Approx(defaultProfile(tcp).network.bwGBs * measured.network.bwGBs / dm.network.bwGBs));
  const Profile hp = profileOnCluster(measured, machine, topologyPreset("dgx-h100", 2));
  CHECK(tp.network.bwGBs != hp.network.bwGBs);
  // A machine without NICs: network numbers measured elsewhere (a loopback run) are kept as they are.
  Profile loopback = measured;
  loopback.network.bwGBs = 7;
  CHECK(profileOnCluster(loopback, machine, tcp).network.bwGBs == 7);
  // The efficiency form (what mk-calibrate writes) reads back to the same rates and names its machine.
  ProfileProvenance back;
  const Profile eff = profileFromJson(profileToEfficiencyJson(measured, prov, machine), &back);
  CHECK(back.system == "h200x2");
  CHECK(eff.nvlink.bwGBs == doctest::Approx(measured.nvlink.bwGBs).epsilon(1e-14));
  CHECK(eff.reduceGBs == doctest::Approx(measured.reduceGBs).epsilon(1e-14));
  CHECK(eff.gemmTflops == doctest::Approx(measured.gemmTflops).epsilon(1e-14));
  std::string text = profileToEfficiencyJson(measured, prov, machine);
  text.replace(text.find("\"h200x2\""), 8, "\"nowhere\"");
  CHECK_THROWS_WITH_AS(profileFromJson(text), doctest::Contains("machine must name the preset"), Error);
}

TEST_CASE("confidence: a plan's collectives carry the layered model's error, our engine's has its own class") {
  // Rows as validateLayered and validateMeasurements give them: the layered model 30 % off, our engine 2 % off.
  LayeredValidation layered;
  for (double e : {20.0, 30.0, 40.0}) {
    LayeredRow r;
    r.op = "allreduce";
    r.ranks = 2;
    r.errPct = e;
    layered.rows.push_back(r);
  }
  ValidationResult engine;
  ValidationRow row;
  row.request.spec.op = CollOp::AllReduce;
  row.request.nRanks = 2;
  row.simErrPct = 2;
  engine.rows.push_back(row);
  const ConfidenceTable t = buildConfidence(nullptr, &engine, "NVIDIA H200", "", nullptr, "NVIDIA H200", &layered);
  const ConfidenceClass& comm = t.classes().at("comm.nvlink.allreduce");
  REQUIRE(comm.error);
  CHECK(comm.error->medianAbsPct == 30);
  CHECK(comm.method.find("impl: nccl") != std::string::npos);
  CHECK(t.forComm(CommDomain::NvLink, "allreduce", 2, "NVIDIA H200").status == Status::Validated);
  REQUIRE(t.classes().at("engine.nvlink.allreduce").error);
  CHECK(t.classes().at("engine.nvlink.allreduce").error->medianAbsPct == 2);
  // No impl: nccl record of an op: not validated, whatever our engine measured.
  CHECK(t.forComm(CommDomain::NvLink, "alltoall", 2, "NVIDIA H200").status == Status::NotValidated);
}

TEST_CASE("confidence: the fused class carries the error across nodes, extrapolated to every use") {
  // Rows as validateFusedNodes gives them for one data directory: 5, 10 and 40 % off.
  FusedNodesValidation v;
  v.manifest.regime = "ranks sharing one GPU over loopback TCP; not measured across GPUs (NVLink)";
  v.manifest.base = "dgx-h100";
  v.gpu = "NVIDIA H100 80GB HBM3";
  for (double e : {5.0, -10.0, 40.0}) {
    FusedRow r;
    r.request.spec.op = FusedOp::GemmReduceScatter;
    r.request.nRanks = 2;
    r.simErrPct = e;
    v.fused.rows.push_back(r);
  }
  v.fused.skipped.push_back({"x.json", 3, "x.json: records[3]: not priced: no split"});
  const std::vector<FusedNodesValidation> fusedNodes{v};
  const ConfidenceTable t = buildConfidence(nullptr, nullptr, "", "", nullptr, "NVIDIA H200", nullptr, &fusedNodes);
  const ConfidenceClass& c = t.classes().at("fused");
  REQUIRE(c.error);
  CHECK(c.error->n == 3);
  CHECK(c.error->medianAbsPct == 10);
  CHECK(c.measuredGpu == "NVIDIA H100 80GB HBM3");
  CHECK(c.method.find("loopback TCP") != std::string::npos);
  CHECK(c.method.find("1 record(s) not priced, the first: x.json: records[3]") != std::string::npos);
  const UseConfidence u = t.forClass("fused");
  CHECK(u.status == Status::Extrapolated);
  CHECK(u.note.find("not measured across GPUs (NVLink)") != std::string::npos);
  // Without fused records across nodes: no error, and not validated where used.
  const std::vector<FusedNodesValidation> none;
  const ConfidenceTable t0 = buildConfidence(nullptr, nullptr, "", "", nullptr, "NVIDIA H200", nullptr, &none);
  CHECK_FALSE(t0.classes().at("fused").error);
  CHECK(t0.forClass("fused").status == Status::NotValidated);
}
