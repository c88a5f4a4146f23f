// The default chunks and channels per (collective, algorithm, size): the measured table of gen_defaults.hpp.
#include <doctest/doctest.h>

#include "engine/gen_defaults.hpp"

using mk::CollOp;
using mk::runtime::defaultGenOptions;

namespace {
constexpr uint64_t MiB = uint64_t{1} << 20;
uint32_t chunks(CollOp op, const char* algo, uint64_t bytes, uint32_t n = 2) {
  return defaultGenOptions(op, algo, bytes, n).chunks;
}
}  // namespace

TEST_CASE("gen defaults: chunks grow with size, one channel") {
  CHECK(chunks(CollOp::AllReduce, "one-shot", 8) == 1);
  CHECK(chunks(CollOp::AllReduce, "one-shot", MiB - 1) == 1);
  CHECK(chunks(CollOp::AllReduce, "one-shot", MiB) == 2);
  CHECK(chunks(CollOp::AllReduce, "one-shot", 4 * MiB) == 4);
  CHECK(chunks(CollOp::AllReduce, "one-shot", 64 * MiB) == 8);
  CHECK(chunks(CollOp::AllReduce, "one-shot", 512 * MiB) == 8);
  CHECK(chunks(CollOp::ReduceScatter, "direct", 512 * MiB) == 8);
  CHECK(chunks(CollOp::AllGather, "ring", 512 * MiB) == 8);
  CHECK(defaultGenOptions(CollOp::AllReduce, "two-shot", 512 * MiB, 2).channels == 1);
}

TEST_CASE("gen defaults: two-shot all-reduce cuts its shard into pieces of about 16 MiB, 2 to 4 of them, never more than the general rule") {
  CHECK(chunks(CollOp::AllReduce, "two-shot", 8) == 1);         // the general rule caps it
  CHECK(chunks(CollOp::AllReduce, "two-shot", MiB) == 2);
  CHECK(chunks(CollOp::AllReduce, "two-shot", 16 * MiB) == 2);
  CHECK(chunks(CollOp::AllReduce, "two-shot", 32 * MiB) == 2);  // shard 16 MiB: at least 2
  CHECK(chunks(CollOp::AllReduce, "two-shot", 64 * MiB) == 2);
  CHECK(chunks(CollOp::AllReduce, "two-shot", 128 * MiB) == 4);
  CHECK(chunks(CollOp::AllReduce, "two-shot", 512 * MiB) == 4);  // at most 4
  CHECK(chunks(CollOp::AllReduce, "two-shot", 128 * MiB, 8) == 2);  // 8 ranks: 16 MiB shards
  CHECK(chunks(CollOp::AllReduce, "two-shot", 512 * MiB, 0) == 4);  // no rank count: treated as one
}
