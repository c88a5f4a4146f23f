// mkernel — the CPU executor's combine step (combine_exec.hpp; the rule is route.hpp's CombineShape).
#include "combine_exec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mk/error.hpp"

namespace mk::detail {

void runCombine(const CombineShape& c, std::byte* dst, const std::byte* a, const std::byte* ids, uint32_t rank,
                const std::string& who) {
  const uint64_t slots = c.tokens * c.topk;
  auto load = [](const std::byte* base, uint64_t i, auto v) {
    std::memcpy(&v, base + i * sizeof v, sizeof v);
    return v;
  };
  // The list position of every slot: the slots naming each expert, counted in row-major order of the ids.
  std::vector<uint64_t> seen(c.experts, 0), rowOf(slots);
  for (uint64_t t = 0; t < c.tokens; ++t)
    for (uint32_t k = 0; k < c.topk; ++k) {
      const uint64_t slot = t * c.topk + k;
      const auto id = load(ids, slot, int32_t{});
      const std::string at =
          who + ": rank " + std::to_string(rank) + " token " + std::to_string(t) + " k " + std::to_string(k);
      if (id < 0 || static_cast<uint64_t>(id) >= c.experts)
        throw Error(ErrorCode::InvalidArgument, at + " names expert " + std::to_string(id) + ", outside [0, " +
                                                    std::to_string(c.experts) + ") (experts)");
      if (seen[id] >= c.tokens)
        throw Error(ErrorCode::InvalidArgument, at + ": expert " + std::to_string(id) + " is named more than " +
                                                    std::to_string(c.tokens) + " times (its block's rows)");
      if (!std::isfinite(load(a, slot, float{})))
        throw Error(ErrorCode::InvalidArgument,
                    at + ": weight " + std::to_string(load(a, slot, float{})) + " is not finite (weights)");
      rowOf[slot] = slots + (uint64_t{static_cast<uint32_t>(id)} * c.tokens + seen[id]++) * c.row;
    }
  std::vector<double> acc(c.row);
  for (uint64_t t = 0; t < c.tokens; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (uint32_t k = 0; k < c.topk; ++k) {
      const uint64_t slot = t * c.topk + k;
      const double w = load(a, slot, float{});
      for (uint32_t h = 0; h < c.row; ++h) acc[h] += w * load(a, rowOf[slot] + h, float{});
    }
    for (uint32_t h = 0; h < c.row; ++h) {
      const auto v = static_cast<float>(acc[h]);
      std::memcpy(dst + (t * c.row + h) * sizeof v, &v, sizeof v);
    }
  }
}

}  // namespace mk::detail
