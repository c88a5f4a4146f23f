// mkernel — internal: lower one rank's packed schedule into the program the resident kernel runs.
//
// "Lower once on the host": everything the kernel would otherwise re-derive per step is decided here —
// operand addresses as (binding, byte offset), which CTAs of a lane move data, where a lane's CTAs must
// meet because one CTA reads what another wrote, the cumulative lane-sync targets, and which steps touch
// a peer's user buffers (and so must wait until that peer has entered the op). Pure C++: no CUDA, so it
// is unit-tested on machines without a GPU.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/device/engine_device.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// How to lower.
struct LowerOptions {
  uint32_t nWorkers = 64;               ///< worker CTAs of the resident kernel
  uint64_t minBytesPerCta = 32 * 1024;  ///< a data step gets one more CTA per this many bytes
};

/// A buffer of the schedule as the runtime binds it.
struct BufferLayout {
  BufferKind kind = BufferKind::Scratch;
  DType dtype = DType::Float32;
  std::vector<uint64_t> count;  ///< elements on each rank
  uint64_t scratchOffset = 0;   ///< byte offset in the scratch arena (Scratch buffers)
};

/// One rank's lowered program plus what the host needs to bind it.
struct LoweredProgram {
  std::vector<uint8_t> image;  ///< ProgramHeader, LoweredLane[], LoweredStep[], CtaAssignment[]
  uint32_t rank = 0, nRanks = 0;
  uint32_t nLanes = 0, nFlags = 0, nBarriers = 0, nSyncPoints = 0;
  std::vector<BufferLayout> buffers;
  uint64_t scratchBytes = 0;   ///< arena bytes per slot this schedule needs on every rank
  uint32_t activeWorkers = 0;  ///< worker CTAs that run a lane (the rest idle through the op)

  const device::ProgramHeader& header() const noexcept {
    return *reinterpret_cast<const device::ProgramHeader*>(image.data());
  }
  const device::LoweredLane* lanes() const noexcept {
    return reinterpret_cast<const device::LoweredLane*>(image.data() + header().lanesOffset);
  }
  const device::LoweredStep* steps() const noexcept {
    return reinterpret_cast<const device::LoweredStep*>(image.data() + header().stepsOffset);
  }
  const device::CtaAssignment* ctas() const noexcept {
    return reinterpret_cast<const device::CtaAssignment*>(image.data() + header().ctasOffset);
  }
};

/// Lower rank `rank`'s lanes of `s`. Throws Error(Unsupported) for steps this engine cannot run yet
/// (ProxyPut, Gemm, ranks on several nodes) or limits it does not have (too many ranks, lanes, flags,
/// barriers, bindings) or runtime extents it cannot size on the device (lowering/extents.hpp),
/// Error(InvalidSchedule) naming rank, lane and step for an operand out of range, a wait on another rank's flag or
/// operands of different dtypes.
LoweredProgram lowerRank(const Schedule& s, uint32_t rank, const LowerOptions& opt = {});

/// Lower from the packed form (what packRank() produces for `rank`): unpack, then lowerRank().
LoweredProgram lowerPacked(const std::vector<uint8_t>& packedRankImage, uint32_t rank, const LowerOptions& opt = {});

}  // namespace mk::runtime
