// NCCL's channels across nodes: its ring graph, its channel count per op, its tuning model, and the rail rings
// of nccl-ring that spread the channels over the NICs (docs/algorithms-nccl.md, "Channels across nodes").
#include <doctest/doctest.h>

#include <set>
#include <vector>

#include "expect_error.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/nccl_topo.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/exec/verify.hpp"
#include "mk/schedule/validate.hpp"
#include "mk/topology/topology.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

CollectiveSpec specOf(CollOp op, uint64_t count) {
  CollectiveSpec s;
  s.op = op;
  s.algo = Algorithm::NcclRing;
  s.count = count;
  return s;
}

/// Local GPUs of node 0 whose ProxyPuts leave the node, over all lanes of `s`.
std::set<uint32_t> leavingGpus(const Schedule& s, uint32_t gpusPerNode) {
  std::set<uint32_t> out;
  for (uint32_t r = 0; r < gpusPerNode; ++r)
    for (const auto& lane : s.lanes[r])
      for (const Step& st : lane.steps)
        if (st.kind == StepKind::ProxyPut) out.insert(r);
  return out;
}

}  // namespace

TEST_CASE("nccl topo: a DGX H100 across nodes gets one 48 GB/s ring per NIC and 16 channels") {
  const NcclGraph g = ncclTopoGraph(topologyPreset("dgx-h100", 16).node, 16);
  CHECK(g.rings == 8);  // one per 400 Gb/s NIC; 48 < 50 with more than 4 rings on sm90: not duplicated
  CHECK(g.bwInterGBs == 48.0);
  CHECK(g.channels == 16);  // ncclTopoPostset doubles them
  CHECK(g.railRings == 8);
  // A100 with 200 Gb/s NICs: 24 GB/s rings, below 25: not duplicated, and no sm90 doubling.
  const NcclGraph a = ncclTopoGraph(topologyPreset("a100-8x200", 4).node, 4);
  CHECK(a.compCapIndex == 1);
  CHECK(a.bwInterGBs == 24.0);
  CHECK(a.channels == 2 * a.rings);
  expectError([] { (void)ncclTopoGraph(topologyPreset("dgx-h100", 1).node, 0); }, ErrorCode::InvalidArgument, "nNodes");
}

TEST_CASE("nccl topo: an op runs on fewer channels below channels x threads x threshold bytes") {
  const NcclGraph g = ncclTopoGraph(topologyPreset("dgx-h100", 2).node, 2);
  CHECK(ncclOpChannels(g, Protocol::Simple, 1ull << 30, 16) == g.channels);
  CHECK(ncclOpChannels(g, Protocol::Simple, 64 * 1024, 16) == 2);  // 64 KiB / (512 threads x 64 B)
  CHECK(ncclOpChannels(g, Protocol::Simple, 1024, 16) == 1);
  CHECK(ncclOpChannels(g, Protocol::LL128, 64 * 1024, 16) == 12);  // 64 KiB / (640 x 8 B) = 12.8
  CHECK(ncclOpChannels(g, Protocol::LL, 64 * 1024, 16) == 1);      // LL: 512 x 8 B x nRanks per channel
}

TEST_CASE("nccl tuning: the ring's time is tuning.cc's latency plus bytes over its bus bandwidth") {
  const NcclGraph g = ncclTopoGraph(topologyPreset("dgx-h100", 16).node, 16);
  const uint64_t bytes = 1ull << 30;
  const uint32_t n = 128, nodes = 16;
  // LL128 ring: bus bandwidth min(8 x 48 x 0.92, 8 x 36.7), algorithm bandwidth x n / (2(n-1)); latency: base
  // 14, then max(1.9 NVLink, 1 net overhead) per intra-node step and 4.0 per inter-node step.
  const double bw = std::min(8 * 48 * .92, 8 * 36.7) * n / (2.0 * (n - 1));
  const double lat = 14.0 + (2.0 * (n - 1) - 2.0 * (nodes - 1)) * 1.9 + 2.0 * (nodes - 1) * 4.0;
  CHECK(ncclAlgoTimeUs(g, CollOp::AllReduce, Algorithm::NcclRing, Protocol::LL128, bytes, n) ==
        doctest::Approx(lat + bytes / (1000 * bw)));
  // LL128 is capped at 8 x 36.7 GB/s (perChMaxRingLL128Bws): at 1 GiB NCCL's tuner picks the Simple ring.
  const NcclTuning t = ncclTune(g, CollOp::AllReduce, bytes, n);
  CHECK(t.algo == Algorithm::NcclRing);
  CHECK(t.proto == Protocol::Simple);
  CHECK(t.channels == 16);
  // Small all-reduces go to LL; the tree is an all-reduce only.
  CHECK(ncclTune(g, CollOp::AllReduce, 4096, n).proto == Protocol::LL);
  CHECK(ncclAlgoTimeUs(g, CollOp::AllGather, Algorithm::NcclTree, Protocol::Simple, bytes, n) < 0);
  expectError([&] { (void)ncclTune(g, CollOp::AllToAll, bytes, n); }, ErrorCode::NotFound, "p2p");
}

TEST_CASE("nccl-ring: rail rings leave every node by a GPU per channel and stay correct on the CPU executor") {
  const std::vector<uint32_t> nodeOf = {0, 0, 0, 0, 1, 1, 1, 1, 2, 2, 2, 2};
  for (CollOp op : {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter}) {
    CAPTURE(toString(op));
    const CollectiveSpec spec = specOf(op, 1021);
    GenOptions g;
    g.chunks = 2;
    g.channels = 4;
    g.protocol = Protocol::LL128;
    const Schedule s = generate(spec, nodeOf, g);
    REQUIRE(validateAll(s).empty());
    // The rank-order ring leaves node 0 by its last GPU only; four rail rings by all four.
    CHECK(leavingGpus(s, 4).size() == 4);
    const VerifyResult v = verifyCollective(s, spec, 7, InputKind::Uniform);
    CHECK_MESSAGE(v.ok, v.detail);
  }
}

TEST_CASE("nccl-ring: with rail rings the closed form is still its timeline") {
  Profile p = defaultProfile(topologyPreset("dgx-h100", 2));
  const Topology topo = topologyPreset("dgx-h100", 2);
  for (CollOp op : {CollOp::AllReduce, CollOp::AllGather, CollOp::ReduceScatter})
    for (uint32_t channels : {3u, 8u, 16u}) {
      CAPTURE(toString(op));
      CAPTURE(channels);
      const CollectiveSpec spec = specOf(op, 1 << 16);
      GenOptions g;
      g.chunks = 2;
      g.channels = channels;
      g.protocol = Protocol::Simple;
      const Schedule s = generate(spec, topo.layout(16), g);
      const double timeline = simulateUncontended(s, layeredProfile(p, Protocol::Simple)).totalUs;
      const double closed = closedForm(spec, g, topo, 16, p).totalUs;
      if (channels % 8 == 0) {  // every GPU leaves its node in as many channels: exact
        CHECK(closed == doctest::Approx(timeline).epsilon(1e-9));
      } else {  // priced as the GPU with the most network and NVLink lanes: a bound, close
        CHECK(closed >= timeline * (1 - 1e-12));
        CHECK(closed <= timeline * 1.01);
      }
    }
}

TEST_CASE("nccl-ring: 1 GiB all-reduce on 16 x dgx-h100 reaches the NIC bound and NCCL's own prediction") {
  const Topology topo = topologyPreset("dgx-h100", 16);
  const Profile p = defaultProfile(topo);
  const uint32_t n = 128;
  const uint64_t bytes = 1ull << 30;
  const LayeredChoice c = layeredCandidates(CollOp::AllReduce, bytes / 4, DType::Float32, topo, n, p).front();
  CHECK(c.algo == Algorithm::NcclRing);
  CHECK(c.gen.channels == 8);  // one schedule channel per rail ring
  const double busBw = bytes / (c.closedFormUs * 1e3) * 2.0 * (n - 1) / n;
  const double nicBound = 8 * topo.node.nic.bwGBs;
  CHECK(busBw >= 0.85 * nicBound);
  // NCCL's tuner adds its per-step hardware latencies without pipelining (x 1.4, "plateau effect of ring"): it
  // predicts 295 GB/s here, below 85 % of the NIC bound, so the model is faster than it, but not by more than 20 %.
  const double nccl = ncclTune(ncclTopoGraph(topo.node, 16), CollOp::AllReduce, bytes, n).timeUs;
  CHECK(c.closedFormUs <= nccl);
  CHECK(c.closedFormUs >= 0.8 * nccl);
}

TEST_CASE("nccl-p2p: all-to-all and broadcast as NCCL's sends, correct, flagged, closed form = timeline") {
  const Topology topo = topologyPreset("dgx-h100", 2);
  const Profile p = defaultProfile(topo);
  for (CollOp op : {CollOp::AllToAll, CollOp::Broadcast})
    for (Protocol proto : {Protocol::LL, Protocol::Simple}) {
      CAPTURE(toString(op));
      CAPTURE(toString(proto));
      CollectiveSpec spec = specOf(op, 1 << 12);
      spec.algo = Algorithm::NcclP2p;
      GenOptions g;
      g.protocol = proto;
      const Schedule s = generate(spec, topo.layout(16), g);
      REQUIRE(validateAll(s).empty());
      const VerifyResult v = verifyCollective(s, spec, 11, InputKind::Uniform);
      CHECK_MESSAGE(v.ok, v.detail);
      for (const auto& lanes : s.lanes)
        for (const auto& lane : lanes)
          for (const Step& st : lane.steps)
            if (st.kind == StepKind::Put || st.kind == StepKind::ProxyPut)
              CHECK((st.flags & kStepProtocolBits) == protocolFlags(proto));
      const double timeline = simulateUncontended(s, layeredProfile(p, proto)).totalUs;
      CHECK(closedForm(spec, g, topo, 16, p).totalUs == doctest::Approx(timeline).epsilon(1e-9));
    }
  CHECK(layeredAlgorithmsFor(CollOp::AllToAll) == std::vector<Algorithm>{Algorithm::NcclP2p});
  CHECK_FALSE(layeredRuns(Algorithm::NcclP2p, Protocol::LL128));
}

TEST_CASE("nccl: --algo nccl plans what NCCL's tuner picks, per size and op") {
  const Topology topo = topologyPreset("dgx-h100", 16);
  const Profile p = defaultProfile(topo);
  auto plan = [&](CollOp op, uint64_t bytes) {
    CollectiveSpec spec = specOf(op, countForBytes(op, bytes, DType::Float32, 128));
    return planNccl(spec, GenOptions{0, 0, InterPhase::Auto, Protocol::Auto}, topo, 128, p);
  };
  const CollectivePlan big = plan(CollOp::AllReduce, 1ull << 30);
  CHECK(big.spec.algo == Algorithm::NcclRing);
  CHECK(big.gen.protocol == Protocol::Simple);
  CHECK(big.gen.channels == 8);
  const CollectivePlan small = plan(CollOp::AllReduce, 4096);
  CHECK(small.gen.protocol == Protocol::LL);
  CHECK(small.gen.channels == 1);  // 4 KiB: one channel (enqueue.cc's threshold)
  // All-to-all (EP) and a send (PP, a broadcast of two ranks) go to NCCL's p2p: LL up to 16 KiB a peer.
  CHECK(plan(CollOp::AllToAll, 4096).spec.algo == Algorithm::NcclP2p);
  CHECK(plan(CollOp::AllToAll, 4096).gen.protocol == Protocol::LL);
  CHECK(plan(CollOp::AllToAll, 16 << 20).gen.protocol == Protocol::Simple);  // 128 KiB a peer
  // A protocol asked for is kept; NCCL's tuner then picks the algorithm among that protocol's.
  CollectiveSpec spec = specOf(CollOp::AllReduce, 1 << 20);
  CHECK(planNccl(spec, GenOptions{0, 0, InterPhase::Auto, Protocol::LL128}, topo, 128, p).gen.protocol ==
        Protocol::LL128);
}

TEST_CASE("nccl: --algo nccl parses for every op, and nccl-p2p refuses ll128") {
  CollectiveArgs a;
  a.op = "alltoall";
  a.algo = "nccl";
  const CollectiveRequest r = parseCollective(a);
  CHECK(r.ncclAuto);
  CHECK_FALSE(r.algo.has_value());
  a.algo = "nccl-p2p";
  a.protocol = "ll128";
  expectError([&] { (void)parseCollective(a); }, ErrorCode::InvalidArgument, "--protocol ll128");
  a.algo = "direct";
  a.protocol = "auto";
  CHECK_FALSE(parseCollective(a).ncclAuto);
}

TEST_CASE("nccl-tree: across nodes each channel pair is headed by a GPU of its own, correct, estimate tracks") {
  const Topology topo = topologyPreset("dgx-h100", 3);
  const Profile p = defaultProfile(topo);
  CollectiveSpec spec = specOf(CollOp::AllReduce, 1 << 14);
  spec.algo = Algorithm::NcclTree;
  GenOptions g;
  g.chunks = 2;
  g.channels = 8;
  g.protocol = Protocol::Simple;
  const Schedule s = generate(spec, topo.layout(24), g);
  REQUIRE(validateAll(s).empty());
  // Local GPU 0 heads every channel without spread heads; pairs 0..3 on GPUs 0..3 with them.
  CHECK(leavingGpus(s, 8) == std::set<uint32_t>{0, 1, 2, 3});
  const VerifyResult v = verifyCollective(s, spec, 5, InputKind::Uniform);
  CHECK_MESSAGE(v.ok, v.detail);
  const double timeline = simulateUncontended(s, layeredProfile(p, Protocol::Simple)).totalUs;
  const double closed = closedForm(spec, g, topo, 24, p).totalUs;
  CHECK(closed >= 0.5 * timeline);
  CHECK(closed <= 1.5 * timeline);
  // The tree gets NCCL's channels across nodes too: two per NIC at 1 GiB.
  CHECK(layeredGenOptions(CollOp::AllReduce, Algorithm::NcclTree, Protocol::Simple, 1ull << 30, 24, topo).channels ==
        16);
}
