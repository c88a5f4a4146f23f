// mkernel — internal: the CPU executor's combine step (route.hpp, CombineShape), on bound host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/schedule/route.hpp"

namespace mk::detail {

/// A combine step of shape `c` over its first `live` tokens (c.tokens without a runtime extent): float32 `dst`
/// (live x row) <- per token the weighted sum of its slots' rows in the float32 region `a` (the weights, then the
/// blocks of c.tokens rows), slot (t, k) read from the block ids[t][k] (int32 at `ids`) at its list position, or with
/// c.buckets other than the experts as route.hpp's CombineShape says (`nodeOf`: the schedule's placement, `rank`
/// the executing rank). Every id, list position and weight it reads is checked first: Error(InvalidArgument)
/// "<who>: ..." naming the rank, the token, k and the id (or the weight), with nothing written. A weight must be
/// finite (a NaN or infinite router weight would poison the token's every feature); negative ones are summed.
void runCombine(const CombineShape& c, uint64_t live, std::byte* dst, const std::byte* a, const std::byte* ids,
                uint32_t rank, const std::vector<uint32_t>& nodeOf, const std::string& who);

}  // namespace mk::detail
