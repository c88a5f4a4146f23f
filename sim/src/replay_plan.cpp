// mkernel — the replay's own checks and its plan, made in the calling process before any simulation
// (replay_plan.hpp), and the rank placement (replay.hpp).
#include "replay_plan.hpp"

#include <algorithm>
#include <string>

#include "mk/error.hpp"
#include "mk/schedule/check.hpp"
#include "mk/sim/platform.hpp"
#include "mk/sim/replay.hpp"

namespace mk::sim {

namespace {

[[noreturn]] void badStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, const std::string& what) {
  throw Error(ErrorCode::InvalidSchedule, describeStep(s, rank, lane, step) + ": " + what);
}

void checkRankRef(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, const char* what, uint32_t ref) {
  if (ref >= s.nRanks)
    badStep(s, rank, lane, step,
            std::string(what) + " names rank " + std::to_string(ref) + " (nRanks " + std::to_string(s.nRanks) + ")");
}

/// The replay's own check of a step, after the timeline's (StepCosts): routes exist only where the hardware
/// has a path, NVLink inside a node and the network across nodes.
void checkRoute(const Schedule& s, uint32_t r, uint32_t l, uint32_t i, StepResource res) {
  const Step& st = s.lanes[r][l].steps[i];
  const bool usesB = (kindInfo(st.kind).fields & kFieldB) != 0;  // routes of tiles (Tensor) are not checked here
  if (res == StepResource::NvLink || res == StepResource::Network || res == StepResource::Memory) {
    checkRankRef(s, r, l, i, "dst", st.dst.rank);
    checkRankRef(s, r, l, i, "operand a", st.a.rank);
    if (usesB) checkRankRef(s, r, l, i, "operand b", st.b.rank);
  }
  if (res == StepResource::NvLink) {
    const bool peer = st.dst.rank != r || st.a.rank != r || (usesB && st.b.rank != r);
    if (!peer)
      badStep(s, r, l, i,
              std::string("an NVLink ") + toString(st.kind) + " has every operand on this rank (use link local)");
    for (uint32_t other : {st.dst.rank, st.a.rank, usesB ? st.b.rank : r})
      if (s.nodeOf[other] != s.nodeOf[r])
        badStep(s, r, l, i,
                std::string("an NVLink ") + toString(st.kind) + " reaches rank " + std::to_string(other) + " on node " +
                    std::to_string(s.nodeOf[other]) + ", not this rank's node " + std::to_string(s.nodeOf[r]));
  }
  if (res == StepResource::Network && s.nodeOf[st.dst.rank] == s.nodeOf[r])
    badStep(s, r, l, i,
            "a proxy put targets rank " + std::to_string(st.dst.rank) + " on this rank's own node (use put)");
}

}  // namespace

namespace detail {

Plan::Plan(const Schedule& s, const Topology& topo, const Profile& p)
    : gpuOf(placeRanks(s, topo)),
      costs(s, p, [&s](uint32_t r, uint32_t l, uint32_t i, StepResource res) { checkRoute(s, r, l, i, res); }) {
  platformRates(topo, p);  // the platform's own rate checks, also before forking
}

}  // namespace detail

std::vector<uint32_t> placeRanks(const Schedule& s, const Topology& topo) {
  requireRankTables(s);
  const std::string cluster = topo.name.empty() ? std::string("the cluster") : "cluster '" + topo.name + "'";
  std::vector<uint32_t> used(topo.nodes, 0);
  std::vector<uint32_t> gpuOf(s.nRanks);
  for (uint32_t r = 0; r < s.nRanks; ++r) {
    const uint32_t node = s.nodeOf[r];
    if (node >= topo.nodes)
      throw Error(ErrorCode::InvalidArgument, "schedule rank " + std::to_string(r) + " is on node " +
                                                  std::to_string(node) + " but " + cluster + " has " +
                                                  std::to_string(topo.nodes) + " node(s) (use --nodes)");
    if (used[node] == topo.node.gpus)
      throw Error(ErrorCode::InvalidArgument, "schedule places more than " + std::to_string(topo.node.gpus) +
                                                  " ranks on node " + std::to_string(node) + " but " + cluster +
                                                  " has " + std::to_string(topo.node.gpus) + " GPUs per node");
    gpuOf[r] = node * topo.node.gpus + used[node]++;
  }
  return gpuOf;
}

Topology usedPart(const Topology& topo, const Schedule& s) {
  Topology part = topo;
  uint32_t last = 0;
  for (const uint32_t node : s.nodeOf) last = std::max(last, node);
  // Nodes past the last one a rank sits on carry no traffic, and a leaf's uplink is sized by nodesPerLeaf, not by
  // the number of leaves: leaving them out changes no route and no rate of the nodes in use.
  if (!s.nodeOf.empty() && last + 1 < topo.nodes) part.nodes = last + 1;
  return part;
}

}  // namespace mk::sim
