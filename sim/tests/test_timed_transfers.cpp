// Exact mode times transfers (NVLink and network) at their caps and proves that no link was oversubscribed (the
// link ledger); when the proof fails it simulates them. Either way the answer must be SimGrid's: compared here
// with the replay that simulates every transfer (SimOptions::timeTransfers = false), step by step and link by
// link.
#include <doctest/doctest.h>

#include <cmath>
#include <string>
#include <vector>

#include "../src/link_ledger.hpp"
#include "mk/algorithms/algorithms.hpp"
#include "mk/sim/replay.hpp"
#include "sim_test_util.hpp"

using simtest::Builder;

namespace {

mk::sim::SimOptions simulatedTransfers() {
  mk::sim::SimOptions o;
  o.timeTransfers = false;
  return o;
}

/// SimGrid's own rounding: a comm at its cap ends within about a byte's time (4e-12 s at 225 GB/s) of bytes /
/// rate, and a chain of dependent comms adds those up (1.4e-4 us over the 35 us of a two-node hierarchical
/// all-reduce). 1e-5 of the op's time bounds that, and is 30 times finer than mk-sim's 4 printed digits.
constexpr double kSimGridRounding = 1e-5;

/// Same times for every step (up to SimGrid's rounding), same bytes and peak load on every link.
void checkSame(const mk::sim::Prediction& timed, const mk::sim::Prediction& simulated) {
  const double tolUs = kSimGridRounding * simulated.totalUs;
  CHECK(std::fabs(timed.totalUs - simulated.totalUs) <= tolUs);
  REQUIRE(timed.steps.size() == simulated.steps.size());
  for (std::size_t i = 0; i < timed.steps.size(); ++i) {
    CAPTURE(i);
    CHECK(std::fabs(timed.steps[i].startUs - simulated.steps[i].startUs) <= tolUs);
    CHECK(std::fabs(timed.steps[i].endUs - simulated.steps[i].endUs) <= tolUs);
  }
  REQUIRE(timed.links.size() == simulated.links.size());
  for (std::size_t i = 0; i < timed.links.size(); ++i) {
    CAPTURE(simulated.links[i].name);
    CHECK(timed.links[i].name == simulated.links[i].name);
    CHECK(timed.links[i].bytes == doctest::Approx(simulated.links[i].bytes).epsilon(1e-12));
    CHECK(timed.links[i].peakGBs == doctest::Approx(simulated.links[i].peakGBs).epsilon(1e-9));
  }
}

/// Every one of the `transfers` of `s` on `t` is timed in one pass without a SimGrid comm, as the replay that
/// simulates them (one comm each) times it.
void checkOneTimedPass(const mk::Schedule& s, const mk::Topology& t, uint64_t transfers, mk::sim::SimOptions opt = {}) {
  const auto timed = mk::sim::predict(s, t, simtest::profile(), opt);
  CHECK(timed.stats.passes == 1);
  CHECK(timed.stats.timedTransfers == transfers);
  CHECK(timed.stats.comms == 0);
  opt.timeTransfers = false;
  const auto simulated = mk::sim::predict(s, t, simtest::profile(), opt);
  CHECK(simulated.stats.timedTransfers == 0);
  CHECK(simulated.stats.comms == transfers);
  checkSame(timed, simulated);
}

}  // namespace

TEST_CASE("link ledger: transfers that fit every link pass, one that overfills a link fails") {
  mk::sim::detail::LinkLedger ledger({100.0, 100.0});
  CHECK(ledger.add({0, 1}, 0.0, 10.0, 60.0, 0.0));
  CHECK(ledger.add({1}, 10.0, 20.0, 60.0, 0.0));  // starts as the first ends: never both in flight
  CHECK(ledger.add({0}, 5.0, 8.0, 40.0, 0.0));    // 60 + 40: exactly full
  CHECK(ledger.peakBps(0) == doctest::Approx(100.0));
  CHECK(ledger.peakBps(1) == doctest::Approx(60.0));
  CHECK_FALSE(ledger.add({1}, 2.0, 12.0, 50.0, 0.0));  // 60 + 50 at t = 2, and 50 + 60 from t = 10
  CHECK(ledger.peakBps(1) == doctest::Approx(110.0));
}

TEST_CASE("link ledger: the peak inside a transfer's span is found where another one starts") {
  mk::sim::detail::LinkLedger ledger({100.0});
  CHECK(ledger.add({0}, 4.0, 6.0, 50.0, 0.0));
  CHECK_FALSE(ledger.add({0}, 0.0, 10.0, 60.0, 0.0));  // fine at its start, 110 from t = 4
  mk::sim::detail::LinkLedger pruned({100.0});
  CHECK(pruned.add({0}, 0.0, 1.0, 80.0, 0.0));
  CHECK(pruned.add({0}, 1.0, 2.0, 80.0, 1.0));  // the first ended by the engine's clock: forgotten
  CHECK(pruned.peakBps(0) == doctest::Approx(80.0));
}

TEST_CASE("timed transfers: transfers that never share a link are timed in one pass, without SimGrid comms") {
  Builder b({0, 0, 0, 0});
  b.put(0, 0, 1, 1000000);
  b.put(2, 0, 3, 1000000);
  checkOneTimedPass(b.done(), simtest::cluster(1, 4), 2);
}

TEST_CASE("timed transfers: network transfers that never share a link are timed too, in fast mode as well") {
  Builder b({0, 1, 2, 3});
  b.proxyPut(0, 0, 2, 1000000, 0);  // node 0 -> node 2 and node 1 -> node 3: separate NICs, one leaf
  b.proxyPut(1, 0, 3, 1000000, 0);
  b.wait(2, 0, 0, 1);
  b.wait(3, 0, 0, 1);
  const mk::Schedule s = b.done();
  checkOneTimedPass(s, simtest::cluster(4, 1), 2);
  mk::sim::SimOptions fast;
  fast.fast = true;
  checkOneTimedPass(s, simtest::cluster(4, 1), 2, fast);
}

TEST_CASE("timed transfers: two flows into one nic make a second, simulated pass") {
  Builder b({0, 1, 2});
  b.proxyPut(1, 0, 0, 1000000);  // both into node 0's NIC at the full 50 GB/s
  b.proxyPut(2, 0, 0, 1000000);
  const mk::Schedule s = b.done();
  const auto t = simtest::cluster(3, 1);
  const auto p = simtest::run(s, t);
  CHECK(p.stats.passes == 2);
  CHECK(p.stats.comms == 2);
  checkSame(p, mk::sim::predict(s, t, simtest::profile(), simulatedTransfers()));
}

TEST_CASE("timed transfers: an oversubscribed nvlink link sends the replay to a second, simulated pass") {
  Builder b({0, 0, 0});
  b.put(1, 0, 0, 1000000);  // both into GPU 0's down link at the full 100 GB/s
  b.put(2, 0, 0, 1000000);
  const mk::Schedule s = b.done();
  const auto t = simtest::cluster(1, 3);
  const auto p = simtest::run(s, t);
  CHECK(p.stats.passes == 2);
  CHECK(p.stats.oversubscribed);
  CHECK(p.stats.comms == 2);
  CHECK(p.totalUs == doctest::Approx(3.0 + 1.0 + 1e6 / 50e3).epsilon(1e-9));  // shared: 50 GB/s each
  checkSame(p, mk::sim::predict(s, t, simtest::profile(), simulatedTransfers()));
}

TEST_CASE("timed transfers: generators on DGX nodes give the simulated answer step by step") {
  struct Case {
    mk::CollOp op;
    const char* algo;
    uint32_t nodes;
  };
  const Case cases[] = {{mk::CollOp::AllReduce, "hierarchical", 2}, {mk::CollOp::AllReduce, "ring", 1},
                        {mk::CollOp::AllReduce, "two-shot", 1},     {mk::CollOp::AllReduce, "one-shot", 1},
                        {mk::CollOp::AllGather, "hierarchical", 2}, {mk::CollOp::ReduceScatter, "direct", 1},
                        {mk::CollOp::AllToAll, "direct", 2}};
  for (const Case& c : cases) {
    const std::string algo = c.algo;
    CAPTURE(algo);
    CAPTURE(c.nodes);
    const mk::Topology topo = mk::topologyPreset("dgx-h100", c.nodes);
    mk::CollectiveSpec spec;
    spec.op = c.op;
    spec.algo = mk::requireAlgorithm(c.op, c.algo);
    spec.dtype = mk::DType::BFloat16;
    spec.count = 262147;
    mk::GenOptions opt;
    opt.chunks = 2;
    const mk::Schedule s = mk::generate(spec, topo.layout(8 * c.nodes), opt);
    const mk::Profile prof = mk::defaultProfile(topo);
    const auto timed = mk::sim::predict(s, topo, prof);
    const auto simulated = mk::sim::predict(s, topo, prof, simulatedTransfers());
    CAPTURE(timed.stats.passes);
    checkSame(timed, simulated);
  }
}
