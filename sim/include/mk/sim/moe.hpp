// mkernel — moe-ffn's return across nodes chosen by the SimGrid replay (MoeCombineReturn, mk/algorithms/moe.hpp): the
// one rule that mk-sim and mk-plan apply, so the same spec on the same cluster runs the same return in both.
#pragma once

#include <cstdint>

#include "mk/algorithms/moe.hpp"
#include "mk/cost/cost.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"

namespace mk::sim {

/// moe-ffn with its return across nodes decided (planMoeFfn).
struct MoeFfnPlan {
  MoeFfnSpec spec;          ///< combineReturn concrete: the spec's, the cheaper for Auto, PerBlock on one node
  Schedule schedule;        ///< generateMoeFfn(spec, topo.layout(nRanks)), cost attributes at the expected extents
  bool multiNode = false;   ///< the ranks span nodes: the returns differ
  bool byModel = false;     ///< combineReturn was Auto across nodes: both returns generated and replayed
  double perBlockUs = 0;    ///< when byModel: the per-block return's predicted time
  double nodeSumUs = 0;     ///< when byModel: the node-sum return's
  double chosenUs() const;  ///< when byModel: the lower of the two, the chosen schedule's
};

/// The one rule that chooses moe-ffn's return across nodes: a concrete combineReturn is kept; Auto across nodes
/// generates both returns on topo.layout(nRanks) and keeps the one whose SimGrid replay (predict() with `opt`, its
/// trace and link loads off: how mk-plan prices a group across nodes, and what mk-sim predicts) is shorter, at the
/// extents' expected values; PerBlock on a tie (fewer steps, no relay buffers). On one node the returns are one
/// schedule, generated once and not replayed. The uncontended timeline cannot make this choice: it gives every
/// rank its static share of the network, so it misses the contention that the per-block return's extra rows cause
/// (docs/fused-operators.md, "moe-ffn"). Throws what generateMoeFfn and predict throw.
MoeFfnPlan planMoeFfn(const MoeFfnSpec& spec, const Topology& topo, uint32_t nRanks, const Profile& profile,
                      SimOptions opt = {});

}  // namespace mk::sim
