// mkernel — where the engine's ranks are: nodes (ranks that reach each other over NVLink and CUDA IPC) and what a
// submitted op must agree with. The helpers that answer "same node?" live in setup.cpp next to the other facts
// creation establishes.
#include <algorithm>
#include <string>
#include <vector>

#include "engine/engine.hpp"
#include "engine/internode.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

namespace {
/// Node ids renumbered densely in order of first appearance, so two layouts compare by grouping.
std::vector<uint32_t> canonical(const std::vector<uint32_t>& nodeOf) {
  std::vector<uint32_t> ids, out(nodeOf.size());
  for (size_t r = 0; r < nodeOf.size(); ++r) {
    auto it = std::find(ids.begin(), ids.end(), nodeOf[r]);
    if (it == ids.end()) {
      ids.push_back(nodeOf[r]);
      it = ids.end() - 1;
    }
    out[r] = static_cast<uint32_t>(it - ids.begin());
  }
  return out;
}

std::string layoutText(const std::vector<uint32_t>& nodeOf) {
  std::string t;
  for (size_t r = 0; r < nodeOf.size(); ++r) t += (r ? "," : "") + std::to_string(nodeOf[r]);
  return "[" + t + "]";
}
}  // namespace

std::string Engine::interNodeTransport() const { return interNode_ ? interNode_->transportName() : std::string(); }

void EngineSubmission::requireCollectiveLayout() const {
  const auto n = static_cast<uint32_t>(ctx_.nodeOf.size());
  std::vector<uint32_t> want;
  try {
    want = ctx_.topology.layout(n);
  } catch (const Error&) {
  }
  if (canonical(want) != canonical(ctx_.nodeOf))
    throw Error(ErrorCode::Unsupported,
                "the generated collectives place ranks node-major on nodes of equal size, but this communicator's "
                "ranks are on nodes " +
                    layoutText(ctx_.nodeOf) +
                    " (rank -> node): start the ranks of each node consecutively with the same count per node, or "
                    "run a schedule generated for this layout with execute()");
}

void EngineSubmission::requireSameNodes(const Schedule& s) const {
  if (canonical(s.nodeOf) != canonical(ctx_.nodeOf))
    throw Error(ErrorCode::InvalidArgument, "schedule places its ranks on nodes " + layoutText(s.nodeOf) +
                                                " but this communicator's ranks are on nodes " +
                                                layoutText(ctx_.nodeOf) +
                                                " (rank -> node; generate it with this layout)");
}

}  // namespace mk::runtime
