// mkernel — internal: what the lowering checks and records for a GroupedGemm step (a MoE layer's expert GEMMs,
// mk/schedule/step_kind.hpp) that the resident kernel's compute lane runs with the grouped GEMM engine
// (mk/device/grouped_gemm_device.hpp). No CUDA.
#pragma once

#include <cstdint>

#include "mk/device/compute_lane_device.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// A GroupedGemm step as the compute lane runs it: its record (operands still 0: the lowering encodes them), the
/// elements each operand spans from its offset, and where group 0's row count lives (`counted` false: every group
/// at its bound, no runtime extent).
struct GroupedGemmStepLowering {
  device::LoweredGroupedGemm record{};
  uint64_t cSpan = 0, aSpan = 0, bSpan = 0;
  bool counted = false;
  BufRef counts;  ///< int32 element holding group 0's rows (groups' counts are the next elements), when counted
};

/// Check step `step` of lane `lane` of rank `rank` (a GroupedGemm) against what the engine runs and fill its record
/// for a lane of `ctas` CTAs. Error(InvalidSchedule): gemm indices outside the schedule's shapes. Error(Unsupported),
/// naming the step (describeStep) and what to change: groups outside [1, 1024]; groups of different shapes (m, n, k,
/// lda, ldb, ldc); accumulation; A or B not bfloat16, C not bfloat16 or float32; an operand on another rank or not
/// 16-byte aligned; a leading dimension below its minimum or not a multiple of 8; an odd n with SwiGLU; groups whose
/// rows are runtime extents other than int32 elements of one buffer, group h's at the first one's element + h, bound
/// m (what the engine reads as a count array), or some groups with one and some without; sizes past the engine's
/// 32-bit rows and tiles.
GroupedGemmStepLowering lowerGroupedGemmStep(const Schedule& s, uint32_t rank, uint32_t lane, uint32_t step,
                                             uint32_t ctas);

/// Output tiles of a GroupedGemm step at its bound (128 x 128 tiles, every group at m rows): what a lane could keep
/// busy; 1 for a step whose gemm indices are out of range.
uint64_t groupedGemmTiles(const Schedule& s, const Step& st);

}  // namespace mk::runtime
