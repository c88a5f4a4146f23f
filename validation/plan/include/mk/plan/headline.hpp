// mkernel — the plan in one sentence (docs/planner.md, "The report and its numbers"): the layout, the step time
// with its confidence band, tokens/s, GPU-hours for the token budget, what bounds the step and what fusing buys.
// mk-plan prints it first and plan.json carries it, so the terminal and the HTML report say the same words.
#pragma once

#include <string>

#include "mk/plan/planner.hpp"

namespace mk::plan {

/// How far a step time can be trusted from the measured errors of its parts: each class of operation making up
/// the step (ScaleResult::classUs) weighted by its time and its median |error| (the confidence table's, this
/// GPU's where the class has errors per GPU). Classes nothing measured add nothing to the band: their share of
/// the step is 1 - measuredShare, reported next to it.
struct StepBand {
  double pct = 0;            ///< +- percent of the step: sum over measured classes of us / step x median |error|
  double measuredShare = 0;  ///< share of the step's class time from classes with a measured error
};
StepBand stepBand(const PlanResult& plan, const VariantResult& v, const ScaleResult& s);

/// "+-9.6 %"; "not validated" where no part of the step was measured (the mark is kept only there).
std::string formatBand(const StepBand& b);

/// What bounds a step: its largest part of compute, the exposed TP / EP / PP / DP / CP communication and the
/// pipeline bubble.
struct Bottleneck {
  std::string part;  ///< "compute", "TP", "EP", "PP", "DP", "CP", "bubble"
  double share = 0;  ///< of the step
  std::string why;   ///< ScaleResult::bounds of that part ("" when none)
};
Bottleneck bottleneck(const ScaleResult& s);

/// A count for people: "812", "455.8k", "1.753M", "2.1B", "1T" (4 significant digits at most, no exponent).
std::string formatCount(double v);

/// How the plan's layouts were chosen, as the headline says it: "planned" (the workload's own layout). The hook
/// for the layout search (mk-plan --search, search.hpp): where a search ranked the layouts, "recommended".
std::string layoutRole(const PlanResult& plan);

/// The headline of one scale of one variant (its layout named as layoutRole() says).
std::string formatHeadline(const PlanResult& plan, const VariantResult& v, const ScaleResult& s);

/// "87.6 GB of 80 GB per GPU": a GPU's memory against its capacity, both in decimal GB (the datasheet's unit).
std::string formatMemoryOf(double bytes, double capacity);

/// The plan's headline: the baseline at its largest feasible GPU count, or why no count is feasible.
std::string planHeadline(const PlanResult& plan);

}  // namespace mk::plan
