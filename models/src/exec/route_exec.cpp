// mkernel — the CPU executor's route and gather steps (route_exec.hpp; the layout rule is route.hpp's).
#include "route_exec.hpp"

#include <algorithm>
#include <cstring>
#include <vector>

#include "mk/error.hpp"

namespace mk::detail {
namespace {

int32_t loadInt32(const std::byte* base, uint64_t i) noexcept {
  int32_t v;
  std::memcpy(&v, base + i * sizeof v, sizeof v);
  return v;
}

void storeInt32(std::byte* base, uint64_t i, int32_t v) noexcept { std::memcpy(base + i * sizeof v, &v, sizeof v); }

}  // namespace

void runRoute(const RouteShape& rs, const std::byte* ids, std::byte* layout, uint32_t rank,
              const std::vector<uint32_t>& nodeOf, const std::string& who) {
  const char* unit = rs.buckets == RouteBuckets::Nodes ? " node " : " expert ";
  // Node lists take a token once: lastToken[n] is the token listed last in list n (tokens come in order).
  constexpr uint64_t kNone = ~uint64_t{0};
  std::vector<uint64_t> counts(rs.experts, 0), lastToken(rs.experts, kNone);
  auto forEachEntry = [&](auto&& visit) {
    std::fill(lastToken.begin(), lastToken.end(), kNone);
    for (uint64_t t = 0; t < rs.tokens; ++t)
      for (uint32_t k = 0; k < rs.topk; ++k) {
        const int64_t list = routeBucket(rs, static_cast<uint32_t>(loadInt32(ids, t * rs.topk + k)), rank, nodeOf);
        if (list < 0) continue;
        if (rs.buckets == RouteBuckets::Nodes && lastToken[static_cast<uint64_t>(list)] == t) continue;
        lastToken[static_cast<uint64_t>(list)] = t;
        visit(static_cast<uint32_t>(list), t);
      }
  };
  for (uint64_t t = 0; t < rs.tokens; ++t)
    for (uint32_t k = 0; k < rs.topk; ++k) {
      const int32_t id = loadInt32(ids, t * rs.topk + k);
      if (id < 0 || static_cast<uint64_t>(id) >= rs.experts)
        throw Error(ErrorCode::InvalidArgument, who + ": rank " + std::to_string(rank) + " token " + std::to_string(t) +
                                                    " k " + std::to_string(k) + " names expert " + std::to_string(id) +
                                                    ", outside [0, " + std::to_string(rs.experts) +
                                                    ") (the router's ids must name one of the experts)");
    }
  forEachEntry([&](uint32_t list, uint64_t) { ++counts[list]; });
  for (uint32_t e = 0; e < rs.experts; ++e)
    if (counts[e] > rs.capacity)
      throw Error(ErrorCode::InvalidArgument,
                  who + ": rank " + std::to_string(rank) + " routes " + std::to_string(counts[e]) + " tokens to" +
                      unit + std::to_string(e) + ", above the capacity " + std::to_string(rs.capacity) +
                      " of its token list (the routing overflows the receive capacity; generate the schedule for a "
                      "larger capacity)");
  // Counts first, then each list in token order; entries past its count read -1 (no token).
  for (uint32_t e = 0; e < rs.experts; ++e) storeInt32(layout, e, static_cast<int32_t>(counts[e]));
  for (uint64_t i = 0; i < uint64_t{rs.experts} * rs.capacity; ++i) storeInt32(layout, rs.experts + i, -1);
  std::fill(counts.begin(), counts.end(), 0);
  forEachEntry([&](uint32_t list, uint64_t t) {
    storeInt32(layout, rs.experts + uint64_t{list} * rs.capacity + counts[list]++, static_cast<int32_t>(t));
  });
}

void runGather(std::byte* dst, const std::byte* src, const std::byte* index, uint64_t rows, uint64_t rowBytes,
               uint64_t sourceRows, uint32_t rank, const std::string& who) {
  for (uint64_t r = 0; r < rows; ++r) {
    const int32_t at = loadInt32(index, r);
    if (at < 0 || static_cast<uint64_t>(at) >= sourceRows)
      throw Error(ErrorCode::InvalidArgument, who + ": rank " + std::to_string(rank) + " row " + std::to_string(r) +
                                                  " gathers source row " + std::to_string(at) + ", outside [0, " +
                                                  std::to_string(sourceRows) + ") (sourceRows)");
  }
  for (uint64_t r = 0; r < rows; ++r)
    std::memcpy(dst + r * rowBytes, src + static_cast<uint64_t>(loadInt32(index, r)) * rowBytes,
                static_cast<std::size_t>(rowBytes));
}

}  // namespace mk::detail
