// mkernel — the planner's entry point for a fused operator (fused.hpp).
#include "mk/sim/fused.hpp"

#include <algorithm>

#include "mk/cost/cost.hpp"

namespace mk::sim {

FusedPrediction predictFused(const FusedSpec& spec, const FusedOptions& opt, const Topology& topo, uint32_t nRanks,
                             const Profile& profile, bool simulate, const SimOptions& simOpt) {
  FusedPrediction out;
  out.plan = planFused(spec, opt, topo, nRanks, profile);
  out.layered = layeredEstimate(spec, topo, nRanks, profile);
  out.totalUs = out.plan.estimate.totalUs;
  if (simulate) {
    const Schedule s = generate(spec, topo.layout(nRanks), out.plan.opt);
    SimOptions so = simOpt;
    so.trace = false;
    so.linkLoad = false;
    out.simulatedUs = predict(s, topo, profile, so).totalUs;
    out.uncontendedUs = simulateUncontended(s, profile, topo).totalUs;
    out.totalUs = *out.simulatedUs;
  }
  out.computeUs = out.layered.gemmUs;
  out.commUs = out.layered.collectiveUs;
  out.exposedCommUs = std::max(0.0, out.totalUs - out.computeUs);
  out.tflopsPerGpu = out.totalUs > 0 ? fusedFlops(spec) / nRanks / (out.totalUs * 1e6) : 0.0;
  return out;
}

}  // namespace mk::sim
