// Tests of NIC lists, the NIC-sharing rule and the transport model (docs/transports.md).
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "expect_error.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

using Json = nlohmann::json;

/// dgx-h100 with `nics` uniform NICs of 50 GB/s (2 nodes).
Topology withNics(uint32_t nics, double nicGBs = 50) {
  Topology t = topologyPreset("dgx-h100", 2);
  t.node.nics = nics;
  t.node.nic.bwGBs = nicGBs;
  return t;
}

std::vector<std::vector<uint32_t>> servedGpus(const NodeSpec& n) {
  std::vector<std::vector<uint32_t>> out;
  for (const NicSpec& nic : nicsOf(n)) out.push_back(nic.gpus);
  return out;
}

}  // namespace

TEST_CASE("nics: the uniform form expands to the even mapping") {
  CHECK(servedGpus(withNics(8).node) == std::vector<std::vector<uint32_t>>{{0}, {1}, {2}, {3}, {4}, {5}, {6}, {7}});
  CHECK(servedGpus(withNics(4).node) == std::vector<std::vector<uint32_t>>{{0, 1}, {2, 3}, {4, 5}, {6, 7}});
  const auto efa = topologyPreset("cloud-efa-32x100", 2);
  const auto byGpu = gpuNics(efa.node);
  REQUIRE(byGpu.size() == 8);
  CHECK(byGpu[0] == std::vector<uint32_t>{0, 1, 2, 3});
  CHECK(byGpu[7] == std::vector<uint32_t>{28, 29, 30, 31});
}

TEST_CASE("nics: the share rule follows NICs per GPU, GPUs per NIC, PCIe and switch uplinks") {
  CHECK(gpuNetworkGBs(withNics(8).node, 3) == doctest::Approx(50));
  CHECK(gpuNetworkGBs(withNics(4).node, 3) == doctest::Approx(25));       // two senders on one NIC
  CHECK(gpuNetworkAloneGBs(withNics(4).node, 3) == doctest::Approx(50));  // its neighbour quiet
  const std::vector<bool> onlyEven{true, false, true, false, true, false, true, false};
  CHECK(gpuNetworkGBs(withNics(4).node, 2, &onlyEven) == doctest::Approx(50));
  // 4 x 12.5 GB/s per GPU striped: 50; 32 x 25 GB/s would be 100 per GPU, capped by PCIe Gen5 (64).
  CHECK(gpuNetworkGBs(topologyPreset("cloud-efa-32x100", 2).node, 5) == doctest::Approx(50));
  CHECK(gpuNetworkGBs(withNics(32, 25).node, 5) == doctest::Approx(64));
  // A switch with a 60 GB/s uplink in front of GPUs 0-3: four senders get 15 each, one alone its NIC's 50.
  Topology t = withNics(8);
  t.node.pcieSwitches.push_back(PcieSwitchSpec{60, {0, 1, 2, 3}, {}});
  validateTopology(t);
  CHECK(gpuNetworkGBs(t.node, 1) == doctest::Approx(15));
  CHECK(gpuNetworkGBs(t.node, 5) == doctest::Approx(50));
  CHECK(gpuNetworkAloneGBs(t.node, 1) == doctest::Approx(50));
}

TEST_CASE("nics: per-rank shares count only the ranks that send") {
  const Topology t = withNics(4);
  const std::vector<uint32_t> nodeOf{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1};
  std::vector<bool> all(16, true), ring(16, false);
  ring[7] = ring[15] = true;  // a flat ring crosses nodes at the last GPU of each node
  const auto a = rankNetworkShares(t, nodeOf, all);
  const auto r = rankNetworkShares(t, nodeOf, ring);
  CHECK(a[6] == doctest::Approx(0.5));
  CHECK(a[15] == doctest::Approx(0.5));
  CHECK(r[7] == doctest::Approx(1.0));
  CHECK(r[15] == doctest::Approx(1.0));
}

TEST_CASE("nics: the list form round-trips through JSON, the old form still reads") {
  Topology t = withNics(4);
  t.node.nicList = nicsOf(t.node);
  t.node.nicList[1].name = "mlx5_1";
  t.node.pcieSwitches.push_back(PcieSwitchSpec{64, {2, 3}, {1}});
  validateTopology(t);
  const Topology back = topologyFromJson(topologyToJson(t));
  CHECK(servedGpus(back.node) == servedGpus(t.node));
  CHECK(back.node.nics == 4);
  CHECK(back.node.nicList[1].name == "mlx5_1");
  REQUIRE(back.node.pcieSwitches.size() == 1);
  CHECK(back.node.pcieSwitches[0].nics == std::vector<uint32_t>{1});
  // A preset written and read back keeps its mapping (written as a list).
  const Topology efa = topologyPreset("cloud-efa-32x100", 2);
  const Json j = Json::parse(topologyToJson(efa));
  CHECK(j["node"]["nics"].is_array());
  CHECK(j["node"]["nics"][5]["transport"] == "efa");
  CHECK(servedGpus(topologyFromJson(j.dump()).node) == servedGpus(efa.node));
}

TEST_CASE("nics: the single-node form without NICs (a zero-rate nic block) reads again") {
  Json j = Json::parse(topologyToJson(topologyPreset("h200x2", 1)));
  j["node"]["nics"] = 0;
  j["node"]["nic"] = {{"bwGBs", 0}, {"latencyUs", 0}};
  const Topology t = topologyFromJson(j.dump());
  CHECK(t.node.nics == 0);
  CHECK(t.node.nic.bwGBs == 0);
  CHECK(nicsOf(t.node).empty());
  // With NICs, a zero rate is still refused naming the field.
  j["node"]["nics"] = 2;
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::ParseError, "node.nic.bwGBs");
}

TEST_CASE("nics: bad NIC lists are rejected naming the field") {
  auto listed = [] {
    Topology t = withNics(4);
    t.node.nicList = nicsOf(t.node);
    return t;
  };
  struct Case {
    const char* field;
    std::function<void(Topology&)> breakIt;
  };
  const std::vector<Case> cases{
      {"node.nics[2].gpus names GPU 9", [](Topology& t) { t.node.nicList[2].gpus = {9}; }},
      {"node.nics[0].gpus lists GPU 1 twice",
       [](Topology& t) {
         t.node.nicList[0].gpus = {1, 1};
       }},
      {"node.nics: GPU 1 has no NIC", [](Topology& t) { t.node.nicList[0].gpus = {0}; }},
      {"node.nics[3].name: duplicate NIC", [](Topology& t) { t.node.nicList[2].name = t.node.nicList[3].name = "x"; }},
      {"node.nics[1].bwGBs", [](Topology& t) { t.node.nicList[1].bwGBs = 4e5; }},
      {"node.nics[1].latencyUs", [](Topology& t) { t.node.nicList[1].latencyUs = -1; }},
      {"node.nics[0].transport", [](Topology& t) { t.node.nicList[0].transport = "ethernet"; }},
      {"node.nics[2].transport: every NIC", [](Topology& t) { t.node.nicList[2].transport = "tcp"; }},
      {"node.nics: the count", [](Topology& t) { t.node.nics = 8; }},
      {"node.pcieSwitches[0].gpus names GPU 8",
       [](Topology& t) {
         t.node.pcieSwitches.push_back({64, {8}, {}});
       }},
      {"node.pcieSwitches[1].gpus: GPU 0 is behind two switches",
       [](Topology& t) {
         t.node.pcieSwitches = {{64, {0}, {}}, {64, {0}, {}}};
       }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.field);
    Topology t = listed();
    c.breakIt(t);
    expectError([&] { validateTopology(t); }, ErrorCode::InvalidArgument, {c.field});
  }
  // From a file: the field path and the parse rules.
  Json j = Json::parse(topologyToJson(listed()));
  j["node"]["nics"][0]["gpus"] = Json::array({0, 12});
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::InvalidArgument, {"node.nics[0].gpus", "GPU 12"});
  j["node"]["nic"] = Json{{"bwGBs", 50}, {"latencyUs", 2.5}};
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::ParseError, {"node.nic is only for the uniform"});
}

TEST_CASE("transport: defaults are monotone, valid, and interpolate in log(bytes)") {
  for (const auto& kind : nicTransports()) {
    CAPTURE(kind);
    TransportModel t = defaultTransport(kind);
    validateTransport(t, "transport");
    if (kind == "ib") {
      CHECK(t.efficiency.empty());
      t.efficiency = ibFramingCurve();
      validateTransport(t, "transport");
    }
    CHECK(t.efficiency.front().fraction < t.efficiency.back().fraction);
    CHECK(t.efficiency.back().fraction > 0.9);
    CHECK(t.efficiency.back().fraction < 1.0);
  }
  TransportModel t;
  t.efficiency = {{1000, 0.5}, {100000, 0.9}};
  CHECK(transportEfficiency(t, 10) == doctest::Approx(0.5));
  CHECK(transportEfficiency(t, 10000) == doctest::Approx(0.7));  // halfway in log(bytes)
  CHECK(transportEfficiency(t, 1e9) == doctest::Approx(0.9));
  CHECK(transportEfficiency(TransportModel{}, 64) == 1.0);
  expectError([] { defaultTransport("myrinet"); }, ErrorCode::InvalidArgument, {"ib, roce, efa, tcp"});
}

TEST_CASE("transport: per-message defaults are the cited vendor numbers") {
  // docs/transports.md, "Per-message overhead and latency": aws-ofi-nccl's P5 step (net_lat) and completion cost;
  // NCCL's IB and socket transports and the TCPX plugin report no latency of their own.
  CHECK(defaultTransport("efa").latencyUs == 20.0);
  CHECK(defaultTransport("efa").overheadUs == 3.0);
  for (const char* kind : {"ib", "roce", "tcp"}) {
    CAPTURE(kind);
    CHECK(defaultTransport(kind).latencyUs == 0.0);
    CHECK(defaultTransport(kind).overheadUs == 0.0);
  }
}

TEST_CASE("transport: a small all-reduce across nodes pays the transport's per-message cost on every hop") {
  // Two nodes, one rank each: nccl-ring's two steps (reduce-scatter, all-gather) each wait for one message across.
  CollectiveSpec spec;
  spec.op = CollOp::AllReduce;
  spec.algo = Algorithm::NcclRing;
  spec.count = 256;
  GenOptions g;
  g.chunks = 1;
  g.channels = 1;
  g.protocol = Protocol::LL;
  const Schedule s = generate(spec, {0, 1}, g);
  for (const char* preset : {"cloud-efa-32x100", "cloud-tcp-8x200"}) {
    CAPTURE(preset);
    const Profile p = layeredProfile(defaultProfile(topologyPreset(preset, 2)), Protocol::LL);
    Profile bare = p;
    bare.transport.overheadUs = 0;
    bare.transport.latencyUs = 0;
    const double slower = simulateUncontended(s, p).totalUs - simulateUncontended(s, bare).totalUs;
    CHECK(slower == doctest::Approx(2 * (p.transport.overheadUs + p.transport.latencyUs)));
    if (p.transport.kind == "efa") CHECK(slower == doctest::Approx(2 * (3.0 + 20.0)));
  }
  // What the planner prices ("nccl auto" over 2 nodes of 8): a 4 KiB all-reduce crosses the nodes at least once
  // per phase, so EFA's defaults make it slower by at least two messages' cost.
  const Topology efa = topologyPreset("cloud-efa-32x100", 2);
  const Profile p = defaultProfile(efa);
  Profile bare = p;
  bare.transport.overheadUs = 0;
  bare.transport.latencyUs = 0;
  const double withCost = layeredCandidates(CollOp::AllReduce, 1024, DType::Float32, efa, 16, p).front().closedFormUs;
  const double without = layeredCandidates(CollOp::AllReduce, 1024, DType::Float32, efa, 16, bare).front().closedFormUs;
  CHECK(withCost - without >= 2 * (3.0 + 20.0) - 1e-9);
}

TEST_CASE("transport: a ProxyPut pays its issue on the lane, its latency overlaps, and moves wire bytes") {
  Profile p = defaultProfile(topologyPreset("dgx-h100", 2));
  p.transport.overheadUs = 1;
  p.transport.latencyUs = 2;
  p.transport.efficiency = {{4096, 0.5}, {4194304, 0.95}};  // below line rate at 1 MiB: the wire moves more
  const StepPrice pr = stepPrice(p, StepKind::ProxyPut, LinkClass::Network, 1048576, false);
  // The datasheet profile splits proxyUs: the post (proxyPostUs) is serial, the FIFO's visibility overlaps.
  REQUIRE(p.proxyPostUs > 0);
  REQUIRE(p.proxyPostUs < p.proxyUs);
  CHECK(pr.alphaUs == doctest::Approx(p.proxyPostUs + 1));
  CHECK(proxyIssueUs(p) + proxyLatencyUs(p) == doctest::Approx(proxyAlphaUs(p)));
  CHECK(proxyLatencyUs(p) == doctest::Approx(p.proxyUs - p.proxyPostUs + p.network.alphaUs + 2));
  CHECK(pr.amount == doctest::Approx(1048576 / transportEfficiency(p.transport, 1048576)));
  CHECK(pr.amount > 1048576);
  // 8 slots: a message longer than an eighth of its latency keeps the lane only for its issue and bytes.
  const double busy = stepLaneUs(pr, 1);
  CHECK(proxyLaneUs(p, busy) == doctest::Approx(busy));
  CHECK(proxyLandsAfterUs(p, busy) == doctest::Approx(proxyLatencyUs(p)));
  // A tiny message: the slots bind, and the lane waits for one to free.
  CHECK(proxyLaneUs(p, 0.1) == doctest::Approx((0.1 + proxyLatencyUs(p)) / 8));
  // One slot is the serial rule: the lane pays issue, bytes and latency, and the message lands at its end.
  p.transport.inFlight = 1;
  CHECK(proxyLaneUs(p, busy) == doctest::Approx(busy + proxyLatencyUs(p)));
  // proxyPostUs unset (or not below proxyUs): the whole proxyUs is serial, as in profiles written before it.
  p.proxyPostUs = 0;
  CHECK(proxyIssueUs(p) == doctest::Approx(p.proxyUs + 1));
  CHECK(proxyLatencyUs(p) == doctest::Approx(p.network.alphaUs + 2));
  CHECK(proxyLaneUs(p, busy) == doctest::Approx(busy + proxyLatencyUs(p)));
  CHECK(proxyLandsAfterUs(p, busy) == doctest::Approx(0));
}

TEST_CASE("transport: the profile JSON round-trips it and rejects bad values naming the field") {
  Profile p = defaultProfile(topologyPreset("cloud-tcp-8x200", 2));
  CHECK(p.transport.kind == "tcp");
  const Profile back = profileFromJson(profileToJson(p));
  CHECK(back.transport.kind == "tcp");
  CHECK(back.transport.inFlight == p.transport.inFlight);
  REQUIRE(back.transport.efficiency.size() == p.transport.efficiency.size());
  CHECK(back.transport.efficiency[2].fraction == doctest::Approx(p.transport.efficiency[2].fraction));
  struct Case {
    const char* field;
    std::function<void(Json&)> breakIt;
  };
  const std::vector<Case> cases{
      {"transport.efficiency[1].fraction must be in (0, 1]", [](Json& j) { j["efficiency"][1]["fraction"] = 1.5; }},
      {"transport.efficiency[0].fraction must be in (0, 1]", [](Json& j) { j["efficiency"][0]["fraction"] = 0; }},
      {"transport.efficiency[2].fraction must not fall below the point before",
       [](Json& j) { j["efficiency"][2]["fraction"] = 0.1; }},
      {"transport.efficiency[1].bytes must be larger", [](Json& j) { j["efficiency"][1]["bytes"] = 1; }},
      {"transport.inFlight must be >= 1", [](Json& j) { j["inFlight"] = 0; }},
      {"transport.kind must be one of", [](Json& j) { j["kind"] = "udp"; }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.field);
    Json j = Json::parse(profileToJson(p));
    c.breakIt(j["transport"]);
    expectError([&] { profileFromJson(j.dump()); }, ErrorCode::InvalidArgument, {c.field});
  }
  // Times out of range are refused at the field, as the reader reads them.
  for (const auto& [field, value] : {std::pair<const char*, double>{"overheadUs", -1}, {"latencyUs", 1e300}}) {
    CAPTURE(field);
    Json j = Json::parse(profileToJson(p));
    j["transport"][field] = value;
    expectError([&] { profileFromJson(j.dump()); }, ErrorCode::ParseError,
                {std::string("transport.") + field + " must be a finite number in [0, 1000000]"});
  }
  // A profile written before the field existed: full rate, no window.
  Json old = Json::parse(profileToJson(p));
  old.erase("transport");
  const Profile legacy = profileFromJson(old.dump());
  CHECK(legacy.transport.efficiency.empty());
  CHECK(transportEfficiency(legacy.transport, 64) == 1.0);
}

TEST_CASE("nics: timeline with the topology and closed form agree where GPUs share NICs") {
  // 2 and 4 nodes of 8 GPUs on 4 NICs: the closed form prices the shared NIC, as the topology-aware timeline.
  for (uint32_t nodes : {2u, 4u}) {
    Topology t = withNics(4);
    t.nodes = nodes;
    const Profile p = defaultProfile(t);
    const uint32_t n = t.totalGpus();
    struct Case {
      CollOp op;
      Algorithm algo;
    };
    for (const Case& c : {Case{CollOp::AllReduce, Algorithm::Ring}, Case{CollOp::AllReduce, Algorithm::Hierarchical},
                          Case{CollOp::AllGather, Algorithm::Direct}, Case{CollOp::ReduceScatter, Algorithm::Direct}}) {
      CAPTURE(nodes);
      CAPTURE(toString(c.algo));
      CollectiveSpec spec;
      spec.op = c.op;
      spec.algo = c.algo;
      spec.count = (c.op == CollOp::AllReduce ? 1u << 22 : 1u << 19);
      GenOptions g;
      g.chunks = 2;
      g.inter = InterPhase::Rhd;
      const Schedule s = generate(spec, t.layout(n), g);
      const double cf = closedForm(spec, g, t, n, p).totalUs;
      const double shared = simulateUncontended(s, p, t).totalUs;
      const double alone = simulateUncontended(s, p).totalUs;
      CHECK(shared == doctest::Approx(cf).epsilon(0.01));
      if (c.algo != Algorithm::Ring) CHECK(shared > 1.3 * alone);  // sharing matters there
    }
  }
}
