// mkernel — the one range check: does [offset, offset + length) lie inside a region of `size` units?
//
// Every check of a put, a remote write or an operand against the memory it lands in goes through rangeInside():
// the obvious `offset + length <= size` wraps for an offset or a length near 2^64 (a put at offset 2^64 - 16 of 32
// bytes "ends" at 16) and lets a peer write before the region. Header-only and dependency-free, so the CUDA-free
// host code (impl/, mk_host), the engine and models/ all include it.
#pragma once

#include <cstdint>
#include <string>

namespace mk {

/// True when [offset, offset + length) lies inside [0, size): no unit before 0 or at or past `size`, computed
/// without the sum (so it cannot wrap). A zero-length range is inside when offset <= size (it touches nothing, and
/// a range that ends exactly at the region's end is still inside). Units are whatever the caller counts: bytes or
/// elements, the same for all three.
constexpr bool rangeInside(uint64_t offset, uint64_t length, uint64_t size) noexcept {
  return length <= size && offset <= size - length;
}

/// "[offset, +length)": how an error names a range, without its end (which may not exist in 64 bits).
inline std::string rangeText(uint64_t offset, uint64_t length) {
  return "[" + std::to_string(offset) + ", +" + std::to_string(length) + ")";
}

}  // namespace mk
