// mkernel — several instances of one schedule running at the same time on disjoint ranks, as one schedule
// (the planner simulates concurrent groups, e.g. the data-parallel all-reduce of every tensor-parallel rank, in
// one replay so that they share NICs and fabric links the way they do on the cluster).
#pragma once

#include <cstdint>
#include <vector>

#include "mk/schedule/schedule.hpp"

namespace mk::plan {

/// `part` copied once per entry of `maps`: copy i's rank j becomes rank maps[i][j] of the result, which has
/// nodeOf.size() ranks on the nodes nodeOf says. Every rank of the result must be the image of exactly one
/// (copy, rank) pair. Flags stay per rank; buffers keep their names, each rank its part-rank's count; Gemm shapes
/// are shared. Throws Error(InvalidArgument) for maps that do not partition the ranks, Error(Unsupported) for
/// a part with barriers (a barrier joins every rank of a schedule, which a copy does not mean).
Schedule embedConcurrent(const Schedule& part, const std::vector<std::vector<uint32_t>>& maps,
                         const std::vector<uint32_t>& nodeOf);

}  // namespace mk::plan
