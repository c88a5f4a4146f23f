// The fused operators' schedules replayed on SimGrid: the compute lane on its share of the tensor pipe and the
// communication lanes on their CTAs and the links. Without contention the replay reproduces the uncontended
// timeline (and so the closed form); where flows meet on a link it is only slower; and the planner's entry point
// reports what it priced.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/cost/cost.hpp"
#include "mk/sim/fused.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"

namespace {

mk::sim::SimOptions quiet() {
  mk::sim::SimOptions o;
  o.trace = false;
  o.linkLoad = false;
  return o;
}

}  // namespace

TEST_CASE("fused replay: on two GPUs nothing contends, so the replay is the timeline and the closed form") {
  const mk::Topology topo = mk::topologyPreset("h200x2", 1);
  const mk::Profile prof = mk::defaultProfile(topo);
  for (mk::FusedOp op : mk::fusedOps())
    for (mk::TileOrder order : {mk::TileOrder::OwnFirst, mk::TileOrder::OwnLast, mk::TileOrder::Interleaved})
      for (uint32_t comm : {3u, 24u}) {
        const std::string opName = mk::toString(op), orderName = mk::toString(order);
        CAPTURE(opName);
        CAPTURE(orderName);
        CAPTURE(comm);
        const mk::FusedSpec fs =
            mk::FusedSpec{op, mk::DType::BFloat16, 2 * 1000 + 1, 2048, 1024};  // odd rows: a short tile per shard
        const mk::FusedOptions opt = mk::FusedOptions{256, order, 128, comm, 1};
        const mk::Schedule s = mk::generate(fs, topo.layout(2), opt);
        const double timeline = mk::simulateUncontended(s, prof).totalUs;
        const double replay = mk::sim::predict(s, topo, prof, quiet()).totalUs;
        CHECK(replay == doctest::Approx(timeline).epsilon(1e-6));
        CHECK(mk::fusedClosedForm(fs, opt, topo, 2, prof).totalUs == doctest::Approx(timeline).epsilon(1e-12));
      }
}

TEST_CASE("fused replay: the ring-ordered walks do not contend, an oversubscribed fabric makes them slower") {
  for (const double oversubscription : {1.0, 4.0}) {
    mk::Topology topo = mk::topologyPreset("dgx-h100", 2);
    topo.fabric.nodesPerLeaf = 1;  // every cross-node flow climbs to the spine
    topo.fabric.oversubscription = oversubscription;
    topo.fabric.switchLatencyUs = 0;  // the spine's two extra hops are not in the timeline
    const mk::Profile prof = mk::defaultProfile(topo);
    for (mk::FusedOp op : mk::fusedOps()) {
      const std::string opName = mk::toString(op);
      CAPTURE(opName);
      CAPTURE(oversubscription);
      const mk::FusedSpec fs = mk::FusedSpec{op, mk::DType::BFloat16, 256 * 16, 1024, 64 * 16};
      const mk::FusedOptions opt = mk::FusedOptions{128, mk::TileOrder::Interleaved, 128, 12, 1};
      const mk::Schedule s = mk::generate(fs, topo.layout(16), opt);
      const double timeline = mk::simulateUncontended(s, prof).totalUs;
      const double replay = mk::sim::predict(s, topo, prof, quiet()).totalUs;
      // With every ProxyPut holding its lane until it has landed (one message in flight), every sender of a
      // round targets a different peer at any moment: no port sees two flows at once.
      mk::Profile serial = prof;
      serial.transport.inFlight = 1;
      serial.proxyPostUs = 0;
      if (oversubscription == 1.0)
        CHECK(mk::sim::predict(s, topo, serial, quiet()).totalUs ==
              doctest::Approx(mk::simulateUncontended(s, serial).totalUs).epsilon(1e-6));
      // With the latency overlapped (8 in flight) the senders drift apart by their rounds' landings and a port
      // sometimes takes two rounds at once: gemm-rs and gemm-ar +6-7 % (ag-gemm none).
      if (oversubscription == 1.0) CHECK(replay >= timeline * (1 - 1e-9));
      if (oversubscription == 1.0) CHECK(replay <= timeline * 1.07);
      // Eight GPUs' cross-node flows share a leaf uplink of two NICs' bandwidth.
      if (oversubscription > 1.0) CHECK(replay > timeline * 1.05);
    }
  }
}

TEST_CASE("fused replay: the planner's entry point reports the plan, both predictions and the breakdown") {
  const mk::Topology topo = mk::topologyPreset("h200x2", 1);
  const mk::Profile prof = mk::defaultProfile(topo);
  const mk::FusedSpec fs = mk::FusedSpec{mk::FusedOp::GemmAllReduce, mk::DType::BFloat16, 4096, 4096, 2048};
  const mk::sim::FusedPrediction closed = mk::sim::predictFused(fs, mk::FusedOptions{}, topo, 2, prof);
  CHECK_FALSE(closed.simulatedUs);
  CHECK(closed.totalUs == closed.plan.estimate.totalUs);
  CHECK(closed.plan.splitByModel);
  CHECK(closed.plan.opt.commCtas + closed.plan.estimate.computeCtas == closed.plan.opt.ctas);
  const mk::sim::FusedPrediction sim = mk::sim::predictFused(fs, mk::FusedOptions{}, topo, 2, prof, true, quiet());
  REQUIRE(sim.simulatedUs);
  REQUIRE(sim.uncontendedUs);
  CHECK(*sim.uncontendedUs == doctest::Approx(sim.plan.estimate.totalUs).epsilon(1e-12));
  CHECK(sim.totalUs == *sim.simulatedUs);
  CHECK(sim.computeUs == doctest::Approx(2.0 * 4096 * 4096 * 1024 / (prof.gemmTflops * 1e6)));
  CHECK(sim.commUs > 0);
  CHECK(sim.exposedCommUs == doctest::Approx(sim.totalUs - sim.computeUs));
  CHECK(sim.tflopsPerGpu == doctest::Approx(2.0 * 4096 * 4096 * 2048 / 2 / (sim.totalUs * 1e6)));
  // The fused op is never faster than the physical bound, and here beats the layered program.
  CHECK(sim.totalUs >= sim.layered.boundUs());
  CHECK(sim.totalUs < sim.layered.totalUs());
}

TEST_CASE("fused replay: moe-dispatch-gemm across nodes replays its relays, priced at the expected node loads") {
  const mk::Topology topo = mk::topologyPreset("dgx-h200", 2);
  const mk::Profile prof = mk::defaultProfile(topo);
  mk::MoeDispatchGemmSpec spec;
  spec.experts = 2;
  spec.topk = 2;
  spec.tokens = 64;
  spec.hidden = 256;
  spec.outCols = 128;
  double previousUs = 0;
  for (double imbalance : {1.0, 4.0}) {
    CAPTURE(imbalance);
    spec.imbalance = imbalance;
    const mk::Schedule s = mk::generateMoeDispatchGemm(spec, {0, 0, 1, 1});
    const double timelineUs = mk::simulateUncontended(s, prof).totalUs;
    const double replayUs = mk::sim::predict(s, topo, prof, quiet()).totalUs;
    CHECK(replayUs >= timelineUs * (1 - 1e-9));  // the links only add contention to the timeline
    CHECK(replayUs > previousUs);                // more tokens per node and per expert take longer
    previousUs = replayUs;
  }
}
