// The planner's communication prices: what users run is NCCL, so EP all-to-alls and PP sends go through the
// layered family as NCCL's p2p (nccl-p2p), as the all-reduce, all-gather and reduce-scatter go through nccl-ring
// and nccl-tree (docs/planner.md).
#include <doctest/doctest.h>

#include <string>

#include "mk/cost/cost.hpp"
#include "mk/plan/comm_pricer.hpp"
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
