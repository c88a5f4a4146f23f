// The layered baseline (nccl-ring, nccl-tree, LL / LL128 step flags): mk/algorithms/nccl.hpp.
#include <doctest/doctest.h>

#include <algorithm>
#include <vector>

#include "expect_error.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/nccl_topo.hpp"
#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

Profile testProfile() {
  Profile p = defaultProfile(topologyPreset("dgx-h100", 2));
  p.nvlink = LinkCost{1.5, 300};
  p.userPutUs = 0.7;
  p.putIssueUs = 0.9;
  p.peerUserUs = 0.4;
  return p;
}

CollectiveSpec specOf(CollOp op, Algorithm a, uint64_t count) {
  CollectiveSpec s;
  s.op = op;
  s.algo = a;
  s.count = count;
  return s;
}

}  // namespace

TEST_CASE("nccl: the layered algorithms are never candidates of auto but can be asked for by name") {
  for (CollOp op : {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter}) {
    const auto algos = algorithmsFor(op);
    CHECK(std::none_of(algos.begin(), algos.end(), [](Algorithm a) { return isLayered(a); }));
    CHECK(requireAlgorithm(op, "nccl-ring") == Algorithm::NcclRing);
  }
  CHECK(requireAlgorithm(CollOp::AllReduce, "nccl-tree") == Algorithm::NcclTree);
  expectError([] { (void)requireAlgorithm(CollOp::AllGather, "nccl-tree"); }, ErrorCode::NotFound, "nccl-tree");
  CHECK(layeredAlgorithmsFor(CollOp::AllToAll) == std::vector<Algorithm>{Algorithm::NcclP2p});
}

TEST_CASE("nccl: the ring's closed form is its timeline under the layered profile, every protocol") {
  const Profile p = testProfile();
  const Topology topo = topologyPreset("dgx-h100", 1);
  for (CollOp op : {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter})
    for (Protocol proto : {Protocol::Simple, Protocol::LL, Protocol::LL128})
      for (uint32_t ranks : {2u, 4u}) {
        CAPTURE(toString(op));
        CAPTURE(toString(proto));
        CAPTURE(ranks);
        const CollectiveSpec spec = specOf(op, Algorithm::NcclRing, 1 << 16);
        GenOptions g;
        g.chunks = 2;
        g.protocol = proto;
        const Schedule s = generate(spec, topo.layout(ranks), g);
        validate(s);
        const double timeline = simulateUncontended(s, layeredProfile(p, proto)).totalUs;
        CHECK(closedForm(spec, g, topo, ranks, p).totalUs == doctest::Approx(timeline).epsilon(1e-9));
        // The protocol bits are on every put, and only there.
        for (const auto& lanes : s.lanes)
          for (const auto& lane : lanes)
            for (const Step& st : lane.steps)
              CHECK((st.flags & kStepProtocolBits) ==
                    ((st.kind == StepKind::Put || st.kind == StepKind::ProxyPut) ? protocolFlags(proto) : 0));
      }
}

TEST_CASE("nccl: LL is cheaper than Simple for small ops and dearer for large ones (50 % payload)") {
  const Profile p = testProfile();
  const Topology topo = topologyPreset("dgx-h100", 1);
  auto cost = [&](Protocol proto, uint64_t count) {
    GenOptions g;
    g.protocol = proto;
    return closedForm(specOf(CollOp::AllReduce, Algorithm::NcclRing, count), g, topo, 8, p).totalUs;
  };
  CHECK(cost(Protocol::LL, 64) < cost(Protocol::Simple, 64));
  CHECK(cost(Protocol::LL, uint64_t{1} << 26) > cost(Protocol::Simple, uint64_t{1} << 26));
  const LayeredChoice small = chooseLayered(CollOp::AllReduce, 64, DType::Float32, topo, 8, p);
  CHECK(small.gen.protocol == Protocol::LL);
  const LayeredChoice large = chooseLayered(CollOp::AllReduce, uint64_t{1} << 26, DType::Float32, topo, 8, p);
  CHECK(large.gen.protocol != Protocol::LL);
}

TEST_CASE("nccl: the tree all-reduce validates on many layouts and its closed form tracks its timeline") {
  const Profile p = testProfile();
  const Topology topo = topologyPreset("dgx-h100", 8);
  for (uint32_t ranks : {2u, 5u, 8u, 16u, 24u, 40u}) {
    for (uint32_t channels : {1u, 2u}) {
      CAPTURE(ranks);
      CAPTURE(channels);
      const CollectiveSpec spec = specOf(CollOp::AllReduce, Algorithm::NcclTree, 4096);
      GenOptions g;
      g.chunks = 4;
      g.channels = channels;
      g.protocol = Protocol::LL128;
      const Schedule s = generate(spec, topo.layout(ranks), g);
      validate(s);
      const double timeline = simulateUncontended(s, layeredProfile(p, Protocol::LL128)).totalUs;
      const double closed = closedForm(spec, g, topo, ranks, p).totalUs;
      CHECK(closed > 0.5 * timeline);
      CHECK(closed < 1.5 * timeline);
    }
  }
}

TEST_CASE("nccl: a protocol bit is valid on put and proxyput only, and survives JSON and the packed form") {
  const Topology topo = topologyPreset("dgx-h100", 2);
  GenOptions g;
  g.protocol = Protocol::LL;
  Schedule s = generate(specOf(CollOp::AllReduce, Algorithm::NcclRing, 256), topo.layout(16), g);
  const Schedule back = scheduleFromJson(scheduleToJson(s));
  const Schedule unpacked = unpack(pack(s));
  auto flagsOf = [](const Schedule& x) {
    std::vector<uint8_t> f;
    for (const auto& lanes : x.lanes)
      for (const auto& lane : lanes)
        for (const Step& st : lane.steps) f.push_back(st.flags);
    return f;
  };
  CHECK(flagsOf(back) == flagsOf(s));
  CHECK(flagsOf(unpacked) == flagsOf(s));
  // On another kind, or both bits: rejected.
  Schedule bad = s;
  for (auto& lane : bad.lanes[0])
    for (Step& st : lane.steps)
      if (st.kind == StepKind::Wait) {
        st.flags |= kStepLL;
        break;
      }
  expectError([&] { validate(bad); }, ErrorCode::InvalidSchedule, "put and proxyput");
  CHECK(protocolFlagProblem(StepKind::Put, kStepLL | kStepLL128) != nullptr);
  CHECK(protocolFlagProblem(StepKind::ProxyPut, kStepLL128) == nullptr);
}

TEST_CASE("nccl: an LL put costs its latency and its bytes at half the link rate") {
  Profile p = testProfile();
  const StepPrice plain = stepPrice(p, StepKind::Put, LinkClass::NVLink, 1e6, false);
  const StepPrice ll = stepPrice(p, StepKind::Put, LinkClass::NVLink, 1e6, false, kStepLL);
  CHECK(ll.alphaUs == doctest::Approx(p.ll.latencyUs));
  CHECK(ll.rate == doctest::Approx(plain.rate * 0.5));
  const StepPrice proxy = stepPrice(p, StepKind::ProxyPut, LinkClass::Network, 1e6, false, kStepLL128);
  CHECK(proxy.alphaUs == doctest::Approx(proxyIssueUs(p)));  // the issue; the latency overlaps (proxyLaneUs)
  CHECK(proxy.rate == doctest::Approx(p.network.bwGBs * 120.0 / 128.0));
  // The host's launches set the pace of back-to-back layered ops when they are the slower side.
  p.nccl.groupGpuUs = 2.5;
  CHECK(layeredOpUs(3.0, p, 2) == doctest::Approx(2 * (p.nccl.hostOpUs + 2.5)));
  CHECK(layeredOpUs(100.0, p, 2) == doctest::Approx(100.0));
}

TEST_CASE("nccl: the profile's protocol and layered fields round-trip and reject bad values") {
  Profile p = testProfile();
  p.ll.latencyUs = 0.8;
  p.nccl.hostOpUs = 6.5;
  p.nccl.groupGpuUs = 1.25;
  const Profile back = profileFromJson(profileToJson(p));
  CHECK(back.ll.latencyUs == doctest::Approx(0.8));
  CHECK(back.nccl.hostOpUs == doctest::Approx(6.5));
  CHECK(back.nccl.groupGpuUs == doctest::Approx(1.25));
  // A profile written before the split names NCCL's host path launchUs: it reads as hostOpUs; both are refused.
  std::string old = profileToJson(p);
  const auto key = old.find("\"hostOpUs\"");
  REQUIRE(key != std::string::npos);
  old.replace(key, 10, "\"launchUs\"");
  CHECK(profileFromJson(old).nccl.hostOpUs == doctest::Approx(6.5));
  std::string both = profileToJson(p);
  both.replace(both.find("\"groupGpuUs\""), 12, "\"launchUs\"");
  expectError([&] { (void)profileFromJson(both); }, ErrorCode::InvalidArgument, "nccl.launchUs");
  CHECK(back.ll128.bwFraction == doctest::Approx(120.0 / 128.0));
  std::string text = profileToJson(p);
  const auto at = text.find("\"bwFraction\": 0.5");
  REQUIRE(at != std::string::npos);
  text.replace(at, 17, "\"bwFraction\": 1.5");
  expectError([&] { (void)profileFromJson(text); }, ErrorCode::InvalidArgument, "protocols.ll.bwFraction");
}

TEST_CASE("nccl: on one node a ring block moves in NCCL's 512 KiB steps per channel, at most the engine's chunks") {
  const Topology topo = topologyPreset("h200x2", 1);
  const NcclGraph graph = ncclTopoGraph(topo.node, 1);
  constexpr uint64_t MiB = uint64_t{1} << 20;
  for (const uint64_t bytes : {MiB, 4 * MiB, 16 * MiB, 512 * MiB}) {
    const GenOptions engine = layeredGenOptions(CollOp::AllReduce, Algorithm::NcclRing, Protocol::Simple, bytes, 2);
    const GenOptions g = layeredGenOptions(CollOp::AllReduce, Algorithm::NcclRing, Protocol::Simple, bytes, 2, topo);
    const uint64_t perChannel = bytes / (2 * ncclOpChannels(graph, Protocol::Simple, bytes, 2));
    const uint64_t steps = std::max<uint64_t>(1, (perChannel + 512 * 1024 - 1) / (512 * 1024));
    CHECK(g.chunks == std::min<uint64_t>(steps, engine.chunks));
    CHECK(g.channels == engine.channels);
  }
  // 4 MiB on two GPUs: one NCCL step per channel where the engine's rule pipelines 4 chunks.
  CHECK(layeredGenOptions(CollOp::AllReduce, Algorithm::NcclRing, Protocol::Simple, 4 * MiB, 2, topo).chunks <
        layeredGenOptions(CollOp::AllReduce, Algorithm::NcclRing, Protocol::Simple, 4 * MiB, 2).chunks);
}
