// mkernel — internal: runtime extents in the lowering (mk/schedule/extent.hpp): which steps the GPU engine runs with
// an extent, and the fields of a LoweredStep that let the resident kernel size such a step when it starts.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/device/engine_device.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// Fill ls.extent / extentBound / extentUnit for step `step` of (rank, lane) (kNoExtentWord for a step without
/// an extent). A sourced extent (read from an int32 element of a buffer, extent.hpp) appends that element's operand
/// (kOperandShift encoding, on this rank) to `sources` and sets ls.extent = kSourcedExtent | its index. Throws
/// Error(Unsupported), naming the step (describeStep) and what is missing, for an extent the GPU engine cannot run:
/// on a ProxyPut (the proxy sizes its commands from its own copy of the schedule; the CPU executor runs it), on an
/// LL / LL128 put (packets are planned statically), a bound above 2^31 - 1; and Error(InvalidSchedule) for an
/// extent index out of range, a count that is not a multiple of the bound, a source that is not an int32 element of
/// the rank's buffer.
void lowerStepExtent(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step, device::LoweredStep& ls,
                     std::vector<uint64_t>* sources);

/// Throws Error(Unsupported) naming the step when Gemm step `step` of (rank, lane) computes a shape with a runtime
/// extent (the tile engine's tile count and tensor maps are fixed when the op is bound).
void requireStaticGemm(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step);

/// ProgramHeader::extentsBinding of rank `rank`'s program: extentWordsBinding when any step of the rank runs with
/// an extent the caller gives (not a sourced one), else kNoExtentWord. Throws Error(Unsupported) when the binding table
/// has no room for it.
uint32_t extentsBindingOf(const Schedule& s, uint32_t rank);

}  // namespace mk::runtime
