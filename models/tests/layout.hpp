// mkernel tests — rank placements (rank r on node r / perNode) and what a generated schedule holds.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk::test {

inline std::vector<uint32_t> nodesOf(uint32_t nRanks, uint32_t perNode) {
  std::vector<uint32_t> nodeOf(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) nodeOf[r] = r / perNode;
  return nodeOf;
}

/// Steps of `kind` in `s`, over every rank and lane.
inline uint64_t countKind(const Schedule& s, StepKind kind) {
  uint64_t n = 0;
  for (const auto& lanes : s.lanes)
    for (const Lane& l : lanes)
      for (const Step& st : l.steps) n += st.kind == kind;
  return n;
}

/// Steps of `kind` in `s` that move data (count > 0; a proxyput of 0 elements only signals).
inline uint64_t countMoves(const Schedule& s, StepKind kind) {
  uint64_t n = 0;
  for (const auto& lanes : s.lanes)
    for (const Lane& l : lanes)
      for (const Step& st : l.steps) n += st.kind == kind && st.count > 0;
  return n;
}

}  // namespace mk::test
