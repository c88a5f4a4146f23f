// mkernel — moe-ffn's return across nodes chosen by the SimGrid replay (mk/sim/moe.hpp).
#include "mk/sim/moe.hpp"

#include <algorithm>
#include <cstdint>
#include <utility>
#include <vector>

namespace mk::sim {

double MoeFfnPlan::chosenUs() const { return std::min(perBlockUs, nodeSumUs); }

MoeFfnPlan planMoeFfn(const MoeFfnSpec& spec, const Topology& topo, uint32_t nRanks, const Profile& profile,
                      SimOptions opt) {
  const std::vector<uint32_t> nodeOf = topo.layout(nRanks);
  MoeFfnPlan plan;
  plan.spec = spec;
  plan.multiNode = std::any_of(nodeOf.begin(), nodeOf.end(), [&](uint32_t n) { return n != nodeOf[0]; });
  auto generated = [&](MoeCombineReturn r) {
    MoeFfnSpec one = spec;
    one.combineReturn = r;
    return generateMoeFfn(one, nodeOf);
  };
  if (!plan.multiNode) plan.spec.combineReturn = MoeCombineReturn::PerBlock;  // every block straight to its source
  if (plan.spec.combineReturn != MoeCombineReturn::Auto) {
    plan.schedule = generated(plan.spec.combineReturn);
    return plan;
  }
  opt.trace = false;
  opt.linkLoad = false;
  Schedule perBlock = generated(MoeCombineReturn::PerBlock);
  Schedule nodeSum = generated(MoeCombineReturn::NodeSum);
  plan.byModel = true;
  plan.perBlockUs = predict(perBlock, topo, profile, opt).totalUs;
  plan.nodeSumUs = predict(nodeSum, topo, profile, opt).totalUs;
  const bool summed = plan.nodeSumUs < plan.perBlockUs;
  plan.spec.combineReturn = summed ? MoeCombineReturn::NodeSum : MoeCombineReturn::PerBlock;
  plan.schedule = std::move(summed ? nodeSum : perBlock);
  return plan;
}

}  // namespace mk::sim
