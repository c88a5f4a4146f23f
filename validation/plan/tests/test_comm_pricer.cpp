// The planner's communication prices: what users run is NCCL, so EP all-to-alls and PP sends go through the
// layered family as NCCL's p2p (nccl-p2p), as the all-reduce, all-gather and reduce-scatter go through nccl-ring
// and nccl-tree (docs/planner.md).
#include <doctest/doctest.h>

#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/plan/comm_pricer.hpp"
#include "mk/plan/plan_output.hpp"
#include "mk/plan/pricer.hpp"
#include "mk/plan/shard.hpp"
#include "mk/topology/topology.hpp"
#include "mk/workload/lowering.hpp"

using namespace mk;
using namespace mk::plan;

TEST_CASE("comm pricer: EP all-to-alls and PP sends are priced as NCCL's p2p sends") {
  const Topology cluster = topologyPreset("dgx-h100", 2);
  const Profile profile = defaultProfile(cluster);
  PricerSettings settings;
  settings.jobs = 1;
  CommPricer pricer(settings);
  CommOp a2a;
  a2a.kind = CommKind::AllToAll;
  a2a.count = 4096;
  const std::string ep = pricer.request(a2a, GroupSet{"ep", {{0, 1, 2, 3, 8, 9, 10, 11}}}, cluster, profile);
  CommOp send;
  send.kind = CommKind::SendRecv;
  send.count = 1 << 20;
  const std::string pp = pricer.request(send, GroupSet{"pp", {{0, 8}}}, cluster, profile);
  pricer.runAll();
  for (const std::string& key : {ep, pp}) {
    const CommPrice& p = pricer.price(key);
    CAPTURE(p.algo);
    CHECK(p.algo.rfind("nccl-p2p", 0) == 0);
    CHECK(p.us > 0);
  }
  // A 2 MiB send moves in NCCL's Simple protocol (above P2P_LL_THRESHOLD).
  CHECK(pricer.price(pp).algo.find("(simple)") != std::string::npos);
}

// Symmetric groups simulated once (docs/planner.md, "Communication"): a representative of each class of
// instances with its share of the leaf uplinks it crosses against every instance simulated together.
namespace {

/// `nodes` DGX H100 nodes, `perLeaf` to a leaf, uplinks oversubscribed 4:1 (so that sharing them shows).
Topology sharedFabric(uint32_t nodes, uint32_t perLeaf) {
  Topology t = topologyPreset("dgx-h100", nodes);
  t.fabric.nodesPerLeaf = perLeaf;
  t.fabric.oversubscription = 4;
  return t;
}

/// The price of `op` on `groups` by the class representative and by every instance.
std::pair<double, double> reducedAndFull(const CommOp& op, const GroupSet& groups, const Topology& cluster) {
  const Profile profile = defaultProfile(cluster);
  double us[2] = {0, 0};
  for (int full = 0; full < 2; ++full) {
    PricerSettings settings;
    settings.jobs = 1;
    settings.everyInstance = full == 1;
    CommPricer pricer(settings);
    const std::string key = pricer.request(op, groups, cluster, profile);
    pricer.runAll();
    us[full] = pricer.price(key).us;
  }
  return {us[0], us[1]};
}

/// Data parallelism with TP 8: one instance per (stage, local GPU), over the nodes `stageOf` gives that stage.
GroupSet dpOverStages(uint32_t nodes, uint32_t stages, bool interleaved) {
  GroupSet g{"dp", {}};
  for (uint32_t s = 0; s < stages; ++s)
    for (uint32_t local = 0; local < 8; ++local) {
      std::vector<uint32_t> ranks;
      for (uint32_t n = 0; n < nodes; ++n)
        if ((interleaved ? n % stages : n / (nodes / stages)) == s) ranks.push_back(n * 8 + local);
      g.instances.push_back(ranks);
    }
  return g;
}

}  // namespace

TEST_CASE("comm pricer: one representative per class prices as every instance simulated together") {
  CommOp ar;
  ar.kind = CommKind::AllReduce;
  ar.count = 1 << 20;
  CommOp a2a;
  a2a.kind = CommKind::AllToAll;
  a2a.count = 1 << 16;
  CommOp send;
  send.kind = CommKind::SendRecv;
  send.count = 1 << 20;
  // EP over nodes 0 and 2 and over 1 and 3; PP pairs node n -> n + 2: both share every leaf uplink in two.
  GroupSet ep{"ep", {{}, {}}};
  GroupSet pp{"pp", {}};
  for (uint32_t g = 0; g < 32; ++g) ep.instances[(g / 8) % 2].push_back(g);
  for (uint32_t g = 0; g < 16; ++g) pp.instances.push_back({g, g + 16});
  struct Layout {
    const char* name;
    CommOp op;
    GroupSet groups;
    Topology cluster;
    double share;  // of the uplinks the representative crosses
  };
  const Layout layouts[] = {
      {"DP x TP 8, stages interleaved over leaves", ar, dpOverStages(8, 2, true), sharedFabric(8, 2), 0.5},
      {"DP x TP 8, a stage per pair of leaves", ar, dpOverStages(8, 2, false), sharedFabric(8, 2), 1},
      {"EP all-to-all", a2a, ep, sharedFabric(4, 2), 0.5},
      {"PP sends", send, pp, sharedFabric(4, 2), 0.5},
  };
  for (const Layout& l : layouts) {
    CAPTURE(l.name);
    const ConcurrentPlacement p = placeConcurrent(l.groups, l.cluster);
    CHECK(p.instances == 1);
    CHECK(p.uplinkShare == doctest::Approx(l.share));
    const auto [reduced, full] = reducedAndFull(l.op, l.groups, l.cluster);
    CAPTURE(reduced);
    CAPTURE(full);
    if (l.share == 1)
      CHECK(reduced == doctest::Approx(full).epsilon(1e-9));  // nothing shared: exact
    else
      CHECK(reduced == doctest::Approx(full).epsilon(0.02));
    if (l.share == 1) continue;
    // The representative alone on unscaled uplinks (the cluster's own oversubscription, as before the classes)
    // is faster than the full simulation: the sharing is what the scaling puts back.
    Topology alone = l.cluster;
    alone.fabric.oversubscription *= l.share;
    const double unshared = reducedAndFull(l.op, l.groups, alone).first;
    CHECK(unshared < full * 0.9);
  }
}

TEST_CASE("placement: uplinks shared unevenly are simulated with every instance that meets the set on them") {
  // Instance 0 crosses leaves 0 and 1, instance 1 leaves 0 and 2, instance 2 leaves 2 and 3 (GPU 0 of each
  // node): leaf 0's uplink carries two instances, leaf 1's one, so no share holds for both; instance 3 stays
  // inside leaf 0 on another rail and never meets them.
  const Topology t = sharedFabric(8, 2);
  const GroupSet uneven{"dp", {{0, 16}, {8, 32}, {40, 56}, {1, 9}}};
  const ConcurrentPlacement p = placeConcurrent(uneven, t);
  CHECK(p.uplinkShare == 1);
  CHECK(p.instances == 3);  // the three crossing instances, not the one inside leaf 0
  CHECK(p.reduced.fabric.oversubscription == 4);
}

TEST_CASE("comm pricer: equal requests are placed and keyed once, with the keys of a fresh pricer") {
  const Topology cluster = topologyPreset("dgx-h100", 4);
  const Profile profile = defaultProfile(cluster);
  PricerSettings settings;
  settings.jobs = 1;
  settings.budgetSteps = 1;  // closed forms: nothing simulated
  const GroupSet dp{"dp", {{0, 8, 16, 24}, {1, 9, 17, 25}}};
  const GroupSet shifted{"dp", {{2, 10, 18, 26}, {3, 11, 19, 27}}};
  CommOp op;
  op.kind = CommKind::AllReduce;
  CommPricer pricer(settings);
  const std::size_t context = pricer.context(cluster, profile);
  CHECK(pricer.context(topologyPreset("dgx-h100", 4), profile) == context);  // equal: one context
  CHECK(pricer.context(topologyPreset("dgx-h100", 8), profile) != context);
  std::vector<std::string> keys;
  for (uint64_t count : {1u << 20, 1u << 22, 1u << 20}) {
    op.count = count;
    keys.push_back(pricer.request(op, dp, context));
    keys.push_back(pricer.request(op, shifted, context));
    // Each key is the one a pricer that never saw the others gives.
    CommPricer fresh(settings);
    CHECK(fresh.request(op, dp, cluster, profile) == keys[keys.size() - 2]);
    CHECK(fresh.request(op, shifted, cluster, profile) == keys.back());
  }
  CHECK(pricer.placements() == 2);  // two group sets, each placed once for its three requests
  CHECK(pricer.requests() == 6);
  CHECK(keys[0] == keys[4]);
  CHECK(keys[0] != keys[2]);
  pricer.runAll();
  CHECK(pricer.price(keys[2]).us > pricer.price(keys[0]).us);
}

TEST_CASE("pricer: sources, domains and bounds read back from the spelling plan.json writes") {
  // The public names (plan.json's collectives[].source and .domain), from the one table each.
  const std::pair<PriceSource, std::string> sources[] = {{PriceSource::SimGrid, "simgrid"},
                                                         {PriceSource::SimGridFast, "simgrid-fast"},
                                                         {PriceSource::ClosedForm, "closed-form"},
                                                         {PriceSource::None, "none"}};
  for (const auto& [s, name] : sources) {
    CHECK(toString(s) == name);
    CHECK(parsePriceSource(name) == s);
  }
  CHECK(toString(CommDomain::NvLink) == std::string("nvlink"));
  CHECK(toString(CommDomain::Network) == std::string("network"));
  CHECK(parseCommDomain("network") == CommDomain::Network);
  CHECK_FALSE(parsePriceSource("SimGrid").has_value());
  CHECK_FALSE(parseCommDomain("nvl").has_value());
  // Every bound is said with the busiest link and read back from what it says.
  CommPrice p;
  p.busiest.push_back(sim::LinkLoad{"n0.nic0", 50, 1e6, 40, 50, 0.8});
  for (CommBound b : {CommBound::None, CommBound::NotSimulated, CommBound::Latency, CommBound::Bandwidth}) {
    p.bound = b;
    CAPTURE(boundText(p));
    CHECK(parseBoundText(boundText(p), p) == b);
  }
  p.bound = CommBound::Bandwidth;
  CHECK(boundText(p) == "NIC bandwidth (n0.nic0 busy 80 %)");
  p.bound = CommBound::Latency;
  CHECK(boundText(p) == "latency and synchronisation (busiest link n0.nic0 busy 80 %)");
  CHECK_FALSE(parseBoundText("NIC bandwidth (n0.nic1 busy 80 %)", p).has_value());
}

TEST_CASE("pricer: the SimGrid, fast and closed-form pricers price one job through one interface") {
  const Topology cluster = topologyPreset("dgx-h100", 1);
  CommJob job;
  job.spec.op = CollOp::AllReduce;
  job.spec.algo = Algorithm::Ring;
  job.spec.count = 1 << 20;
  job.placement = placeConcurrent(GroupSet{"tp", {{0, 1, 2, 3, 4, 5, 6, 7}}}, cluster);
  job.profile = defaultProfile(cluster);
  CommPrice closed;
  closed.op = "allreduce";
  const double formUs = closedForm(job.spec, job.gen, job.placement.choice, 8, job.profile).totalUs;
  closed.closedFormUs = formUs;
  pricerFor(PriceSource::ClosedForm).price(job, closed);
  CHECK(closed.source == PriceSource::ClosedForm);
  CHECK(closed.bound == CommBound::NotSimulated);
  CHECK(closed.us == formUs);
  CHECK(closed.steps == 0);  // nothing generated
  // Inside one node nothing contends: the fast mode is the full replay (docs/simulator.md).
  CommPrice full, fast;
  pricerFor(PriceSource::SimGrid).price(job, full);
  pricerFor(PriceSource::SimGridFast).price(job, fast);
  CHECK(full.source == PriceSource::SimGrid);
  CHECK(fast.source == PriceSource::SimGridFast);
  CHECK(full.steps > 0);
  CHECK(full.us > 0);
  CHECK(fast.us == doctest::Approx(full.us).epsilon(1e-9));
  CHECK_FALSE(full.busiest.empty());
  CHECK(full.bound != CommBound::None);
  CHECK_THROWS_AS(pricerFor(PriceSource::None), Error);
}

TEST_CASE("shard prices: source, domain and bound cross the shard file as plan.json spells them") {
  ShardFile f;
  f.shard = {0, 2};
  const PriceSource sources[] = {PriceSource::SimGrid, PriceSource::SimGridFast, PriceSource::ClosedForm,
                                 PriceSource::None};
  const CommBound bounds[] = {CommBound::Bandwidth, CommBound::Latency, CommBound::NotSimulated, CommBound::None};
  for (int i = 0; i < 4; ++i) {
    CommPrice p;
    p.source = sources[i];
    p.bound = bounds[i];
    p.domain = i % 2 ? CommDomain::Network : CommDomain::NvLink;
    if (i < 2) p.busiest.push_back(sim::LinkLoad{"rail0.leaf0.up_UP", 400, 1e9, 300, 400, 0.75});
    f.prices["key" + std::to_string(i)] = p;
  }
  const std::string path =
      (std::filesystem::temp_directory_path() / ("mk-shard-prices-" + std::to_string(::getpid()) + ".json")).string();
  const std::string text = addShardSection(std::string("{\"schema\": \"") + kPlanSchema + "\"}", f);
  auto write = [&](const std::string& t) { std::ofstream(path) << t; };
  write(text);
  const ShardFile back = readShardFile(path);
  REQUIRE(back.prices.size() == 4);
  for (const auto& [key, p] : f.prices) {
    const CommPrice& q = back.prices.at(key);
    CHECK(q.source == p.source);
    CHECK(q.domain == p.domain);
    CHECK(q.bound == p.bound);
    CHECK(boundText(q) == boundText(p));
  }
  CHECK(text.find("\"source\": \"simgrid-fast\"") != std::string::npos);
  CHECK(text.find("\"bound\": \"leaf uplink bandwidth (rail0.leaf0.up_UP busy 75 %)\"") != std::string::npos);
  // A name no table spells is refused in one line naming the file and the field.
  std::string bad = text;
  bad.replace(bad.find("\"simgrid-fast\""), 14, "\"simgrid-slow\"");
  write(bad);
  CHECK_THROWS_WITH_AS(readShardFile(path),
                       doctest::Contains("a shard price's \"source\" is 'simgrid-slow', not simgrid, simgrid-fast"),
                       Error);
  std::filesystem::remove(path);
}
