// Every generator's schedule replayed on small platforms: without contention the prediction equals the
// uncontended timeline and the closed form of models/cost (within 1 %); with contention it is never faster;
// and algorithms order as theory says.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <set>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"

namespace {

struct Platform {
  const char* preset;
  uint32_t nodes;
  uint32_t ranks;
};

// Single-node platforms never contend for these schedules: NVSwitch ports carry symmetric traffic.
// dgx-h200 with 4 and 8 ranks: one 8-GPU NVSwitch node, partly and fully used.
const Platform kSingleNode[] = {
    {"h200x2", 1, 2}, {"dgx-h100", 1, 8}, {"dgx-h100", 1, 5}, {"dgx-h200", 1, 4}, {"dgx-h200", 1, 8}};

mk::Topology topology(const Platform& p) {
  mk::Topology t = mk::topologyPreset(p.preset, p.nodes);
  // The profile's network alpha describes a same-leaf route; a route through the spine pays two more switch
  // hops in the simulator only. Without them every route has the latency the closed form assumes.
  t.fabric.switchLatencyUs = 0;
  return t;
}

mk::sim::SimOptions quiet() {
  mk::sim::SimOptions o;
  o.trace = false;
  o.linkLoad = false;
  return o;
}

/// Odd sizes so no chunk boundary is round.
const uint64_t kCounts[] = {1021, 262147};

struct Outcome {
  double sim = 0, timeline = 0, closed = -1;
};

Outcome run(mk::CollOp op, const std::string& algo, const Platform& pl, uint64_t count, uint32_t chunks,
            uint32_t channels, const std::string& inter = "ring") {
  const mk::Topology topo = topology(pl);
  mk::CollectiveSpec spec;
  spec.op = op;
  spec.algo = mk::requireAlgorithm(op, algo);
  spec.dtype = mk::DType::BFloat16;
  spec.count = count;
  mk::GenOptions opt;
  opt.chunks = chunks;
  opt.channels = channels;
  opt.inter = *mk::parseInterPhase(inter);
  const mk::Schedule s = mk::generate(spec, topo.layout(pl.ranks), opt);
  const mk::Profile prof = mk::defaultProfile(topo);
  Outcome o;
  o.timeline = mk::simulateUncontended(s, prof).totalUs;
  try {
    o.closed = mk::closedForm(spec, opt, topo, pl.ranks, prof).totalUs;
  } catch (const mk::Error& e) {
    if (e.code() != mk::ErrorCode::Unsupported) throw;
  }
  o.sim = mk::sim::predict(s, topo, prof, quiet()).totalUs;
  return o;
}

/// Single node: prediction == timeline (1e-4) == closed form (1 %), for a few sizes and shapes.
void checkSingleNode(mk::CollOp op, const std::string& algo) {
  for (const Platform& pl : kSingleNode)
    for (const uint64_t count : kCounts)
      for (const auto& [chunks, channels] : {std::pair<uint32_t, uint32_t>{1, 1}, {3, 2}}) {
        CAPTURE(pl.preset);
        CAPTURE(pl.ranks);
        CAPTURE(count);
        CAPTURE(chunks);
        CAPTURE(channels);
        const Outcome o = run(op, algo, pl, count, chunks, channels);
        CHECK(o.sim == doctest::Approx(o.timeline).epsilon(1e-4));  // SimGrid dates carry ~1e-11 s of rounding
        if (o.closed > 0) CHECK(o.sim == doctest::Approx(o.closed).epsilon(0.01));
      }
}

/// Two DGX nodes: schedules that do not contend match the closed form; the others are only slower.
void checkTwoNodes(mk::CollOp op, const std::string& algo, bool contentionFree, const std::string& inter = "ring") {
  const Platform pl{"dgx-h100", 2, 16};
  for (const uint64_t count : kCounts) {
    CAPTURE(count);
    const Outcome o = run(op, algo, pl, count, 2, 1, inter);
    if (contentionFree) {
      CHECK(o.sim == doctest::Approx(o.timeline).epsilon(0.01));
      if (o.closed > 0) CHECK(o.sim == doctest::Approx(o.closed).epsilon(0.01));
    } else {
      // Several senders write into one NIC at once (incast): contention can only slow the schedule down.
      CHECK(o.sim >= o.timeline * (1 - 1e-4));
    }
  }
}

}  // namespace

TEST_CASE("generators: the tested set covers every registered algorithm") {
  std::set<std::string> registered;
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll})
    for (const auto& a : mk::algorithmsFor(op))
      registered.insert(std::string(mk::toString(op)) + "/" + mk::toString(a));
  const std::set<std::string> tested = {
      "allreduce/one-shot",   "allreduce/two-shot",         "allreduce/ring",         "allreduce/hierarchical",
      "allgather/ring",       "allgather/direct",           "allgather/hierarchical", "reducescatter/ring",
      "reducescatter/direct", "reducescatter/hierarchical", "broadcast/direct",       "broadcast/ring",
      "alltoall/direct"};
  CHECK(registered == tested);  // a new generator needs its test cases below
}

TEST_CASE("generators: allreduce one-shot matches the closed form on one node") {
  checkSingleNode(mk::CollOp::AllReduce, "one-shot");
  checkTwoNodes(mk::CollOp::AllReduce, "one-shot", false);
}
TEST_CASE("generators: allreduce two-shot matches the closed form on one node") {
  checkSingleNode(mk::CollOp::AllReduce, "two-shot");
  checkTwoNodes(mk::CollOp::AllReduce, "two-shot", false);
}
TEST_CASE("generators: allreduce ring matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::AllReduce, "ring");
  checkTwoNodes(mk::CollOp::AllReduce, "ring", true);
}
TEST_CASE("generators: allreduce hierarchical matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::AllReduce, "hierarchical");
  checkTwoNodes(mk::CollOp::AllReduce, "hierarchical", true);
  checkTwoNodes(mk::CollOp::AllReduce, "hierarchical", true, "rhd");
  checkTwoNodes(mk::CollOp::AllReduce, "hierarchical", true, "bruck");
}
TEST_CASE("generators: allgather ring matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::AllGather, "ring");
  checkTwoNodes(mk::CollOp::AllGather, "ring", true);
}
TEST_CASE("generators: allgather direct matches the closed form on one node") {
  checkSingleNode(mk::CollOp::AllGather, "direct");
  checkTwoNodes(mk::CollOp::AllGather, "direct", false);
}
TEST_CASE("generators: allgather hierarchical matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::AllGather, "hierarchical");
  checkTwoNodes(mk::CollOp::AllGather, "hierarchical", true);
}
TEST_CASE("generators: reducescatter ring matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::ReduceScatter, "ring");
  checkTwoNodes(mk::CollOp::ReduceScatter, "ring", true);
}
TEST_CASE("generators: reducescatter direct matches the closed form on one node") {
  checkSingleNode(mk::CollOp::ReduceScatter, "direct");
  checkTwoNodes(mk::CollOp::ReduceScatter, "direct", false);
}
TEST_CASE("generators: reducescatter hierarchical matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::ReduceScatter, "hierarchical");
  checkTwoNodes(mk::CollOp::ReduceScatter, "hierarchical", true);
}
TEST_CASE("generators: broadcast direct matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::Broadcast, "direct");
  checkTwoNodes(mk::CollOp::Broadcast, "direct", true);
}
TEST_CASE("generators: broadcast ring matches the closed form on one and two nodes") {
  checkSingleNode(mk::CollOp::Broadcast, "ring");
  checkTwoNodes(mk::CollOp::Broadcast, "ring", true);
}
TEST_CASE("generators: alltoall direct matches the closed form on one node") {
  checkSingleNode(mk::CollOp::AllToAll, "direct");
  checkTwoNodes(mk::CollOp::AllToAll, "direct", false);
}

namespace {
double predictAllReduce(const std::string& algo, const char* preset, uint32_t nodes, uint64_t bytes) {
  const mk::Topology topo = mk::topologyPreset(preset, nodes);
  mk::CollectiveSpec spec;
  spec.algo = mk::requireAlgorithm(spec.op, algo);
  spec.dtype = mk::DType::BFloat16;
  spec.count = bytes / 2;
  const mk::Schedule s = mk::generate(spec, topo.layout(topo.totalGpus()));
  return mk::sim::predict(s, topo, mk::defaultProfile(topo), quiet()).totalUs;
}
}  // namespace

TEST_CASE("generators: hierarchical beats the flat ring across nodes for large messages") {
  const double hier = predictAllReduce("hierarchical", "dgx-h100", 4, 64ull << 20);
  const double ring = predictAllReduce("ring", "dgx-h100", 4, 64ull << 20);
  CHECK(hier * 3 < ring);  // flat ring: every step waits on a 50 GB/s NIC; hierarchical: 1/8 of the data crosses it
}

TEST_CASE("generators: one-shot beats ring for small messages on one node") {
  CHECK(predictAllReduce("one-shot", "dgx-h100", 1, 8192) < predictAllReduce("ring", "dgx-h100", 1, 8192));
}

TEST_CASE("generators: ring beats one-shot for large messages on one node") {
  const uint64_t bytes = 64ull << 20;
  CHECK(predictAllReduce("ring", "dgx-h100", 1, bytes) * 2 < predictAllReduce("one-shot", "dgx-h100", 1, bytes));
}

TEST_CASE("generators: fast mode equals exact mode for a hierarchical allreduce across nodes") {
  const mk::Topology topo = mk::topologyPreset("dgx-h100", 4);
  mk::CollectiveSpec spec;
  spec.algo = mk::Algorithm::Hierarchical;
  spec.count = 1000003;
  for (mk::InterPhase inter : {mk::InterPhase::Ring, mk::InterPhase::Rhd}) {
    CAPTURE(mk::toString(inter));
    mk::GenOptions opt;
    opt.inter = inter;
    const mk::Schedule s = mk::generate(spec, topo.layout(32), opt);
    const mk::Profile prof = mk::defaultProfile(topo);
    mk::sim::SimOptions fast = quiet();
    fast.fast = true;
    const double exact = mk::sim::predict(s, topo, prof, quiet()).totalUs;
    // SimGrid rounds dates to its timing precision (1e-9 s = 1e-3 us); the two modes add them up differently.
    CHECK(std::fabs(mk::sim::predict(s, topo, prof, fast).totalUs - exact) <= 1e-6 * exact + 2e-3);
  }
}

TEST_CASE("generators: hierarchical bruck and bruck-half match their closed forms on 3, 5, 10 and 12 nodes") {
  // Every round pairs each NIC with one sender and one receiver, and every node sends the same messages (the
  // rotated reduce-scatter, the all-gather's uniform cut), so the nodes stay in step with several chunks in
  // flight too: nothing contends and the replay equals the closed form (the wrapped ranges of before put 5 and
  // 12 nodes out of step, and a NIC received two rounds at once: 1.26x at 12 nodes, 8 chunks).
  for (const char* inter : {"bruck", "bruck-half"})
    for (uint32_t chunks : {1u, 4u})
      for (uint32_t nodes : {3u, 5u, 10u, 12u}) {
        CAPTURE(inter);
        CAPTURE(chunks);
        CAPTURE(nodes);
        const Outcome o = run(mk::CollOp::AllReduce, "hierarchical", Platform{"dgx-h100", nodes, 8 * nodes},
                              uint64_t(nodes) << 20, chunks, 1, inter);
        CHECK(o.sim == doctest::Approx(o.timeline).epsilon(0.01));
        CHECK(o.sim == doctest::Approx(o.closed).epsilon(0.01));
      }
}

TEST_CASE("generators: hierarchical rhd matches its closed form on 8 nodes and folds 6 nodes correctly") {
  // 8 DGX nodes on one leaf: every exchange pairs NICs one to one, so nothing contends and the replay equals
  // the closed form. 6 nodes fold 2 extra nodes into hosts whose NICs then also carry the fold traffic: the
  // replay can only be slower than the uncontended timeline.
  for (uint32_t chunks : {1u, 4u}) {
    CAPTURE(chunks);
    const Outcome even =
        run(mk::CollOp::AllReduce, "hierarchical", Platform{"dgx-h100", 8, 64}, 8ull << 20, chunks, 1, "rhd");
    CHECK(even.sim == doctest::Approx(even.timeline).epsilon(0.01));
    CHECK(even.sim == doctest::Approx(even.closed).epsilon(0.01));
    const Outcome fold =
        run(mk::CollOp::AllReduce, "hierarchical", Platform{"dgx-h100", 6, 48}, 6ull << 20, chunks, 1, "rhd");
    CHECK(fold.sim >= fold.timeline * (1 - 1e-4));
    CHECK(fold.closed >= fold.timeline * (1 - 1e-9));
  }
}
