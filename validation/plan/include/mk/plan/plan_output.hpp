// mkernel — what mk-plan writes: plan.json ("mkernel.plan.v1", docs/planner.md has every field), the run's
// statistics kept apart (run-stats.json: wall times differ from run to run, the plan does not), and the table
// printed on the terminal.
#pragma once

#include <string>

#include "mk/plan/planner.hpp"

namespace mk::plan {

/// Schema names.
inline constexpr const char* kPlanSchema = "mkernel.plan.v1";
inline constexpr const char* kPlanStatsSchema = "mkernel.plan-stats.v1";
inline constexpr const char* kKernelCensusSchema = "mkernel.kernel-census.v1";

/// The plan as JSON: the same inputs give the same text (no times of the run, no paths of the outputs).
/// `commit` is the build's commit.
std::string planToJson(const PlanResult& plan, const std::string& commit, int indent = 1);

/// The kernel census (mk-plan --emit-kernels, "mkernel.kernel-census.v1"; docs/planner.md, "Kernel census"):
/// for every feasible GPU count of the baseline, every stage's kernels with the contract's fields (class,
/// kernel, pass, dtype, shape, flops, bytes), times, and the price the planner gave them (per launch, per
/// micro-batch, per step) with its source.
std::string kernelCensusToJson(const PlanResult& plan, const std::string& commit, int indent = 1);

/// How long the run took and what it simulated.
std::string planStatsToJson(const PlanResult& plan, const std::string& command, int indent = 1);

/// The terminal summary: the inputs in a few lines, one table per variant (GPUs, layout, step time and its
/// breakdown, tokens/s, MFU, scaling efficiency, confidence), the what-ifs side by side, the fused status.
/// `brief`: the baseline's table only (with the what-ifs side by side).
std::string formatPlanText(const PlanResult& plan, bool brief = false);

}  // namespace mk::plan
