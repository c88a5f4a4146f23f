// mkernel — internal: the checks of a fused call (Communicator::gemmReduceScatter, allGatherGemm, gemmAllReduce)
// made before anything is generated, bound or enqueued. Pure C++ (no CUDA): unit-tested without a GPU.
#pragma once

#include <cstdint>

#include "mk/algorithms/fused.hpp"
#include "mk/cost/cost.hpp"
#include "mk/topology/topology.hpp"

namespace mk::runtime {

/// Elements of a rank's a, b and c (docs/fused-operators.md, "Buffers"; dense: lda = the row length).
struct FusedOperandCounts {
  uint64_t a = 0, b = 0, c = 0;
};
FusedOperandCounts fusedOperandCounts(const FusedSpec& spec, uint32_t nRanks, uint32_t rank);

/// What a fused call on a communicator of `nRanks` ranks, whose resident kernels have `workers` worker CTAs each,
/// runs: planFused with ctas = workers. Refuses, with Error naming the op and what to change:
///  * a communicator without compute lanes (`computeLanes` false; Unsupported);
///  * the spec's bad input (validateFusedSpec: InvalidArgument naming the dimension and its divisor);
///  * a dtype the GPU tile engine does not take: bfloat16 only (float16 runs on the CPU executor; Unsupported);
///  * opt.ctas other than 0 or `workers` (the split divides the resident kernel's workers; InvalidArgument);
///  * a split that leaves the compute lane or a communication lane without CTAs (generate()'s check).
FusedPlan planFusedCall(const FusedSpec& spec, const FusedOptions& opt, const Topology& topo, uint32_t nRanks,
                        const Profile& profile, uint32_t workers, bool computeLanes);

/// The operands of rank `rank`: a, b and c non-null and 16-byte aligned (the tile engine's TMA), and c overlapping
/// neither a nor b (the output is written while the inputs are read). Throws Error(InvalidArgument) naming the
/// operand.
void checkFusedOperands(const FusedSpec& spec, uint32_t nRanks, uint32_t rank, const void* a, const void* b,
                        const void* c);

}  // namespace mk::runtime
