// mkernel — the CPU executor's combine step (combine_exec.hpp; the rule is route.hpp's CombineShape).
#include "combine_exec.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "mk/error.hpp"

namespace mk::detail {

void runCombine(const CombineShape& c, uint64_t live, std::byte* dst, const std::byte* a, const std::byte* ids,
                uint32_t rank, const std::vector<uint32_t>& nodeOf, const std::string& who) {
  const uint64_t slots = c.tokens * c.topk;  // the weights at the bound: the blocks start after them
  auto load = [](const std::byte* base, uint64_t i, auto v) {
    std::memcpy(&v, base + i * sizeof v, sizeof v);
    return v;
  };
  // Where each expert lives (route.hpp: expertRank, nodeOf) and, per node, the block of its lowest expert (Nodes).
  const auto nRanks = static_cast<uint32_t>(nodeOf.size());
  const bool byNode = c.buckets != RouteBuckets::Experts;
  const uint32_t nodes = byNode ? *std::max_element(nodeOf.begin(), nodeOf.end()) + 1 : 0;
  std::vector<uint64_t> nodeBlock(nodes, ~uint64_t{0});
  for (uint32_t r = 0; byNode && r < nRanks; ++r)
    nodeBlock[nodeOf[r]] = std::min<uint64_t>(nodeBlock[nodeOf[r]], uint64_t{r} * (c.experts / nRanks));
  // Every summed term: its weight (or none: a node's partial sum counts once, unweighted) and its row in a.
  constexpr uint64_t kUnweighted = ~uint64_t{0};
  struct Term {
    uint64_t weight, row;
  };
  std::vector<uint64_t> seen(c.experts, 0), nodeSeen(nodes, 0), lastToken(nodes, ~uint64_t{0});
  std::vector<std::vector<Term>> terms(live);
  for (uint64_t t = 0; t < live; ++t)
    for (uint32_t k = 0; k < c.topk; ++k) {
      const uint64_t slot = t * c.topk + k;
      const auto id = load(ids, slot, int32_t{});
      const std::string at =
          who + ": rank " + std::to_string(rank) + " token " + std::to_string(t) + " k " + std::to_string(k);
      if (id < 0 || static_cast<uint64_t>(id) >= c.experts)
        throw Error(ErrorCode::InvalidArgument, at + " names expert " + std::to_string(id) + ", outside [0, " +
                                                    std::to_string(c.experts) + ") (experts)");
      const uint32_t node = byNode ? nodeOf[expertRank(static_cast<uint32_t>(id), c.experts, nRanks)] : 0;
      if (byNode && node != nodeOf[rank]) {
        if (c.buckets == RouteBuckets::OwnNode || lastToken[node] == t) continue;
        lastToken[node] = t;  // Nodes: the node's partial sum for t, once, at t's position in the node's list
        terms[t].push_back({kUnweighted, slots + (nodeBlock[node] * c.tokens + nodeSeen[node]++) * c.row});
        continue;
      }
      if (seen[id] >= c.tokens)
        throw Error(ErrorCode::InvalidArgument, at + ": expert " + std::to_string(id) + " is named more than " +
                                                    std::to_string(c.tokens) + " times (its block's rows)");
      if (!std::isfinite(load(a, slot, float{})))
        throw Error(ErrorCode::InvalidArgument,
                    at + ": weight " + std::to_string(load(a, slot, float{})) + " is not finite (weights)");
      terms[t].push_back({slot, slots + (uint64_t{static_cast<uint32_t>(id)} * c.tokens + seen[id]++) * c.row});
    }
  std::vector<double> acc(c.row);
  for (uint64_t t = 0; t < live; ++t) {
    std::fill(acc.begin(), acc.end(), 0.0);
    for (const Term& term : terms[t]) {
      const double w = term.weight == kUnweighted ? 1.0 : load(a, term.weight, float{});
      for (uint32_t h = 0; h < c.row; ++h) acc[h] += w * load(a, term.row + h, float{});
    }
    for (uint32_t h = 0; h < c.row; ++h) {
      const auto v = static_cast<float>(acc[h]);
      std::memcpy(dst + (t * c.row + h) * sizeof v, &v, sizeof v);
    }
  }
}

}  // namespace mk::detail
