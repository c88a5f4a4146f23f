// The arithmetic of the device arena's bump allocator (device/device_arena.hpp): alignment, exhaustion
// without side effects, and the edges. The CUDA side is covered by the GPU case in test_arena_gpu.cpp.
#include <doctest/doctest.h>

#include <cstdint>
#include <limits>

#include "device/device_arena.hpp"

namespace {
constexpr uint64_t kNone = std::numeric_limits<uint64_t>::max();
}

TEST_CASE("device arena: buffers are carved in order at 256-byte boundaries") {
  mk::ArenaCursor c(4096);
  CHECK(c.take(1) == 0);
  CHECK(c.used() == 1);
  CHECK(c.take(300) == 256);
  CHECK(c.used() == 556);
  CHECK(c.take(256) == 768);
  CHECK(c.take(1) == 1024);
  for (uint64_t off : {c.take(17), c.take(1000), c.take(2)}) CHECK(off % mk::ArenaCursor::kAlign == 0);
}

TEST_CASE("device arena: a request that does not fit changes nothing and the rest still fits") {
  mk::ArenaCursor c(1024);
  CHECK(c.take(700) == 0);
  CHECK(c.take(300) == kNone);  // 768 + 300 > 1024
  CHECK(c.used() == 700);
  CHECK(c.take(256) == 768);  // exactly to the end
  CHECK(c.used() == 1024);
  CHECK(c.take(1) == kNone);
}

TEST_CASE("device arena: zero bytes an empty arena and huge requests are refused") {
  mk::ArenaCursor empty;
  CHECK(empty.capacity() == 0);
  CHECK(empty.take(1) == kNone);
  mk::ArenaCursor c(1 << 20);
  CHECK(c.take(0) == kNone);
  CHECK(c.take(kNone) == kNone);
  CHECK(c.take(uint64_t{1} << 63) == kNone);
  CHECK(c.take(1 << 20) == 0);
  CHECK(c.used() == (1u << 20));
}
