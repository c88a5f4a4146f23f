// mkernel — internal: the CPU executor's combine step (route.hpp, CombineShape), on bound host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mk/schedule/route.hpp"

namespace mk::detail {

/// A combine step of shape `c`: float32 `dst` (tokens x row) <- per token the weighted sum of its slots' rows in the
/// float32 region `a` (the weights, then the expert blocks), slot (t, k) read from the block ids[t][k] (int32 at
/// `ids`) at its list position. Every id, list position and weight is checked first: Error(InvalidArgument)
/// "<who>: ..." naming the rank, the token, k and the id (or the weight), with nothing written. A weight must be
/// finite (a NaN or infinite router weight would poison the token's every feature); negative ones are summed.
void runCombine(const CombineShape& c, std::byte* dst, const std::byte* a, const std::byte* ids, uint32_t rank,
                const std::string& who);

}  // namespace mk::detail
