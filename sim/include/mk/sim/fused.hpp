// mkernel — one call that prices a fused operator for a planner: the plan (split, tile, order), the closed form and,
// on request, the SimGrid replay of the same schedule, with the parts a step-time model needs
// (docs/fused-operators.md).
#pragma once

#include <cstdint>
#include <optional>

#include "mk/algorithms/fused.hpp"
#include "mk/sim/replay.hpp"

namespace mk::sim {

/// A fused op's predicted time and what it is made of.
struct FusedPrediction {
  FusedPlan plan;           ///< options used (plan.opt: tileRows, order, ctas, commCtas) and the closed form's
                            ///< breakdown (plan.estimate: busy time per resource, bound, fill/drain)
  LayeredEstimate layered;  ///< the unfused baseline under the same profile: GEMM alone + the collective alone
  std::optional<double> simulatedUs;    ///< the SimGrid replay of generate(spec, layout, plan.opt) (when asked)
  std::optional<double> uncontendedUs;  ///< the uncontended timeline of that schedule (when simulated; equals the
                                        ///< closed form: a check, not a second opinion)
  double totalUs = 0;                   ///< simulatedUs when present, else plan.estimate.totalUs
  double computeUs = 0;                 ///< the GEMM of one rank alone on all of its SMs (layered.gemmUs)
  double commUs = 0;                    ///< the collective alone (layered.collectiveUs)
  double exposedCommUs = 0;             ///< max(0, totalUs - computeUs): what communication (and the SMs it holds) adds
  double tflopsPerGpu = 0;              ///< 2 m n k / ranks / totalUs
};

/// Plan `spec` on nRanks ranks of `topo` under `profile` (planFused: what `opt` leaves open is decided by the
/// closed form), and with `simulate` replay its schedule on the SimGrid model too (`simOpt`; its trace and link
/// loads are not kept). Throws what planFused(), generate() and predict() throw.
FusedPrediction predictFused(const FusedSpec& spec, const FusedOptions& opt, const Topology& topo, uint32_t nRanks,
                             const Profile& profile, bool simulate = false, const SimOptions& simOpt = {});

}  // namespace mk::sim
