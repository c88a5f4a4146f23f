// Bandwidth sharing: flows that meet on a link share it fairly (CM02 on zero-latency links, latency paid
// explicitly), oversubscription slows cross-leaf traffic, and contention can only slow a schedule down.
#include <doctest/doctest.h>

#include <simgrid/s4u.hpp>

#include <string>

#include "mk/algorithms/algorithms.hpp"
#include "mk/sim/platform.hpp"
#include "mk/sim/replay.hpp"
#include "sim_test_util.hpp"

namespace sg4 = simgrid::s4u;
using simtest::Builder;

TEST_CASE("sharing: two flows into one nic get equal shares") {
  // Ranks 1 and 2 (nodes 1, 2) write 1 MB each into rank 0 (node 0) at the same time: its NIC's 50 GB/s is
  // split 25/25, so each keeps its lane 1e6 / 25e3 = 40 us after 3 + 1.5 us of dispatch and proxy.
  Builder b({0, 1, 2});
  b.proxyPut(1, 0, 0, 1000000);
  b.proxyPut(2, 0, 0, 1000000);
  const auto p = simtest::run(b.done(), simtest::cluster(3, 1));
  CHECK(simtest::at(p, 1, 0, 0).endUs == doctest::Approx(44.5).epsilon(1e-9));
  CHECK(simtest::at(p, 2, 0, 0).endUs == doctest::Approx(44.5).epsilon(1e-9));
}

TEST_CASE("sharing: flows with different route latencies still share equally") {
  // Rank 2 is under another leaf: two more switch hops, 1 us more latency, which delays only the landing of
  // its put (cost-model.md, rule 3 "ProxyPut"): both flows start at 4.5 and share rank 0's NIC 25/25, ending
  // at 4.5 + 1e6 / 25e3 = 44.5; rank 2's lands 1 us after rank 1's. With latency on the links CM02 would give
  // the short route about 7/13 of the link instead of 1/2.
  Builder b({0, 1, 2});
  b.proxyPut(1, 0, 0, 1000000, 0);
  b.proxyPut(2, 0, 0, 1000000, 1);
  b.wait(0, 0, 0, 1);
  b.wait(0, 0, 1, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(3, 1, /*perLeaf=*/2));
  CHECK(simtest::at(p, 1, 0, 0).endUs == doctest::Approx(44.5).epsilon(1e-9));
  CHECK(simtest::at(p, 2, 0, 0).endUs == doctest::Approx(44.5).epsilon(1e-9));
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(44.5 + 2).epsilon(1e-9));
  CHECK(simtest::at(p, 0, 0, 1).endUs == doctest::Approx(44.5 + 2 + 1).epsilon(1e-9));
}

TEST_CASE("sharing: cm02 with link latency would weight shares by route latency") {
  // Why every platform link has zero latency: the same two flows on raw SimGrid links with 1 us and 10 us
  // of route latency do not share equally.
  const std::string out = mk::sim::runIsolated([] {
    auto* e = new sg4::Engine("latency-weighting");
    mk::sim::configureEngine(mk::sim::EngineConfig{});
    auto* zone = sg4::create_full_zone("z");
    sg4::Host* a = zone->create_host("a", 1e9)->seal();
    sg4::Host* b = zone->create_host("b", 1e9)->seal();
    sg4::Host* c = zone->create_host("c", 1e9)->seal();
    sg4::Link* shared = zone->create_link("shared", 50e9)->seal();
    sg4::Link* shortHop = zone->create_link("short", 1e12)->set_latency(1e-6)->seal();
    sg4::Link* longHop = zone->create_link("long", 1e12)->set_latency(10e-6)->seal();
    zone->add_route(a->get_netpoint(), c->get_netpoint(), nullptr, nullptr,
                    {sg4::LinkInRoute(shortHop), sg4::LinkInRoute(shared)}, true);
    zone->add_route(b->get_netpoint(), c->get_netpoint(), nullptr, nullptr,
                    {sg4::LinkInRoute(longHop), sg4::LinkInRoute(shared)}, true);
    zone->seal();
    double endA = 0, endB = 0;
    sg4::Actor::create("a", a, [&] {
      sg4::Comm::sendto(a, c, 1e6);
      endA = sg4::Engine::get_clock();
    });
    sg4::Actor::create("b", b, [&] {
      sg4::Comm::sendto(b, c, 1e6);
      endB = sg4::Engine::get_clock();
    });
    e->run();
    return std::to_string(endA * 1e6) + " " + std::to_string(endB * 1e6);
  });
  double endA = 0, endB = 0;
  std::sscanf(out.c_str(), "%lf %lf", &endA, &endB);
  // Fair sharing would end both near 40 us; RTT weighting lets the 1 us route finish far earlier.
  CHECK(endA < 30.0);
  CHECK(endB > 39.0);
}

TEST_CASE("sharing: two puts into one gpu split its nvlink down link") {
  Builder b({0, 0, 0});
  b.put(1, 0, 0, 1000000);
  b.put(2, 0, 0, 1000000);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 3));
  CHECK(p.totalUs == doctest::Approx(3.0 + 1.0 + 1e6 / 50e3).epsilon(1e-9));
}

TEST_CASE("sharing: puts to different gpus do not contend behind an nvswitch") {
  Builder b({0, 0, 0, 0});
  b.put(0, 0, 1, 1000000);
  b.put(2, 0, 3, 1000000);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 4));
  CHECK(p.totalUs == doctest::Approx(14.0).epsilon(1e-9));
}

TEST_CASE("sharing: an oversubscribed leaf uplink slows cross leaf traffic") {
  // Nodes 0 and 1 (leaf 0) each send 1 MB to nodes 2 and 3 (leaf 1). The rail leaf's uplink carries
  // 2 x 50 / oversubscription GB/s: at 1:1 each flow keeps 50 GB/s, at 4:1 the two share 25 GB/s.
  auto schedule = [] {
    Builder b({0, 1, 2, 3});
    b.proxyPut(0, 0, 2, 1000000);
    b.proxyPut(1, 0, 3, 1000000);
    return b.done();
  };
  const auto fast = simtest::run(schedule(), simtest::cluster(4, 1, 2, 1.0));
  const auto slow = simtest::run(schedule(), simtest::cluster(4, 1, 2, 4.0));
  CHECK(fast.totalUs == doctest::Approx(3.0 + 1.5 + 20.0).epsilon(1e-9));  // dispatch, proxy, bytes
  CHECK(slow.totalUs == doctest::Approx(3.0 + 1.5 + 80.0).epsilon(1e-9));
  REQUIRE(!slow.links.empty());
  CHECK(slow.links[0].name == "rail0.leaf0.up_UP");
  CHECK(slow.links[0].utilization > 0.9);
}

TEST_CASE("sharing: contention never makes a step faster than the uncontended timeline") {
  // All-to-all over the network: every NIC receives from several senders at once.
  Builder b({0, 0, 1, 1, 2, 2});
  for (uint32_t r = 0; r < 6; ++r)
    for (uint32_t d = 0; d < 6; ++d)
      if (r / 2 != d / 2) b.proxyPut(r, 0, d, 200000 + 4 * (r * 6 + d));
  const mk::Schedule s = b.done();
  const auto p = simtest::run(s, simtest::cluster(3, 2));
  const mk::Timeline tl = mk::simulateUncontended(s, simtest::profile());
  REQUIRE(p.steps.size() == tl.steps.size());
  for (std::size_t i = 0; i < tl.steps.size(); ++i) CHECK(p.steps[i].endUs >= tl.steps[i].endUs * (1 - 1e-12));
  CHECK(p.totalUs > tl.totalUs * 1.2);
}

TEST_CASE("sharing: fast mode keeps network contention and times node local steps exactly") {
  Builder b({0, 0, 1, 2});
  b.put(0, 0, 1, 1000000, 0);
  b.wait(1, 0, 0, 1);
  b.proxyPut(1, 0, 2, 1000000);  // 14 .. 14 + 3.5 + 40 (shares the NIC of node 1 with rank 3's flow)
  b.proxyPut(3, 0, 2, 1000000);  // 3 .. 6.5 alone, then shared
  const mk::Schedule s = b.done();
  mk::sim::SimOptions exact, fast;
  fast.fast = true;
  const auto t = simtest::cluster(3, 2);
  const auto pe = mk::sim::predict(s, t, simtest::profile(), exact);
  const auto pf = mk::sim::predict(s, t, simtest::profile(), fast);
  CHECK(pf.totalUs == doctest::Approx(pe.totalUs).epsilon(1e-9));
  REQUIRE(pf.steps.size() == pe.steps.size());
  for (std::size_t i = 0; i < pe.steps.size(); ++i) {
    CHECK(pf.steps[i].startUs == doctest::Approx(pe.steps[i].startUs).epsilon(1e-9));
    CHECK(pf.steps[i].endUs == doctest::Approx(pe.steps[i].endUs).epsilon(1e-9));
  }
  CHECK(pf.stats.comms == 2);  // only the network flows went through SimGrid
}

TEST_CASE("sharing: a direct exchange across nodes staggers its senders, so no NIC takes them all at once") {
  // 2 DGX-style nodes of 8: with one global ring order every rank of a node sent to the same remote rank first and
  // that rank's NIC took 8 flows at once (about 7x the closed form); with directSendOrder each remote GPU takes one.
  const mk::Topology topo = mk::topologyPreset("dgx-h100", 2);
  const mk::Profile prof = mk::defaultProfile(topo);
  for (const mk::CollOp op : {mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::AllToAll}) {
    mk::CollectiveSpec spec;
    spec.op = op;
    spec.algo = mk::Algorithm::Direct;
    spec.dtype = mk::DType::BFloat16;
    spec.count = uint64_t{1} << 22;  // 8 MiB per rank block
    mk::GenOptions opt;
    opt.chunks = 1;
    opt.channels = 1;
    const mk::Schedule s = mk::generate(spec, topo.layout(16), opt);
    const double closed = mk::closedForm(spec, opt, topo, 16, prof).totalUs;
    const double sim = mk::sim::predict(s, topo, prof, {}).totalUs;
    INFO(std::string(mk::toString(op)) << ": simulated " << sim << " us, closed form " << closed << " us");
    CHECK(sim < 1.1 * closed);
  }
}
