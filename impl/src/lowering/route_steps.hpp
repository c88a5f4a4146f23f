// mkernel — internal: what the lowering checks for the MoE routing steps the resident kernel runs (Route, Gather:
// mk/schedule/route.hpp; the kernel side is kernels/route_ops.cuh). No CUDA.
#pragma once

#include <cstdint>

#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// Elements of a routing step's operands from their offsets (route.hpp's indexedElements): what the lowering encodes.
struct RouteStepSpans {
  uint64_t dst = 0, a = 0, b = 0;
};

/// Check Route step `step` of (rank, lane): int32 ids and layout, topk, experts and capacity >= 1 with a count of
/// whole token rows, lists per expert (across nodes a route's per-node buckets stay on the CPU executor), sizes the
/// kernel's 32-bit entries address, the layout not overlapping the ids, both on the rank itself. Throws Error
/// (InvalidSchedule or Unsupported) naming the step (describeStep) and the field.
RouteStepSpans checkRouteStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step);

/// Check Combine step `step` of (rank, lane): float32 dst and weights / rows (a), int32 ids (b), topk, experts and row
/// >= 1 with a count of whole rows, lists per expert (the per-node sums of a combine across nodes stay on the CPU
/// executor), the experts' counts and one token's positions within the compute kernel's shared memory, every operand
/// on the rank itself, dst overlapping neither source. Throws Error naming the step and the field.
RouteStepSpans checkCombineStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step);

/// Check Gather step `step` of (rank, lane): rows of `aux` elements of one dtype through int32 indices (b), count a
/// whole number of rows, sourceRows (value) >= 1, every operand on the rank itself, dst not overlapping its sources.
RouteStepSpans checkGatherStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step);

}  // namespace mk::runtime
