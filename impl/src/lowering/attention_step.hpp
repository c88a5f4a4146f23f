// mkernel — internal: what the lowering checks and records for an Attention step (mk/schedule/attention.hpp) that the
// resident kernel's compute lane runs with the attention engine (mk/device/attention_device.hpp). No CUDA.
#pragma once

#include <cstdint>

#include "mk/device/compute_lane_device.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// An Attention step as the compute lane runs it: its record (operands still 0: the lowering encodes them) and the
/// elements each operand spans from its offset.
struct AttentionStepLowering {
  device::LoweredAttention record{};
  AttentionElements spans;
};

/// Check step `step` of lane `lane` of rank `rank` (an Attention step) against what the engine runs and fill its
/// record for a lane of `ctas` CTAs: the shape index in range (else Error(InvalidSchedule)); the engine's limits
/// (attentionForwardProblem: head dims 64 and 128, bf16 Q and K / V, V 16-byte aligned, TMA's ranges), a float32
/// output, every operand on the rank itself and Q, K / V starting 16-byte aligned in their buffers (else
/// Error(Unsupported)). Every message names the step (describeStep).
AttentionStepLowering lowerAttentionStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, uint32_t ctas);

/// Output tiles (units) of an Attention shape: batch x qHeads x ceil(sq / 128); what a lane could keep busy.
uint64_t attentionUnits(const AttentionShape& sh);

}  // namespace mk::runtime
