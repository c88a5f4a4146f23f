// mkernel tests — rank placements: rank r on node r / perNode.
#pragma once

#include <cstdint>
#include <vector>

namespace mk::test {

inline std::vector<uint32_t> nodesOf(uint32_t nRanks, uint32_t perNode) {
  std::vector<uint32_t> nodeOf(nRanks);
  for (uint32_t r = 0; r < nRanks; ++r) nodeOf[r] = r / perNode;
  return nodeOf;
}

}  // namespace mk::test
