// mkernel — the CPU reference executor: runs any schedule with one host thread per (rank, lane).
//
// It is the oracle for generators and for the GPU engine: same Schedule, host memory, the flag
// semantics of schedule.hpp. Reduce computes in float and rounds once to the destination dtype
// (round-to-nearest-even), exactly as the GPU engine must.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

/// Host memory for every (rank, buffer) of a schedule: bytes[rank][buffer], sized count * dtypeSize.
struct HostMemory {
  std::vector<std::vector<std::vector<std::byte>>> bytes;

  /// Zero-filled memory shaped for `s`.
  static HostMemory allocate(const Schedule& s);
  template <class T>
  T* as(uint32_t rank, uint16_t buffer) {
    return reinterpret_cast<T*>(bytes[rank][buffer].data());
  }
};

struct ExecOptions {
  /// A wait that sees no progress anywhere for this long fails (a global stall is detected at once).
  std::chrono::milliseconds stallTimeout{10000};
};

/// Run `s` over `mem`. Throws Error(Deadlock) when every unfinished lane is blocked (message: each
/// blocked step with flag, threshold and value seen), Error(Timeout) after stallTimeout without
/// progress, Error(InvalidSchedule) for an out-of-range operand met at run time. The schedule is not
/// validated here: validate() first when it comes from outside.
void execute(const Schedule& s, HostMemory& mem, const ExecOptions& opt = {});

}  // namespace mk
