// mkernel — internal: the CPU executor's bound operands, and the steps that only compute on them (step_exec.cpp).
// The executor (executor.cpp) owns the threads, the flags and the barriers; what a step computes from its
// operands — reduce, gemm, route, gather, combine, attention, attention-grad — needs only the operands, checked
// against the bound host memory, and the runtime extents: this class.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/exec/executor.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::detail {

/// A bound (rank, buffer): what every operand check and access needs, in one place.
struct BoundBuffer {
  std::byte* data = nullptr;
  uint64_t count = 0;
  DType dtype = DType::Float32;
};

/// Which step is running: what an error names.
struct StepAt {
  uint32_t rank = 0, lane = 0, step = 0;
};

/// The schedule's buffers bound to host memory, and the checks every operand goes through.
class StepOperands {
 public:
  StepOperands(const Schedule& s, const ExtentValues& extents) : s_(s), extents_(extents) {}

  /// Bind every (rank, buffer) to `mem` (a rank another process runs has no bytes: null data).
  void bind(HostMemory& mem);

  const Schedule& schedule() const noexcept { return s_; }
  std::size_t buffers() const noexcept { return nBuffers_; }
  const BoundBuffer& bound(uint32_t rank, std::size_t buffer) const { return bound_[rank * nBuffers_ + buffer]; }

  /// Error(InvalidSchedule) naming the step.
  [[noreturn]] void invalid(const StepAt& at, const std::string& what) const;

  /// The bound buffer of `ref`, after checking that [offset, offset + extent) lies inside it.
  const BoundBuffer& operand(const StepAt& at, const char* name, const BufRef& ref, uint64_t extent) const;

  /// Value of extent `e` (an index in range) for the step: read from its source on the executing rank when it has
  /// one, else the caller's (ExecOptions::extents). A source value outside [0, bound] is refused.
  uint64_t extentAt(const StepAt& at, uint32_t e) const;

 private:
  const Schedule& s_;
  const ExtentValues& extents_;
  std::size_t nBuffers_ = 0;
  std::vector<BoundBuffer> bound_;  ///< [rank * nBuffers_ + buffer]
};

// What a step computes from its operands (step_exec.cpp); each checks its operands first (Error(InvalidSchedule)
// naming the step). Counts are resolved against the step's runtime extent by the caller.
void reduceStep(const StepOperands& o, const StepAt& at, const Step& st);
/// One Gemm (a GroupedGemm calls it per group); `scratchA` / `scratchB` are the lane's reused tiles.
void gemmStep(const StepOperands& o, const StepAt& at, const Step& st, std::vector<float>& scratchA,
              std::vector<float>& scratchB);
void routeStep(const StepOperands& o, const StepAt& at, const Step& st);
void gatherStep(const StepOperands& o, const StepAt& at, const Step& st);
/// A combine over its first `live` tokens (extent.hpp: its runtime extent's; its blocks keep the bound's rows).
void combineStep(const StepOperands& o, const StepAt& at, const Step& st, uint64_t live);
void attentionStep(const StepOperands& o, const StepAt& at, const Step& st);
void attentionGradStep(const StepOperands& o, const StepAt& at, const Step& st);

}  // namespace mk::detail
