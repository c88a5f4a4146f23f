// mkernel — internal: the CPU executor's route and gather steps (route.hpp), on bound host memory.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/schedule/route.hpp"

namespace mk::detail {

/// A route step: the int32 ids at `ids` (rs.tokens x rs.topk) -> the int32 layout at `layout` (route.hpp), its
/// lists the buckets routeBucket gives on `rank` of a schedule placed by `nodeOf`. Every id and every list's count
/// is checked first: Error(InvalidArgument) "<who>: ..." naming the rank, the token, k and the id (or the list, its
/// count and the capacity), with nothing written.
void runRoute(const RouteShape& rs, const std::byte* ids, std::byte* layout, uint32_t rank,
              const std::vector<uint32_t>& nodeOf, const std::string& who);

/// A gather step: row r of `dst` <- row index[r] of `src`, for r < rows, rows of `rowBytes` bytes; `index` holds
/// int32 row indices, each in [0, sourceRows). Every index is checked first: Error(InvalidArgument) "<who>: ..."
/// naming the rank, the row and the index, with nothing written.
void runGather(std::byte* dst, const std::byte* src, const std::byte* index, uint64_t rows, uint64_t rowBytes,
               uint64_t sourceRows, uint32_t rank, const std::string& who);

}  // namespace mk::detail
