// mkernel — internal to the replay: what it checks and plans in the calling process before any simulation.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/cost/step_cost.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/topology/topology.hpp"

namespace mk::sim::detail {

/// Everything the actors need that does not depend on SimGrid: built and checked before forking, so that bad
/// input fails with a clean error in the caller's process.
struct Plan {
  Plan(const Schedule& s, const Topology& topo, const Profile& p);
  std::vector<uint32_t> gpuOf;  ///< rank -> GPU index
  StepCosts costs;              ///< the timeline's per-step rules: shares, prices, delays
};

}  // namespace mk::sim::detail
