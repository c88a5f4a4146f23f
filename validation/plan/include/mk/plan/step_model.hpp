// mkernel — the step-time model: priced operations of every pipeline stage -> one training step's time and its
// breakdown (docs/planner.md, "Step time").
//
// Per micro-batch on stage s: forward F_s and backward B_s = the stage's compute + its blocking communication
// (tensor, expert, pipeline) + the part of ZeRO 3's per-layer gathers that its compute does not hide. The slowest
// stage c sets the pipeline: T_pipe = (m + (p - 1) / v) (F_c + B_c) for 1F1B and interleaved (v model chunks),
// (m + p - 1) (F_c + B_c) for GPipe; the second term is the bubble. Gradient buckets become ready evenly during
// the last backward pass of their stage and are reduced one after the other on the network; stage s finishes
// that pass s (B_c) before the end of the pipeline; what runs past T_pipe is exposed. Each stage then runs its
// per-step kernels (optimizer, gradient norm); what the last of them adds is exposed. ZeRO 1/2 then gathers
// the updated parameters (exposed, or hidden behind the next step's first forward with overlapParamGather).
// In the fused variant a (GEMM, collective) pair costs the fused operator's time: its GEMM's layered time counts
// as compute and the rest as exposed tensor-parallel communication; a fused block (moe-ffn, ring-attention) costs its
// operator's time: the layered time of the kernels it replaces counts as compute (less where the operator is faster
// than they are alone) and the rest as exposed expert- or context-parallel communication. The layered variant's
// overlap flags hide
// communication behind compute that runs slower meanwhile (StagePrices::overlapSlowdown; docs/planner.md,
// "Overlap"): tpCommOverlap prices each (GEMM, collective) pair as userbuffers' chunked pipeline, overlapPpComm
// (interleaved schedule) the pipeline sends beside each pass, overlapMoeA2a the all-to-alls beside the other
// micro-batch's compute.
#pragma once

#include <cstdint>
#include <optional>
#include <vector>

#include "mk/workload/lowering.hpp"
#include "mk/workload/workload.hpp"

namespace mk::plan {

/// Prices of one stage's operations.
struct StagePrices {
  std::vector<double> computeUs;  ///< parallel to StageLowering::compute: one kernel
  std::vector<double> commUs;     ///< parallel to StageLowering::comm: one run
  /// Parallel to StageLowering::fused: the fused operator's time for one run. Empty: the layered variant.
  std::vector<double> fusedUs;
  /// Parallel to StageLowering::fusedBlocks in the fused variant (empty: the layered variant): one run of the
  /// block's operator, or nullopt where the block stays layered (its operator cannot express it).
  std::vector<std::optional<double>> blockUs;
  /// Compute beside a communication kernel of layout.overlapSms SMs: how much slower it runs (OverlapModel). The
  /// layered variant's overlap flags (tpCommOverlap, overlapPpComm, overlapMoeA2a) slow the compute they hide
  /// communication behind by it.
  double overlapSlowdown = 1;
};

/// Communication of one parallel dimension on the step's critical path, and what overlap hid.
struct PhaseTime {
  double exposedUs = 0;
  double hiddenUs = 0;
};

/// One step.
struct StepBreakdown {
  double stepUs = 0;
  /// m x compute of one micro-batch on the critical stage (the bubble not included), plus optimizerUs
  double computeUs = 0;
  PhaseTime tp, ep, pp, dp;
  PhaseTime cp;         ///< context parallelism (the p2p ring's hidden part behind attention in hiddenUs)
  double bubbleUs = 0;  ///< (p - 1) / v x (F_c + B_c): idle and fill time of the pipeline
  uint32_t criticalStage = 0;
  double forwardUs = 0, backwardUs = 0;  ///< F_c, B_c: one micro-batch on the critical stage
  double criticalComputeUs = 0;  ///< compute on the step's critical path, bubble included (what stragglers slow)
  double computeGemmUs = 0, computeAttentionUs = 0;  ///< computeUs split by kind
  double computeClassUs[kKernelClasses] = {};        ///< computeUs split by kernel class (KernelClass order)
  double optimizerUs = 0;  ///< the per-step kernels (optimizer, gradient norm) past the gradient reduction
};

/// The step of `step` under `prices` (one entry per stage). Throws Error(InvalidArgument) when the prices do not
/// match the lowering.
StepBreakdown composeStep(const Workload& w, const StepLowering& step, const std::vector<StagePrices>& prices);

}  // namespace mk::plan
