// mkernel — what mk-plan's pass 1 keeps for one scale, and what a priced scale is made to say: the confidence of
// each part of its step, how its compute was checked and what bounds each phase (scale_report.cpp). Internal to
// the planner (planner.cpp, scale_report.cpp).
#pragma once

#include <string>
#include <vector>

#include "mk/plan/planner.hpp"

namespace mk::plan::detail {

/// Everything pass 1 prepares for one scale.
struct Pending {
  StepLowering step;
  Topology cluster;
  std::vector<std::vector<std::string>> keys;           ///< [stage][comm op]
  std::vector<std::vector<double>> computeUs;           ///< [stage][compute op]
  std::vector<std::vector<bool>> computeMemBound;       ///< [stage][compute op]
  std::vector<std::vector<std::string>> computeSource;  ///< [stage][compute op]
};

/// ScaleResult::computeBy*, classUs / classUse and the step's status from its classes (the worst of those making up
/// at least 5 % of the step).
void attributeClasses(ScaleResult& sr, const PlanResult& out, const Pending& pd);

/// ScaleResult::bounds: what limits the compute and each communication phase.
void describeBounds(ScaleResult& sr, const PlanResult& out, const Pending& pd);

}  // namespace mk::plan::detail
