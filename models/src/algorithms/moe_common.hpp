// mkernel — internal: what the MoE generators (moe_dispatch_gemm.cpp, moe_ffn.cpp) share about a placement across
// nodes: the ranks of each node, the relay of a (source, node) pair and the dispatch's flags.
#pragma once

#include <algorithm>
#include <cstdint>
#include <map>
#include <vector>

namespace mk::gen {

/// Where every rank sits: the ranks of each node in rank order and each rank's index among them; the relay of a
/// (source, node) pair is DeepEP's choice, the node's rank with the source's local index, wrapping where the node has
/// fewer ranks. The combine across nodes (moe-ffn) sums on the same relay that forwarded the tokens.
struct MoePlacement {
  std::map<uint32_t, std::vector<uint32_t>> ranksOf;  ///< node id -> its ranks, ascending
  std::vector<uint32_t> local;                        ///< [rank]: its index in ranksOf[its node]
  uint32_t widest = 0;                                ///< the most ranks on one node

  explicit MoePlacement(const std::vector<uint32_t>& nodeOf) : local(nodeOf.size()) {
    for (uint32_t r = 0; r < nodeOf.size(); ++r) {
      local[r] = static_cast<uint32_t>(ranksOf[nodeOf[r]].size());
      ranksOf[nodeOf[r]].push_back(r);
      widest = std::max<uint32_t>(widest, local[r] + 1);
    }
  }
  const std::vector<uint32_t>& on(uint32_t node) const { return ranksOf.at(node); }
  uint32_t relay(uint32_t src, uint32_t node) const { return on(node)[local[src] % on(node).size()]; }
  /// Whether the ranks span more than one node.
  bool multiNode() const noexcept { return widest < local.size(); }
};

/// The flags of moe-dispatch-gemm on R ranks: 0 counts arrived (R: one per source); 1 + s blocks of source s arrived
/// (E); R + 1 routed and R + 2 gathered for the network lane (own rank only); across nodes R + 3 + s: source s's
/// count, rows and ids reached its relay (3). moe-ffn's come after them.
struct MoeDispatchFlags {
  uint32_t R;
  uint32_t counts() const noexcept { return 0; }
  uint32_t blocks(uint32_t src) const noexcept { return 1 + src; }
  uint32_t routed() const noexcept { return R + 1; }
  uint32_t gathered() const noexcept { return R + 2; }
  uint32_t relay(uint32_t src) const noexcept { return R + 3 + src; }
  uint32_t total(bool multiNode) const noexcept { return multiNode ? 2 * R + 3 : R + 3; }
};

}  // namespace mk::gen
