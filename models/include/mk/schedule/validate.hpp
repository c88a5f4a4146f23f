// mkernel — the schedule validator: every engine may assume what it checks.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk {

struct ValidateOptions {
  /// Also prove the absence of data races: every pair of steps touching overlapping elements of one
  /// (rank, buffer), at least one writing, must be ordered by lane order, flags or barriers.
  /// Cost is O(steps x lanes); skipped automatically above `raceCheckMaxSteps` (validate() says so).
  bool checkRaces = true;
  uint64_t raceCheckMaxSteps = 200000;
};

/// One problem found. `rank`, `lane`, `step` are -1 when the problem is not about one step.
struct ValidationIssue {
  int64_t rank = -1, lane = -1, step = -1;
  std::string message;  ///< starts with describeStep(...) when it is about a step
};

/// All problems found (empty = valid). Checks, in order: structure (sizes, indices, ranks, buffer and
/// gemm indices), per-kind operand rules (Put only to same-node peers, ProxyPut only across nodes,
/// Wait only on own flags, dtype agreement between operands, Gemm dtypes), offsets+count in range,
/// flag accounting (a Wait on a flag nobody signals is dangling; increments never awaited are
/// unmatched; a threshold above the total can never be met), barrier participation, then symbolic
/// execution of all lanes under the flag semantics: any lane left blocked is reported with the flag,
/// the threshold and the largest value it can ever reach; optional race check.
std::vector<ValidationIssue> validateAll(const Schedule& s, const ValidateOptions& opt = {});

/// Throws Error(InvalidSchedule) with the first issue's message (and "(+N more)") if any. Returns "" when the
/// schedule is valid and the race check ran, else why the race check did not run (e.g. "300000 steps > 200000",
/// or over one of its budgets): a caller that says "OK" must say that too.
std::string validate(const Schedule& s, const ValidateOptions& opt = {});

}  // namespace mk
