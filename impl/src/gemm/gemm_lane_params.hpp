// mkernel — internal: the CUDA-free part of the compute lanes' host side (gemm_lane.hpp): the op-independent
// GemmParams of a lowered Gemm step and the alignment check of its user operands. No CUDA, so the lowering's
// unit tests check the tile engine's loop against the lowering on machines without the toolkit.
#pragma once

#include <cstdint>
#include <vector>

#include "lowering/lowering.hpp"
#include "mk/device/compute_lane_device.hpp"

namespace mk::runtime {

/// The op-independent part of a Gemm step's GemmParams (sizes, tile width, flags, wait budget; no tensor maps,
/// C or report pointer): what the tile engine will loop over. Throws Error(Internal) naming lane and step when
/// the lowered record disagrees with it (tile count, CTAs without a tile, width not 128 / 256).
device::GemmParams gemmLaneParams(const device::LoweredGemm& g, uint64_t waitLimitNs);

/// Budget of a Gemm step's mbarrier waits for a communicator whose pollBudget is `pollBudgetNs`: half of it.
/// No wait inside a step depends on another CTA or rank (only on this CTA's TMA loads and warps), so a
/// stalled step traps, with its report, well before the engine's own budgets (the peers' flag waits, the
/// next op's gate) expire and hide it behind a less precise message.
uint64_t gemmLaneWaitLimitNs(uint64_t pollBudgetNs);

/// Before an op is enqueued: every Gemm and GroupedGemm operand (a GroupedGemm's counts: 4-byte) and every Attention
/// Q and K / V of `program` (rank `rank`) bound to
/// the user's `input` / `output` pointer must start 16-byte aligned (TMA), an Attention output 4-byte aligned. Throws
/// Error(InvalidArgument) naming the operand, lane and step otherwise.
void checkComputeOperands(const LoweredProgram& program, uint32_t rank, const void* input, const void* output);
/// The same with every user buffer's own address: `bases[b]` for buffer b (execute() with bound buffers, fused ops).
void checkComputeOperands(const LoweredProgram& program, uint32_t rank, const std::vector<uint64_t>& bases);

/// Gemm steps of a lowered program (its aux table).
inline uint32_t gemmCount(const LoweredProgram& p) { return p.image.empty() ? 0 : p.header().nGemms; }
/// The aux table of a lowered program's Gemm steps (gemmCount() records).
inline const device::LoweredGemm* loweredGemms(const LoweredProgram& p) {
  return reinterpret_cast<const device::LoweredGemm*>(p.image.data() + p.header().gemmsOffset);
}
/// Attention steps of a lowered program (its second aux table).
inline uint32_t attentionCount(const LoweredProgram& p) { return p.image.empty() ? 0 : p.header().nAttentions; }
inline const device::LoweredAttention* loweredAttentions(const LoweredProgram& p) {
  return reinterpret_cast<const device::LoweredAttention*>(p.image.data() + p.header().attentionsOffset);
}
/// GroupedGemm steps of a lowered program (its third aux table).
inline uint32_t groupedGemmCount(const LoweredProgram& p) { return p.image.empty() ? 0 : p.header().nGroupedGemms; }
inline const device::LoweredGroupedGemm* loweredGroupedGemms(const LoweredProgram& p) {
  return reinterpret_cast<const device::LoweredGroupedGemm*>(p.image.data() + p.header().groupedGemmsOffset);
}
/// Steps of a program that run on a compute lane and need a parameter block per op (Gemm, Attention, GroupedGemm).
inline uint32_t computeStepCount(const LoweredProgram& p) {
  return gemmCount(p) + attentionCount(p) + groupedGemmCount(p);
}

}  // namespace mk::runtime
