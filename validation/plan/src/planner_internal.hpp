// mkernel — what mk-plan's pass 1 keeps for one scale, and what a priced scale is made to say: the confidence of
// each part of its step, how its compute was checked and what bounds each phase (scale_report.cpp). Internal to
// the planner (planner.cpp, planner_scale.cpp, scale_report.cpp).
#pragma once

#include <string>
#include <vector>

#include "mk/plan/planner.hpp"

namespace mk::plan::detail {

/// Everything pass 1 prepares for one scale.
struct Pending {
  StepLowering step;
  Topology cluster;
  std::vector<std::vector<const std::string*>> keys;    ///< [stage][comm op]: the pricer's keys (CommPricer::request)
  std::vector<std::vector<double>> computeUs;           ///< [stage][compute op]
  std::vector<std::vector<bool>> computeMemBound;       ///< [stage][compute op]
  std::vector<std::vector<std::string>> computeSource;  ///< [stage][compute op]
};

/// Pass 1 of one scale (sr.gpus, sr.nodes set): resolve and lower `w`'s layout, register the price of every
/// communication with `pricer` (keeping the ranks of its groups only when `keepGroups`: the fused operators are
/// placed from them) and price every kernel. A layout the GPU count cannot run leaves `sr` infeasible with the
/// reason (planner_scale.cpp).
void prepareScale(ScaleResult& sr, Pending& pd, const Workload& w, const VariantResult& vr, const PlanResult& out,
                  CommPricer& pricer, bool keepGroups);

/// Pass 2 of one feasible scale (after pricer.runAll()): its stages' prices (each new price also into out.prices),
/// the layered step and, when `fused` is available, the fused one; throughput, MFU, GPU-hours, noise, memory,
/// goodput and what the scale says about itself (describeCriticalStage, attributeClasses, describeBounds). Not the
/// scaling efficiency: that compares the scales of a variant.
void priceScale(ScaleResult& sr, const Pending& pd, const Workload& w, const VariantResult& vr, PlanResult& out,
                const CommPricer& pricer, FusedOpPricer& fused, double overlapSlowdown);

/// What the fused variant priced on one stage: a price per (GEMM, collective) pair, and the stage's fused blocks.
struct FusedStagePrices {
  std::vector<FusedOpPrice> pairs;    ///< parallel to StageLowering::fused
  std::vector<FusedBlockUse> blocks;  ///< parallel to StageLowering::fusedBlocks
};

/// ScaleResult::comm, compute, fusedOps and fusedBlocks: what the critical stage of a priced scale runs, and how
/// often; `fused`: what the fused variant priced on that stage (nullptr: it did not run).
void describeCriticalStage(ScaleResult& sr, const PlanResult& out, const Pending& pd, const CommPricer& pricer,
                           const FusedStagePrices* fused);

/// ScaleResult::computeBy*, classUs / classUse and the step's status from its classes (the worst of those making up
/// at least 5 % of the step).
void attributeClasses(ScaleResult& sr, const PlanResult& out, const Pending& pd);

/// ScaleResult::bounds: what limits the compute and each communication phase.
void describeBounds(ScaleResult& sr, const PlanResult& out, const Pending& pd);

}  // namespace mk::plan::detail
