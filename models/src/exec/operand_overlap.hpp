// mkernel — the CPU executor's rules for operands that share memory (executor.cpp): which overlaps it refuses.
#pragma once

#include <cstdint>

#include "mk/schedule/schedule.hpp"

namespace mk::detail {

/// Same (rank, buffer) and intersecting ranges but not identical: results would depend on the order an engine
/// happens to touch elements in, so the oracle refuses it.
inline bool partialOverlap(const BufRef& x, uint64_t xn, const BufRef& y, uint64_t yn) {
  if (x.rank != y.rank || x.buffer != y.buffer) return false;
  if (x.offset == y.offset && xn == yn) return false;
  return x.offset < y.offset + yn && y.offset < x.offset + xn;
}

/// Same (rank, buffer) and any element in common (empty ranges share none).
inline bool anyOverlap(const BufRef& x, uint64_t xn, const BufRef& y, uint64_t yn) {
  if (x.rank != y.rank || x.buffer != y.buffer || xn == 0 || yn == 0) return false;
  return x.offset < y.offset + yn && y.offset < x.offset + xn;
}

}  // namespace mk::detail
