// mkernel — what bounds an op, in words: "network-bound: n1.nic0_UP is 98.0 % busy; NVLink 40.0 % (n0.nvl2_DOWN)".
// mk-sim says it from the simulated links' load, mk-schedule from the uncontended timeline; both print it with
// bottleneckText so that the rule and the words are the same.
#pragma once

#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk {

/// One resource's share of the op's time.
struct ResourceUse {
  std::string name;  ///< "n1.nic0_UP", "rank 3 NVLink out"
  std::string kind;  ///< "network", "NVLink", "PCIe", "fabric" (leaf/spine), "link"
  double busy = 0;   ///< bytes it carried / (its rate x the op's time), 0..1
};

/// A resource at least this busy bounds the op; below it, per-message latency and synchronisation do.
inline constexpr double kBandwidthBoundBusy = 0.5;

/// One line: "<kind>-bound: <busiest> is X % busy; <other kind> Y % (<its busiest>)..." when the busiest
/// resource is at least kBandwidthBoundBusy busy; "latency-bound: no link is half busy; the busiest, <name>, is
/// X % ..." below that; "latency-bound: no bytes crossed a link" without any. Percentages with one decimal.
std::string bottleneckText(const std::vector<ResourceUse>& uses);

/// The uncontended timeline's resource use: per rank, the bytes it sends over NVLink (Put, peer Copy) and over
/// the network (ProxyPut) divided by its rate in `profile` times the timeline's total.
std::vector<ResourceUse> timelineResourceUse(const Schedule& s, const Timeline& t, const Profile& profile);

/// The compute lanes' use: per lane that runs steps priced by FLOPs (pricedByFlops: GEMM tiles, attention blocks), the
/// time those steps take in timeline `t` over `totalUs` (the op's time: the timeline's own, or the simulated one),
/// capped at 1, kind "compute", named "rank 3 lane 2 (compute)". Next to the links' use it makes bottleneckText say
/// "compute-bound" when a compute lane is the busiest resource; empty for a schedule without compute steps.
std::vector<ResourceUse> computeResourceUse(const Schedule& s, const Timeline& t, double totalUs);

}  // namespace mk
