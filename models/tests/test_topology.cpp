// Tests of the cluster description: presets, validation, JSON form, loadTopology, layout.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdio>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include <unistd.h>
#include <nlohmann/json.hpp>

#include "expect_error.hpp"
#include "mk/error.hpp"
#include "mk/schedule/io.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

using Json = nlohmann::json;

void checkSame(const Topology& a, const Topology& b) {
  CHECK(a.name == b.name);
  CHECK(a.nodes == b.nodes);
  CHECK(a.node.gpu == b.node.gpu);
  CHECK(a.node.gpus == b.node.gpus);
  CHECK(a.node.sms == b.node.sms);
  CHECK(a.node.bf16Tflops == b.node.bf16Tflops);
  CHECK(a.node.hbmGBs == b.node.hbmGBs);
  CHECK(a.node.nvlink.bwGBs == b.node.nvlink.bwGBs);
  CHECK(a.node.nvlink.latencyUs == b.node.nvlink.latencyUs);
  CHECK(a.node.nvlink.switched == b.node.nvlink.switched);
  CHECK(a.node.pcie.bwGBs == b.node.pcie.bwGBs);
  CHECK(a.node.pcie.latencyUs == b.node.pcie.latencyUs);
  CHECK(a.node.nics == b.node.nics);
  CHECK(a.node.nic.bwGBs == b.node.nic.bwGBs);
  CHECK(a.node.nic.latencyUs == b.node.nic.latencyUs);
  CHECK(a.fabric.kind == b.fabric.kind);
  CHECK(a.fabric.nodesPerLeaf == b.fabric.nodesPerLeaf);
  CHECK(a.fabric.oversubscription == b.fabric.oversubscription);
  CHECK(a.fabric.switchLatencyUs == b.fabric.switchLatencyUs);
}

/// One bad value: how to break a valid topology, and the field name the error must carry.
struct BadField {
  const char* field;
  std::function<void(Topology&)> breakIt;
};

void expectAllRejected(const std::vector<BadField>& cases) {
  for (const auto& c : cases) {
    CAPTURE(c.field);
    Topology t = topologyPreset("dgx-h200", 2);
    c.breakIt(t);
    expectError([&] { validateTopology(t); }, ErrorCode::InvalidArgument, {c.field});
  }
}

/// A scratch path under /tmp unique to this test binary's process.
std::string scratchPath(const std::string& stem) {
  return "/tmp/mk-test-topology-" + std::to_string(static_cast<long long>(::getpid())) + "-" + stem + ".json";
}

}  // namespace

TEST_CASE("topology: h200x2 preset carries the H200 pair's datasheet values") {
  const Topology t = topologyPreset("h200x2");
  CHECK(t.name == "h200x2");
  CHECK(t.nodes == 1);
  CHECK(t.node.gpu == "NVIDIA H200");
  CHECK(t.node.gpus == 2);
  CHECK(t.node.sms == 132);
  CHECK(t.node.bf16Tflops == 989);
  CHECK(t.node.hbmGBs == 4800);
  CHECK(t.node.nvlink.bwGBs == 450);
  CHECK(t.node.nvlink.latencyUs == doctest::Approx(0.65));
  CHECK_FALSE(t.node.nvlink.switched);
  CHECK(t.node.pcie.bwGBs == 64);
  CHECK(t.node.pcie.latencyUs == 1.0);
  CHECK(t.node.nics == 0);
  CHECK(t.totalGpus() == 2);
  CHECK(t.fabric.kind == "rail-leaf-spine");
}

TEST_CASE("topology: dgx presets have eight switched GPUs and eight 400G NICs") {
  for (const char* name : {"dgx-h100", "dgx-h200"}) {
    CAPTURE(name);
    const Topology t = topologyPreset(name);
    CHECK(t.name == name);
    CHECK(t.node.gpus == 8);
    CHECK(t.node.sms == 132);
    CHECK(t.node.bf16Tflops == 989);
    CHECK(t.node.nvlink.bwGBs == 450);
    CHECK(t.node.nvlink.switched);
    CHECK(t.node.nics == 8);
    CHECK(t.node.nic.bwGBs == 50);
    CHECK(t.node.nic.latencyUs == doctest::Approx(2.5));
    CHECK(t.node.pcie.bwGBs == 64);
    CHECK(t.fabric.nodesPerLeaf == 32);
    CHECK(t.fabric.oversubscription == 1.0);
    CHECK(t.fabric.switchLatencyUs == doctest::Approx(0.5));
  }
  CHECK(topologyPreset("dgx-h100").node.gpu == "NVIDIA H100");
  CHECK(topologyPreset("dgx-h100").node.hbmGBs == 3350);
  CHECK(topologyPreset("dgx-h200").node.gpu == "NVIDIA H200");
  CHECK(topologyPreset("dgx-h200").node.hbmGBs == 4800);
}

TEST_CASE("topology: a multi-node preset multiplies the GPU count") {
  const Topology t = topologyPreset("dgx-h100", 13);
  CHECK(t.nodes == 13);
  CHECK(t.totalGpus() == 104);
  CHECK(topologyPreset("dgx-h200", 1024).totalGpus() == 8192);
}

TEST_CASE("topology: the preset list names the six presets") {
  const auto names = topologyPresets();
  REQUIRE(names.size() == 6);
  CHECK(names[0] == "h200x2");
  CHECK(names[1] == "dgx-h100");
  CHECK(names[2] == "dgx-h200");
  CHECK(names[3] == "a100-8x200");
  CHECK(names[4] == "cloud-efa-32x100");
  CHECK(names[5] == "cloud-tcp-8x200");
  for (const auto& n : names) CHECK_NOTHROW(validateTopology(topologyPreset(n)));
}

TEST_CASE("topology: h200x2 on more than one node is rejected for lack of NICs") {
  expectError([] { topologyPreset("h200x2", 2); }, ErrorCode::InvalidArgument,
              {"h200x2 has no NICs", "nics > 0", "dgx-h200"});
}

TEST_CASE("topology: an unknown preset is NotFound and lists the presets") {
  expectError([] { topologyPreset("dgx-b300"); }, ErrorCode::NotFound, {"dgx-b300", "h200x2", "dgx-h100", "dgx-h200"});
}

TEST_CASE("topology: a preset with zero nodes is rejected") {
  expectError([] { topologyPreset("dgx-h100", 0); }, ErrorCode::InvalidArgument, {"nodes", "0"});
}

TEST_CASE("topology: bad counts are rejected naming the field") {
  expectAllRejected({
      {"nodes", [](Topology& t) { t.nodes = 0; }},
      {"node.gpus", [](Topology& t) { t.node.gpus = 0; }},
      {"node.sms", [](Topology& t) { t.node.sms = 0; }},
      {"node.nics", [](Topology& t) { t.node.nics = 0; }},
      {"node.gpus",
       [](Topology& t) {
         t.nodes = 1u << 20;
         t.node.gpus = 1u << 13;
       }},
      {"fabric.nodesPerLeaf", [](Topology& t) { t.fabric.nodesPerLeaf = 0; }},
  });
}

TEST_CASE("topology: bad bandwidths are rejected naming the field and the value") {
  expectAllRejected({
      {"node.bf16Tflops", [](Topology& t) { t.node.bf16Tflops = 0; }},
      {"node.hbmGBs", [](Topology& t) { t.node.hbmGBs = -1; }},
      {"node.nvlink.bwGBs", [](Topology& t) { t.node.nvlink.bwGBs = 0; }},
      {"node.pcie.bwGBs", [](Topology& t) { t.node.pcie.bwGBs = -64; }},
      {"node.nic.bwGBs", [](Topology& t) { t.node.nic.bwGBs = 0; }},
  });
  Topology t = topologyPreset("dgx-h100");
  t.node.nvlink.bwGBs = -3;
  expectError([&] { validateTopology(t); }, ErrorCode::InvalidArgument, {"node.nvlink.bwGBs must be > 0 (got -3)"});
}

TEST_CASE("topology: NaN and infinite values are rejected") {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  const double inf = std::numeric_limits<double>::infinity();
  expectAllRejected({
      {"node.hbmGBs", [=](Topology& t) { t.node.hbmGBs = nan; }},
      {"node.bf16Tflops", [=](Topology& t) { t.node.bf16Tflops = inf; }},
      {"node.nvlink.latencyUs", [=](Topology& t) { t.node.nvlink.latencyUs = nan; }},
      {"node.pcie.latencyUs", [=](Topology& t) { t.node.pcie.latencyUs = inf; }},
      {"node.nic.bwGBs", [=](Topology& t) { t.node.nic.bwGBs = nan; }},
      {"fabric.oversubscription", [=](Topology& t) { t.fabric.oversubscription = nan; }},
      {"fabric.switchLatencyUs", [=](Topology& t) { t.fabric.switchLatencyUs = inf; }},
  });
}

TEST_CASE("topology: negative latencies and a bad fabric are rejected naming the field") {
  expectAllRejected({
      {"node.nvlink.latencyUs", [](Topology& t) { t.node.nvlink.latencyUs = -0.1; }},
      {"node.pcie.latencyUs", [](Topology& t) { t.node.pcie.latencyUs = -1; }},
      {"node.nic.latencyUs", [](Topology& t) { t.node.nic.latencyUs = -2.5; }},
      {"fabric.switchLatencyUs", [](Topology& t) { t.fabric.switchLatencyUs = -0.5; }},
      {"fabric.oversubscription", [](Topology& t) { t.fabric.oversubscription = 0.5; }},
      {"fabric.kind", [](Topology& t) { t.fabric.kind = "dragonfly"; }},
  });
  // Zero latency is a legal what-if.
  Topology t = topologyPreset("dgx-h200", 4);
  t.node.nvlink.latencyUs = 0;
  t.fabric.switchLatencyUs = 0;
  CHECK_NOTHROW(validateTopology(t));
}

TEST_CASE("topology: JSON round trip preserves every field of every preset") {
  for (const auto& name : topologyPresets()) {
    CAPTURE(name);
    const Topology t = topologyPreset(name, name == "h200x2" ? 1 : 7);
    const Topology back = topologyFromJson(topologyToJson(t));
    checkSame(t, back);
    CHECK(topologyToJson(back, -1) == topologyToJson(t, -1));
  }
}

TEST_CASE("topology: JSON round trip keeps odd doubles bit for bit") {
  Topology t = topologyPreset("dgx-h200", 3);
  t.name = "custom";
  t.node.nvlink.bwGBs = 0.1 + 0.2;
  t.node.nic.latencyUs = 1.0 / 3.0;
  t.fabric.oversubscription = 3.0 / 1.7;
  t.fabric.nodesPerLeaf = 17;
  t.node.nvlink.switched = false;
  checkSame(t, topologyFromJson(topologyToJson(t, 0)));
  const Json j = Json::parse(topologyToJson(t));
  CHECK(j.at("schema") == "mkernel.topology.v1");
  CHECK(j.at("node").at("nvlink").at("switched") == false);
}

TEST_CASE("topology: JSON preset form selects a preset and a node count") {
  const Topology t = topologyFromJson(R"({"preset": "dgx-h100", "nodes": 4})");
  checkSame(t, topologyPreset("dgx-h100", 4));
  CHECK(topologyFromJson(R"({"preset": "h200x2"})").totalGpus() == 2);
  expectError([] { topologyFromJson(R"({"preset": "h200x2", "nodes": 2})"); }, ErrorCode::InvalidArgument, {"no NICs"});
  expectError([] { topologyFromJson(R"({"preset": "nope"})"); }, ErrorCode::NotFound, {"nope", "dgx-h200"});
  expectError([] { topologyFromJson(R"({"preset": "dgx-h100", "gpus": 4})"); }, ErrorCode::ParseError, {"gpus"});
  expectError([] { topologyFromJson(R"({"preset": 3})"); }, ErrorCode::ParseError, {"preset", "string"});
}

TEST_CASE("topology: JSON missing fields are ParseErrors naming their path") {
  const Json full = Json::parse(topologyToJson(topologyPreset("dgx-h200", 2)));
  const std::vector<std::vector<std::string>> paths = {{"name"},
                                                       {"nodes"},
                                                       {"node"},
                                                       {"fabric"},
                                                       {"schema"},
                                                       {"node", "gpus"},
                                                       {"node", "hbmGBs"},
                                                       {"node", "nvlink", "bwGBs"},
                                                       {"node", "nvlink", "switched"},
                                                       {"node", "pcie", "latencyUs"},
                                                       {"node", "nics"},
                                                       {"fabric", "oversubscription"},
                                                       {"fabric", "kind"}};
  for (const auto& path : paths) {
    std::string dotted;
    for (const auto& p : path) dotted += (dotted.empty() ? "" : ".") + p;
    CAPTURE(dotted);
    Json j = full;
    Json* parent = &j;
    for (std::size_t i = 0; i + 1 < path.size(); ++i) parent = &(*parent)[path[i]];
    parent->erase(path.back());
    expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::ParseError, {dotted});
  }
  Json j = full;
  j["node"]["nics"][3].erase("bwGBs");
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::ParseError, {"node.nics[3].bwGBs"});
}

TEST_CASE("topology: JSON mistyped fields are ParseErrors naming their path") {
  const Json full = Json::parse(topologyToJson(topologyPreset("dgx-h100", 2)));
  struct Case {
    const char* path;
    std::function<void(Json&)> mutate;
  };
  const std::vector<Case> cases = {
      {"node.gpus", [](Json& j) { j["node"]["gpus"] = "8"; }},
      {"node.gpus", [](Json& j) { j["node"]["gpus"] = 8.5; }},
      {"nodes", [](Json& j) { j["nodes"] = -1; }},
      {"nodes", [](Json& j) { j["nodes"] = 5000000000LL; }},
      {"node.nvlink.bwGBs", [](Json& j) { j["node"]["nvlink"]["bwGBs"] = "fast"; }},
      {"node.nvlink.switched", [](Json& j) { j["node"]["nvlink"]["switched"] = 1; }},
      {"node.nvlink", [](Json& j) { j["node"]["nvlink"] = 450; }},
      {"name", [](Json& j) { j["name"] = nullptr; }},
      {"fabric.kind", [](Json& j) { j["fabric"]["kind"] = 7; }},
      {"node.nvlink.bwGbs", [](Json& j) { j["node"]["nvlink"]["bwGbs"] = 450; }},  // misspelt key
      {"schema", [](Json& j) { j["schema"] = "mkernel.topology.v9"; }},
  };
  for (const auto& c : cases) {
    CAPTURE(c.path);
    Json j = full;
    c.mutate(j);
    expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::ParseError, {c.path});
  }
}

TEST_CASE("topology: JSON values out of range are rejected at the field or by validation after parsing") {
  Json j = Json::parse(topologyToJson(topologyPreset("dgx-h100", 2)));
  j["node"]["nvlink"]["bwGBs"] = -3;
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::ParseError,
              {"node.nvlink.bwGBs must be a finite number in [0.001, 1000000] (got number -3)"});
  j["node"]["nvlink"]["bwGBs"] = 5e-324;
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::ParseError, {"node.nvlink.bwGBs must be a finite"});
  j = Json::parse(topologyToJson(topologyPreset("dgx-h100", 2)));
  j["fabric"]["nodesPerLeaf"] = 4294967295u;
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::InvalidArgument,
              {"fabric.nodesPerLeaf must be in [1, 65536] (got 4294967295)"});
  j = Json::parse(topologyToJson(topologyPreset("dgx-h100", 2)));
  j["node"]["nics"] = Json::array();
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::InvalidArgument, {"node.nics", "no NICs"});
  // The first form still reads: a count and one NIC for all.
  j["node"]["nics"] = 0;
  j["node"]["nic"] = Json{{"bwGBs", 50}, {"latencyUs", 2.5}};
  expectError([&] { topologyFromJson(j.dump()); }, ErrorCode::InvalidArgument, {"node.nics", "no NICs"});
}

TEST_CASE("topology: text that is not a JSON object is a ParseError") {
  expectError([] { topologyFromJson("{\"schema\": "); }, ErrorCode::ParseError, {"not valid JSON"});
  expectError([] { topologyFromJson("[1, 2]"); }, ErrorCode::ParseError, {"object"});
  expectError([] { topologyFromJson(""); }, ErrorCode::ParseError, {"JSON"});
}

TEST_CASE("topology: loadTopology resolves preset names and overrides the node count") {
  checkSame(loadTopology("dgx-h200"), topologyPreset("dgx-h200", 1));
  checkSame(loadTopology("dgx-h200", 16), topologyPreset("dgx-h200", 16));
  CHECK(loadTopology("h200x2", 0).nodes == 1);
  expectError([] { loadTopology("h200x2", 3); }, ErrorCode::InvalidArgument, {"no NICs"});
}

TEST_CASE("topology: loadTopology of an unknown name says it is neither a preset nor a file") {
  expectError(
      [] { loadTopology("/nonexistent/cluster.json"); }, ErrorCode::NotFound,
      {"unknown cluster '/nonexistent/cluster.json'",
       "not a preset (h200x2, dgx-h100, dgx-h200, a100-8x200, cloud-efa-32x100, cloud-tcp-8x200)", "no such file"});
  expectError([] { loadTopology(""); }, ErrorCode::NotFound, {"not a preset"});
}

TEST_CASE("topology: loadTopology reads a JSON file and applies the node override") {
  Topology t = topologyPreset("dgx-h100", 2);
  t.name = "my-cluster";
  t.fabric.oversubscription = 2;
  const std::string path = scratchPath("full");
  writeFileAtomic(path, topologyToJson(t));
  checkSame(loadTopology(path), t);
  const Topology four = loadTopology(path, 4);
  CHECK(four.nodes == 4);
  CHECK(four.fabric.oversubscription == 2);

  const std::string shortPath = scratchPath("short");
  writeFileAtomic(shortPath, R"({"preset": "dgx-h200", "nodes": 4})");
  checkSame(loadTopology(shortPath), topologyPreset("dgx-h200", 4));
  CHECK(loadTopology(shortPath, 2).totalGpus() == 16);

  const std::string badPath = scratchPath("bad");
  writeFileAtomic(badPath, R"({"schema": "mkernel.topology.v1", "name": "x"})");
  expectError([&] { loadTopology(badPath); }, ErrorCode::ParseError, {badPath, "nodes"});
  std::remove(path.c_str());
  std::remove(shortPath.c_str());
  std::remove(badPath.c_str());
}

TEST_CASE("topology: layout places ranks node-major") {
  const Topology t = topologyPreset("dgx-h100", 3);
  const auto all = t.layout(24);
  REQUIRE(all.size() == 24);
  for (uint32_t r = 0; r < 24; ++r) CHECK(all[r] == r / 8);
  const auto part = t.layout(11);
  CHECK(part == std::vector<uint32_t>{0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1});
  CHECK(topologyPreset("h200x2").layout(1) == std::vector<uint32_t>{0});
}

TEST_CASE("topology: layout rejects zero ranks and more ranks than GPUs with the numbers") {
  const Topology t = topologyPreset("dgx-h200", 2);
  expectError([&] { t.layout(0); }, ErrorCode::InvalidArgument, {"16 GPUs", "0 ranks"});
  expectError([&] { t.layout(17); }, ErrorCode::InvalidArgument, {"16 GPUs", "17 ranks"});
}
