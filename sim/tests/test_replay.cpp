// Replay semantics: every step kind's duration, flags, barriers and shares against values worked out by hand
// from the timeline rules (docs/cost-model.md), plus the process model (fork per prediction).
#include <doctest/doctest.h>

#include <unistd.h>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <new>
#include <string>

#include "mk/cost/cost.hpp"
#include "mk/sim/output.hpp"
#include "mk/sim/replay.hpp"
#include "sim_test_util.hpp"

using simtest::Builder;
using simtest::near;

TEST_CASE("replay: a put costs dispatch plus nvlink alpha plus bytes over bandwidth") {
  Builder b({0, 0});
  b.put(0, 0, 1, 1000000);  // 3 + 1 + 1e6 B / 100 GB/s = 14 us
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(p.totalUs == doctest::Approx(14.0).epsilon(1e-9));
  CHECK(simtest::at(p, 0, 0, 0).startUs == doctest::Approx(3.0).epsilon(1e-9));
}

TEST_CASE("replay: puts, proxy puts, copies and reduces run at their ramp's rate for their size") {
  mk::Profile pf = simtest::profile();
  pf.nvlink.ramp = {{1e6, 0.25}};              // a 1 MB put reaches a quarter of 100 GB/s
  pf.network.ramp = {{1e5, 0.5}, {1e7, 1.0}};  // half way in log size at 1 MB: 0.75 of 50 GB/s
  pf.local.ramp = {{1e6, 2.0}};                // L2: twice the large-size copy rate
  pf.reduceRamp = {{1e6, 0.5}};
  Builder b({0, 0, 1});
  b.put(0, 0, 1, 1000000);       // 3 + 1 + 1e6 / 25e3 = 44
  b.proxyPut(0, 1, 2, 1000000);  // 3 + 1.5 + 1e6 / 37.5e3 = 31.1667 (the network alpha: its landing)
  b.copy(2, 0, 2, 2, 1000000);   // 3 + 0.5 + 1e6 / 2000e3 = 4
  b.reduce(2, 0, 2, 1000000);    // 4 + 0.5 + 1e6 / 250e3 = 8.5
  const auto p = simtest::run(b.done(), simtest::cluster(2, 2), pf);
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(44.0).epsilon(1e-9));
  CHECK(simtest::at(p, 0, 1, 0).endUs == doctest::Approx(3 + 1.5 + 1e6 / 37.5e3).epsilon(1e-9));
  CHECK(simtest::at(p, 2, 0, 0).endUs == doctest::Approx(4.0).epsilon(1e-9));
  CHECK(simtest::at(p, 2, 0, 1).endUs == doctest::Approx(8.5).epsilon(1e-9));
}

TEST_CASE("replay: a put with a signal releases the peer's wait at the put's end") {
  Builder b({0, 0});
  b.put(0, 0, 1, 1000000, 0);
  b.wait(1, 0, 0, 1);
  b.put(1, 0, 0, 1000000);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(simtest::at(p, 1, 0, 0).endUs == doctest::Approx(14.0).epsilon(1e-9));
  CHECK(p.totalUs == doctest::Approx(25.0).epsilon(1e-9));
}

TEST_CASE("replay: a signal between lanes of one GPU is visible after localFlagUs") {
  Builder b({0, 0});
  b.signalStep(0, 0, 0, 0);
  b.wait(0, 1, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(simtest::at(p, 0, 1, 0).endUs == doctest::Approx(3.125).epsilon(1e-9));  // dispatch + localFlagUs
}

TEST_CASE("replay: a signal is visible after flagUs on one node") {
  Builder b({0, 0});
  b.signalStep(0, 0, 1, 0);
  b.wait(1, 0, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(3.0).epsilon(1e-9));   // a signal takes no time on its lane
  CHECK(simtest::at(p, 1, 0, 0).endUs == doctest::Approx(3.25).epsilon(1e-9));  // dispatch + flagUs
  CHECK(p.totalUs == doctest::Approx(3.25).epsilon(1e-9));
}

TEST_CASE("replay: a signal across nodes is visible after proxy plus network alpha") {
  Builder b({0, 1});
  b.signalStep(0, 0, 1, 0);
  b.wait(1, 0, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(2, 1));
  CHECK(p.totalUs == doctest::Approx(3.0 + 1.5 + 2.0).epsilon(1e-9));
}

TEST_CASE("replay: a signal to a node under another leaf pays two more switch hops") {
  Builder b({0, 1});
  b.signalStep(0, 0, 1, 0);
  b.wait(1, 0, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(2, 1, /*perLeaf=*/1));
  CHECK(p.totalUs == doctest::Approx(3.0 + 1.5 + 2.0 + 2 * 0.5).epsilon(1e-9));
}

TEST_CASE("replay: a wait takes increments in visibility order not sending order") {
  // Rank 0 (node 0) signals first but across nodes (visible at 6.5); rank 2 (node 1) signals 1 us later on
  // the node (visible at 4.25). The first increment to become visible releases the threshold-1 wait.
  Builder b({0, 1, 1});
  b.signalStep(0, 0, 1, 0);
  b.copy(2, 0, 2, 2, 500000);  // 0.5 + 5e5 B / 1000 GB/s = 1 us
  b.signalStep(2, 0, 1, 0);
  b.wait(1, 0, 0, 1);
  b.wait(1, 1, 0, 2);
  const auto p = simtest::run(b.done(), simtest::cluster(2, 2));
  CHECK(simtest::at(p, 1, 0, 0).endUs == doctest::Approx(4.25).epsilon(1e-9));
  CHECK(simtest::at(p, 1, 1, 0).endUs == doctest::Approx(6.5).epsilon(1e-9));
}

TEST_CASE("replay: a signal to another rail crosses the spine and pays two more switch hops") {
  Builder x({0, 1, 1});
  x.signalStep(0, 0, 2, 0);  // rank 2 is GPU 1 of node 1: rail 1
  x.wait(2, 0, 0, 1);
  const auto p = simtest::run(x.done(), simtest::cluster(2, 2));
  CHECK(p.totalUs == doctest::Approx(3.0 + 1.5 + 2.0 + 1.0).epsilon(1e-9));
}

TEST_CASE("replay: a wait whose threshold is already reached ends at once") {
  Builder b({0, 0});
  b.signalStep(0, 0, 1, 0);
  b.put(1, 0, 0, 1000000);  // 3 .. 14: the signal became visible at 3.25
  b.wait(1, 0, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(simtest::at(p, 1, 0, 1).startUs == doctest::Approx(14.0).epsilon(1e-9));
  CHECK(simtest::at(p, 1, 0, 1).endUs == doctest::Approx(14.0).epsilon(1e-9));
}

TEST_CASE("replay: a barrier on one node releases everyone at the last arrival plus flagUs") {
  Builder b({0, 0});
  b.barrier(0, 0, 0);
  b.copy(1, 0, 1, 1, 500000);  // arrives at 4
  b.barrier(1, 0, 0);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(simtest::at(p, 0, 0, 0).startUs == doctest::Approx(3.0).epsilon(1e-9));
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(4.25).epsilon(1e-9));
  CHECK(simtest::at(p, 1, 0, 1).endUs == doctest::Approx(4.25).epsilon(1e-9));
}

TEST_CASE("replay: a barrier across nodes adds proxy plus network alpha") {
  Builder b({0, 1});
  b.barrier(0, 0, 1);
  b.copy(1, 0, 1, 1, 500000);
  b.barrier(1, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(2, 1));
  CHECK(p.totalUs == doctest::Approx(4.0 + 1.5 + 2.0).epsilon(1e-9));
}

TEST_CASE("replay: a proxy put keeps its lane for proxy and bytes, and lands the network alpha later") {
  Builder b({0, 1});
  b.proxyPut(0, 0, 1, 1000000, 0);  // lane: 3 + 1.5 + 1e6 / 50e3 = 24.5; lands 2 us later
  b.wait(1, 0, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(2, 1));
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(24.5).epsilon(1e-9));
  CHECK(simtest::at(p, 1, 0, 0).endUs == doctest::Approx(26.5).epsilon(1e-9));
}

TEST_CASE("replay: back-to-back proxy puts overlap the latency, as the timeline prices them") {
  // The second put starts when the first one's bytes are out (24.5), not when it has landed (26.5).
  Builder b({0, 1});
  b.proxyPut(0, 0, 1, 1000000, 0);
  b.proxyPut(0, 0, 1, 1000000, 0);
  b.wait(1, 0, 0, 2);
  const mk::Schedule s = b.done();
  const auto p = simtest::run(s, simtest::cluster(2, 1));
  CHECK(simtest::at(p, 0, 0, 1).startUs == doctest::Approx(24.5).epsilon(1e-9));
  CHECK(simtest::at(p, 1, 0, 0).endUs == doctest::Approx(24.5 + 21.5 + 2).epsilon(1e-9));
  CHECK(p.totalUs == doctest::Approx(mk::simulateUncontended(s, simtest::profile()).totalUs).epsilon(1e-9));
}

TEST_CASE("replay: a zero-byte proxy put is a remote signal costing proxy plus alpha") {
  Builder b({0, 1});
  b.proxyPut(0, 0, 1, 0, 0);
  b.wait(1, 0, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(2, 1));
  CHECK(p.totalUs == doctest::Approx(6.5).epsilon(1e-9));
  CHECK(p.stats.comms == 0);
}

TEST_CASE("replay: a proxy put to another leaf pays two more switch hops") {
  Builder b({0, 1});
  b.proxyPut(0, 0, 1, 1000000, 0);  // lands 24.5 + 2 + 2 x 0.5
  b.wait(1, 0, 0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(2, 1, /*perLeaf=*/1));
  CHECK(p.totalUs == doctest::Approx(27.5).epsilon(1e-9));
}

TEST_CASE("replay: local copy and reduce run at the memory and reduce rates") {
  Builder b({0});
  b.copy(0, 0, 0, 0, 1000000);  // 0.5 + 1e6 / 1000e3 = 1.5
  b.reduce(0, 0, 0, 1000000);   // 0.5 + 1e6 / 500e3 = 2.5
  const auto p = simtest::run(b.done(), simtest::cluster(1, 1));
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(4.5).epsilon(1e-9));
  CHECK(p.totalUs == doctest::Approx(7.0).epsilon(1e-9));
  CHECK(p.stats.execs == 2);
}

TEST_CASE("replay: a copy from a peer crosses nvlink at the nvlink rate") {
  Builder b({0, 0});
  b.copy(0, 0, 1, 0, 1000000);  // read from rank 1: 1 + 10
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(p.totalUs == doctest::Approx(14.0).epsilon(1e-9));
  REQUIRE(!p.links.empty());
  CHECK((p.links[0].name == "n0.nvl1_UP" || p.links[0].name == "n0.nvl0_DOWN"));
}

TEST_CASE("replay: a reduce reading a peer runs at the smaller of reduce and nvlink rates") {
  mk::Profile prof = simtest::profile();
  prof.reduceGBs = 60;  // slower than NVLink's 100
  Builder b({0, 0});
  b.reduce(0, 0, 1, 600000);  // 1 + 6e5 / 60e3 = 11
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2), prof);
  CHECK(p.totalUs == doctest::Approx(14.0).epsilon(1e-9));
}

TEST_CASE("replay: a gemm runs at the gemm rate divided by the lanes using the tensor pipe") {
  Builder b({0});
  b.gemm(0, 0, 1000, 1000, 1000);  // 2e9 flop at 100 TFLOP/s = 20 us, shared by two lanes: 40 us
  b.gemm(0, 1, 1000, 1000, 1000);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 1));
  CHECK(p.totalUs == doctest::Approx(43.0).epsilon(1e-9));
}

TEST_CASE("replay: memory and tensor pipes do not slow each other") {
  Builder b({0});
  b.gemm(0, 0, 1000, 1000, 1000);  // 20 us
  b.copy(0, 1, 0, 0, 19500000);    // 0.5 + 19.5 = 20 us
  const auto p = simtest::run(b.done(), simtest::cluster(1, 1));
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(23.0).epsilon(1e-9));
  CHECK(simtest::at(p, 0, 1, 0).endUs == doctest::Approx(23.0).epsilon(1e-9));
}

TEST_CASE("replay: a lane's share caps its rate even while the other lane is idle") {
  // Two lanes of rank 0 use NVLink, one after the other: each runs at 100/2 GB/s (timeline rule 2).
  Builder b({0, 0});
  b.put(0, 0, 1, 1000000);
  b.signalStep(0, 0, 0, 0);
  b.wait(0, 1, 0, 1);
  b.put(0, 1, 1, 1000000);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(simtest::at(p, 0, 0, 0).endUs == doctest::Approx(24.0).epsilon(1e-9));
  CHECK(p.totalUs == doctest::Approx(24.125 + 21.0).epsilon(1e-9));  // lane to lane: localFlagUs
}

TEST_CASE("replay: an empty schedule takes the dispatch time") {
  Builder b({0, 0});
  b.lanes(0, 1);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 2));
  CHECK(p.totalUs == doctest::Approx(3.0).epsilon(1e-9));
  Builder none({0});
  CHECK(simtest::run(none.done(), simtest::cluster(1, 1)).totalUs == doctest::Approx(3.0).epsilon(1e-9));
}

TEST_CASE("replay: hand schedules match the uncontended timeline exactly") {
  Builder b({0, 0, 1, 1});
  b.put(0, 0, 1, 123456, 0);
  b.wait(1, 0, 0, 1);
  b.reduce(1, 0, 0, 654320);
  b.proxyPut(1, 0, 3, 777776, 1);
  b.wait(3, 0, 1, 1);
  b.signalStep(3, 0, 2, 2, 3);
  b.wait(2, 1, 2, 3);
  b.copy(2, 1, 3, 2, 99996);
  b.barrier(0, 1, 0);
  b.barrier(1, 1, 0);
  b.barrier(2, 0, 0);
  b.barrier(3, 1, 0);
  b.gemm(2, 2, 128, 256, 512);
  const mk::Schedule s = b.done();
  const auto p = simtest::run(s, simtest::cluster(2, 2));
  const mk::Timeline tl = mk::simulateUncontended(s, simtest::profile());
  CHECK(p.totalUs == doctest::Approx(tl.totalUs).epsilon(1e-9));
  REQUIRE(p.steps.size() == tl.steps.size());
  for (std::size_t i = 0; i < tl.steps.size(); ++i) {
    CAPTURE(i);
    CHECK(p.steps[i].rank == tl.steps[i].rank);
    CHECK(p.steps[i].lane == tl.steps[i].lane);
    CHECK(p.steps[i].step == tl.steps[i].step);
    CHECK(p.steps[i].startUs == doctest::Approx(tl.steps[i].startUs).epsilon(1e-9));
    CHECK(p.steps[i].endUs == doctest::Approx(tl.steps[i].endUs).epsilon(1e-9));
  }
}

TEST_CASE("replay: trace records every step in rank lane step order") {
  Builder b({0, 0});
  b.put(0, 0, 1, 4096, 0);
  b.put(0, 1, 1, 4096, 1);
  b.wait(1, 0, 0, 1);
  b.wait(1, 0, 1, 1);
  const mk::Schedule s = b.done();
  const auto p = simtest::run(s, simtest::cluster(1, 2));
  REQUIRE(p.steps.size() == s.stepCount());
  for (std::size_t i = 1; i < p.steps.size(); ++i) {
    const auto& x = p.steps[i - 1];
    const auto& y = p.steps[i];
    CHECK((x.rank < y.rank || (x.rank == y.rank && (x.lane < y.lane || (x.lane == y.lane && x.step < y.step)))));
  }
  for (const auto& r : p.steps) {
    CHECK(r.startUs <= r.endUs);
    CHECK(r.bytes == s.lanes[r.rank][r.lane].steps[r.step].bytes);
    CHECK(r.kind == s.lanes[r.rank][r.lane].steps[r.step].kind);
  }
}

TEST_CASE("replay: link load counts the bytes each link carried") {
  Builder b({0, 0, 0});
  b.put(0, 0, 1, 1000000);
  b.put(2, 0, 1, 500000);
  const auto p = simtest::run(b.done(), simtest::cluster(1, 3));
  double up0 = -1, down1 = -1, up2 = -1;
  for (const auto& l : p.links) {
    if (l.name == "n0.nvl0_UP") up0 = l.bytes;
    if (l.name == "n0.nvl1_DOWN") down1 = l.bytes;
    if (l.name == "n0.nvl2_UP") up2 = l.bytes;
    CHECK(l.utilization <= 1.0 + 1e-9);
    CHECK(l.bandwidthGBs == doctest::Approx(100.0).epsilon(1e-9));
  }
  CHECK(up0 == doctest::Approx(1e6).epsilon(1e-9));
  CHECK(down1 == doctest::Approx(1.5e6).epsilon(1e-9));
  CHECK(up2 == doctest::Approx(5e5).epsilon(1e-9));
  REQUIRE(p.links.size() == 3);
  CHECK(p.links[0].name == "n0.nvl1_DOWN");  // busiest first
  CHECK(p.links[0].utilization >= p.links[1].utilization);
}

TEST_CASE("replay: the same schedule gives identical results twice") {
  Builder b({0, 0, 1, 1});
  for (uint32_t r = 0; r < 4; ++r) {
    const uint32_t peer = r ^ 1u, remote = r ^ 2u;
    b.put(r, 0, peer, 100000 + 4 * r, 0);
    b.proxyPut(r, 1, remote, 300000 + 8 * r, 1);
    b.wait(r, 2, 0, 1);
    b.wait(r, 2, 1, 1);
  }
  const mk::Schedule s = b.done();
  const auto t = simtest::cluster(2, 2);
  const auto p1 = simtest::run(s, t);
  const auto p2 = simtest::run(s, t);
  mk::sim::RunInfo info;
  info.op = "custom";
  CHECK(p1.totalUs == p2.totalUs);
  REQUIRE(p1.steps.size() == p2.steps.size());
  for (std::size_t i = 0; i < p1.steps.size(); ++i) {
    CHECK(p1.steps[i].startUs == p2.steps[i].startUs);
    CHECK(p1.steps[i].endUs == p2.steps[i].endUs);
  }
  mk::sim::Prediction q1 = p1, q2 = p2;
  q1.stats = q2.stats = mk::sim::SimStats{};  // wall time and memory legitimately differ
  CHECK(mk::sim::predictionToJson(q1, info) == mk::sim::predictionToJson(q2, info));
  CHECK(mk::sim::traceToJson(s, p1.steps) == mk::sim::traceToJson(s, p2.steps));
}

TEST_CASE("replay: many predictions run in one process") {
  const auto t = simtest::cluster(1, 2);
  for (uint32_t i = 1; i <= 6; ++i) {
    Builder b({0, 0});
    b.put(0, 0, 1, 100000 * i);
    CHECK(simtest::run(b.done(), t).totalUs == doctest::Approx(4.0 + i).epsilon(1e-9));
  }
}

TEST_CASE("replay: in-process mode runs once and then refuses") {
  // Inside a child of its own, so this test process never hosts a SimGrid engine.
  const std::string out = mk::sim::runIsolated([] {
    Builder b({0, 0});
    b.put(0, 0, 1, 1000000);
    const mk::Schedule s = b.done();
    mk::sim::SimOptions o;
    o.isolate = false;
    const double first = mk::sim::predict(s, simtest::cluster(1, 2), simtest::profile(), o).totalUs;
    try {
      mk::sim::predict(s, simtest::cluster(1, 2), simtest::profile(), o);
    } catch (const mk::Error& e) {
      return std::to_string(first) + "|" + mk::toString(e.code());
    }
    return std::string("second run accepted");
  });
  CHECK(out == std::to_string(14.0) + "|unsupported");
}

TEST_CASE("replay: errors in the simulating process keep their code and message") {
  const mk::Error e = simtest::errorOf(
      [] { mk::sim::runIsolated([]() -> std::string { throw mk::Error(mk::ErrorCode::NotFound, "no such thing"); }); });
  CHECK(e.code() == mk::ErrorCode::NotFound);
  CHECK(e.message() == "no such thing");
}

TEST_CASE("replay: running out of memory in the simulating process is std::bad_alloc in the caller") {
  // Not an internal error (exit 1): the tools turn std::bad_alloc into exit 5 with one line.
  CHECK_THROWS_AS(mk::sim::runIsolated([]() -> std::string { throw std::bad_alloc(); }), std::bad_alloc);
}

TEST_CASE("replay: a simulating process that dies is an internal error naming the signal") {
  const mk::Error e = simtest::errorOf([] {
    mk::sim::runIsolated([]() -> std::string {
      std::signal(SIGABRT, SIG_DFL);
      std::abort();
    });
  });
  CHECK(e.code() == mk::ErrorCode::Internal);
  CHECK(e.message().find("signal 6") != std::string::npos);
}

TEST_CASE("replay: progress is reported from long runs") {
  char path[] = "/tmp/mk-sim-progress-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  Builder b({0, 0});
  for (int i = 0; i < 50; ++i) b.put(0, 0, 1, 4096);
  mk::sim::SimOptions o;
  o.progressAfterS = 0;
  o.progressEveryS = 0;
  const std::string file = path;
  o.onProgress = [file](double fraction, double simUs, double) {
    std::FILE* f = std::fopen(file.c_str(), "a");
    std::fprintf(f, "%g %g\n", fraction, simUs);
    std::fclose(f);
  };
  mk::sim::predict(b.done(), simtest::cluster(1, 2), simtest::profile(), o);
  std::ifstream in(path);
  double fraction = -1, simUs = -1;
  in >> fraction >> simUs;
  std::remove(path);
  CHECK(fraction >= 0);
  CHECK(fraction <= 1);
  CHECK(simUs >= 0);
}

TEST_CASE("replay: a schedule with more ranks on a node than it has gpus is rejected") {
  Builder b({0, 0, 0});
  const mk::Error e = simtest::errorOf([&] { simtest::run(b.done(), simtest::cluster(1, 2)); });
  CHECK(e.code() == mk::ErrorCode::InvalidArgument);
  CHECK(e.message().find("node 0") != std::string::npos);
}

TEST_CASE("replay: a schedule on more nodes than the cluster has is rejected") {
  Builder b({0, 3});
  const mk::Error e = simtest::errorOf([&] { simtest::run(b.done(), simtest::cluster(2, 1)); });
  CHECK(e.code() == mk::ErrorCode::InvalidArgument);
  CHECK(e.message().find("rank 1 is on node 3") != std::string::npos);
}

TEST_CASE("replay: ranks of a node take its gpus in rank order") {
  mk::Schedule s;
  s.nRanks = 4;
  s.nodeOf = {1, 0, 1, 0};
  s.lanes.resize(4);
  const auto gpu = mk::sim::placeRanks(s, simtest::cluster(2, 2));
  CHECK(gpu == std::vector<uint32_t>{2, 0, 3, 1});
}

TEST_CASE("replay: a put across nodes is rejected as an invalid schedule") {
  Builder b({0, 1});
  b.put(0, 0, 1, 4096);
  const mk::Error e = simtest::errorOf([&] { simtest::run(b.done(), simtest::cluster(2, 1)); });
  CHECK(e.code() == mk::ErrorCode::InvalidSchedule);
  CHECK(e.message().find("rank 0 lane 0") != std::string::npos);
}

TEST_CASE("replay: a wait on a flag out of range is rejected before simulating") {
  Builder b({0});
  b.wait(0, 0, 9, 1);
  const mk::Error e = simtest::errorOf([&] { simtest::run(b.done(), simtest::cluster(1, 1)); });
  CHECK(e.code() == mk::ErrorCode::InvalidSchedule);
  CHECK(e.message().find("out of range") != std::string::npos);
}

TEST_CASE("replay: a profile without network bandwidth is rejected for proxy puts") {
  mk::Profile prof = simtest::profile();
  prof.network.bwGBs = 0;
  Builder b({0, 1});
  b.proxyPut(0, 0, 1, 4096);
  const mk::Error e = simtest::errorOf([&] { simtest::run(b.done(), simtest::cluster(2, 1), prof); });
  CHECK(e.code() == mk::ErrorCode::InvalidArgument);
  CHECK(e.message().find("network.bwGBs") != std::string::npos);
}

TEST_CASE("replay: a negative latency in the profile is rejected") {
  mk::Profile prof = simtest::profile();
  prof.flagUs = -1;
  Builder b({0});
  b.lanes(0, 1);
  const mk::Error e = simtest::errorOf([&] { simtest::run(b.done(), simtest::cluster(1, 1), prof); });
  CHECK(e.code() == mk::ErrorCode::InvalidArgument);
  CHECK(e.message().find("flagUs") != std::string::npos);
}

TEST_CASE("replay: a schedule that cannot complete is reported as a deadlock") {
  Builder b({0, 0});
  b.wait(0, 0, 0, 1);  // nobody signals: mk::validate would reject it, predict() must still not hang
  const mk::Error e = simtest::errorOf([&] { simtest::run(b.done(), simtest::cluster(1, 2)); });
  CHECK(e.code() == mk::ErrorCode::Deadlock);
}

TEST_CASE("replay: a put issue gap gives the timeline's times in both modes") {
  Builder b({0, 0});
  for (int i = 0; i < 4; ++i) b.put(0, 0, 1, 250000, 0);
  b.wait(1, 0, 0, 4);
  b.reduce(1, 0, 0, 65536);
  const mk::Schedule s = b.done();
  mk::Profile p = simtest::profile();
  p.putIssueUs = 0.35;
  const mk::Timeline tl = mk::simulateUncontended(s, p);
  for (const bool fast : {false, true}) {
    CAPTURE(fast);
    mk::sim::SimOptions o;
    o.fast = fast;
    const auto pr = mk::sim::predict(s, simtest::cluster(1, 2), p, o);
    CHECK(pr.totalUs == doctest::Approx(tl.totalUs).epsilon(1e-9));
  }
  CHECK(tl.totalUs < mk::simulateUncontended(s, simtest::profile()).totalUs);
}

TEST_CASE("replay: a met Wait keeps its lane waitUs as in the timeline in both modes") {
  // Rank 1 waits for rank 0's put after two puts of its own: met by then, so the wait costs exactly waitUs.
  Builder b({0, 0});
  b.put(0, 0, 1, 250000, 0);
  b.put(1, 0, 0, 250000);
  b.put(1, 0, 0, 250000);
  b.wait(1, 0, 0, 1);
  b.put(1, 0, 0, 250000);
  const mk::Schedule s = b.done();
  mk::Profile p = simtest::profile();
  const double before = mk::simulateUncontended(s, p).totalUs;
  p.waitUs = 0.6;
  const mk::Timeline tl = mk::simulateUncontended(s, p);
  CHECK(tl.totalUs == doctest::Approx(before + 0.6));
  for (const bool fast : {false, true}) {
    CAPTURE(fast);
    mk::sim::SimOptions o;
    o.fast = fast;
    CHECK(mk::sim::predict(s, simtest::cluster(1, 2), p, o).totalUs == doctest::Approx(tl.totalUs).epsilon(1e-9));
  }
}

TEST_CASE("replay: puts into a peer's user buffer pay userPutUs as in the timeline in both modes") {
  Builder b({0, 0});
  for (int i = 0; i < 3; ++i) b.put(0, 0, 1, 250000, 0);
  b.wait(1, 0, 0, 3);
  mk::Schedule scratch = b.done();
  mk::Schedule output = scratch;
  output.buffers[0].kind = mk::BufferKind::Output;  // the same puts, now into rank 1's output
  for (const double issue : {0.0, 0.35}) {
    mk::Profile p = simtest::profile();
    p.putIssueUs = issue;
    p.userPutUs = 0.8;
    CAPTURE(issue);
    const mk::Timeline ts = mk::simulateUncontended(scratch, p), to = mk::simulateUncontended(output, p);
    CHECK(to.totalUs > ts.totalUs + 0.7);  // at least the last put's extra latency
    for (const bool fast : {false, true}) {
      CAPTURE(fast);
      mk::sim::SimOptions o;
      o.fast = fast;
      CHECK(mk::sim::predict(output, simtest::cluster(1, 2), p, o).totalUs ==
            doctest::Approx(to.totalUs).epsilon(1e-9));
      CHECK(mk::sim::predict(scratch, simtest::cluster(1, 2), p, o).totalUs ==
            doctest::Approx(ts.totalUs).epsilon(1e-9));
    }
  }
}
