// mkernel — all-gather, hierarchical: every block crosses the network once, to the owner of its rail on every
// other node, which forwards it over NVLink (docs/algorithms-collectives.md).
#include <vector>

#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void emitAllGatherHierarchical(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint32_t nodes = ctx.nNodes();
  const uint64_t count = ctx.spec.count;
  for (uint32_t r = 0; r < p; ++r) localCopy(b, ctx, r, ch, r * count + part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const auto from = b.newFlags(p);  // from[s]: blocks put by rank s (phase 1 remote, phase 2 same node)
  // Phase 1: every rank sends its block over its rail to the rail's owner on every other node.
  for (uint32_t r = 0; r < p && nodes > 1; ++r) {
    const uint32_t n = ctx.nodeOf[r];
    const uint32_t lane = b.lane(r, LaneRole::InterSend, ch);
    for (uint32_t i = 1; i < nodes; ++i) {
      const uint32_t target = railOwner(ctx, (n + i) % nodes, ctx.localIndex[r]);
      for (const Range& piece : chunks)
        b.put(r, lane, bufRef(target, ctx.output, r * count + piece.begin), bufRef(r, ctx.input, piece.begin),
              piece.size, from[r]);
    }
  }
  // Phase 2: every owner hands its own block, then every block of its rails as it arrives, to its node.
  for (uint32_t o = 0; o < p; ++o) {
    const uint32_t n = ctx.nodeOf[o];
    const auto peers = localPeers(ctx, o);
    const uint32_t lane = b.lane(o, LaneRole::Intra, ch);
    for (const Range& piece : chunks)
      for (uint32_t y : peers)
        b.put(o, lane, bufRef(y, ctx.output, o * count + piece.begin), bufRef(o, ctx.input, piece.begin), piece.size,
              from[o]);
    for (uint32_t g : railsOf(ctx, o))
      for (uint32_t i = 1; i < nodes; ++i) {
        const uint32_t m = (n + nodes - i) % nodes;  // arrival order: node n - 1 puts to us first
        if (ctx.nodeRanks[m].size() <= g) continue;  // that node has no rank with local index g
        const uint32_t src = ctx.nodeRanks[m][g];
        for (uint64_t c = 0; c < chunks.size(); ++c) {
          const Range piece = chunks[c];
          b.wait(o, lane, from[src], c + 1);
          for (uint32_t y : peers)
            b.put(o, lane, bufRef(y, ctx.output, src * count + piece.begin),
                  bufRef(o, ctx.output, src * count + piece.begin), piece.size, from[o]);
        }
      }
  }
  for (uint32_t x = 0; x < p; ++x)
    for (uint32_t o : localPeers(ctx, x)) b.waitAllSent(x, b.lane(x, LaneRole::Intra, ch), from[o]);
}

CostEstimate costAllGatherHierarchical(const CostContext& c) {
  const ChunkPrices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  const uint32_t nodes = g.nNodes();
  const double k = x.chunks;
  Term best = maxOf({x.copy, x.netSends((nodes - 1.0) * k)});  // the inter-send lanes: (M-1) K' proxy puts
  // An owner's Intra lane hands out its own block (K' chunks of D = (G-1) T_nvl), then forwards J remote
  // chunks, chunk j taking D from max(its arrival a_j, the previous one's end): a two-stage flow line, so it
  // ends at max(K'D + J D, max_j a_j + (J - j) D). Every sender's inter lane only puts, so a_j is exact:
  // the block from node n - i is its sender's i-th target, chunk k lands at ((i-1) K' + k + 1) T_net.
  if (shapeOf(c).evenNodes) {
    const Term d = x.nvl * (g.maxLocal - 1.0);
    const double j = (nodes - 1.0) * k;  // a_j grows by T_net and j by 1: the max is at j = 0 or J-1
    best = maxOf({best, d * (k + j)});
    if (nodes > 1) best = maxOf({best, x.net + x.netLand + d * j, x.net * j + x.netLand + d});
    return x.finish(best,
                    "t0 + max(T_copy, J*T_net, K*D + J*D, T_net + J*D, J*T_net + D) with D = (G-1)*T_nvl, "
                    "J = (M-1)*K remote chunks per owner");
  }
  for (uint32_t o = 0; o < g.nRanks; ++o) {
    const uint32_t n = g.nodeOf[o];
    std::vector<double> arrivals;  // in units of T_net, in the order the owner forwards them
    for (uint32_t rail : railsOf(g, o))
      for (uint32_t i = 1; i < nodes; ++i)
        if (g.nodeSize((n + nodes - i) % nodes) > rail)
          for (double kk = 0; kk < k; kk += 1) arrivals.push_back((i - 1.0) * k + kk + 1);
    const double total = static_cast<double>(arrivals.size());
    const Term d = x.nvl * (g.nodeSize(n) - 1.0);
    best = maxOf({best, d * (k + total)});
    for (std::size_t j = 0; j < arrivals.size(); ++j)
      best = maxOf({best, x.net * arrivals[j] + x.netLand + d * (total - static_cast<double>(j))});
  }
  return x.finish(best,
                  "t0 + max(T_copy, (M-1)*K*T_net, max over owners of max(K*D + J*D, max_j a_j*T_net + (J-j)*D)) "
                  "with D = (G_n-1)*T_nvl, J the owner's remote chunks, a_j = (i-1)*K + k + 1 for chunk k of the "
                  "block from node n-i");
}

}  // namespace

AlgorithmDef allGatherHierarchical() {
  return {CollOp::AllGather,
          "hierarchical",
          "rails: each block crosses the network once to its rail owner per node, which forwards it over NVLink",
          nullptr,
          emitAllGatherHierarchical,
          costAllGatherHierarchical};
}

}  // namespace mk::detail
