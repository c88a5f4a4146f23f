// mkernel — reduce-scatter, direct: every rank puts block j into rank j's scratch; rank j reduces all p in rank
// order (docs/algorithms-collectives.md).
#include <algorithm>

#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void setupReduceScatterDirect(ScheduleBuilder& b, GenContext& ctx) {
  addScratch(b, ctx, ctx.nRanks > 1 ? ctx.nRanks : 0);  // slot s: sender s's copy of my block
}

void emitReduceScatterDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint64_t count = ctx.spec.count;
  if (p == 1) {
    localCopy(b, ctx, 0, ch, part.begin, ctx.input, part.begin, part.size);
    return;
  }
  const uint16_t scratch = scratchBuffer(ctx);
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const auto from = b.newFlags(p);
  for (uint32_t r = 0; r < p; ++r) {
    const std::vector<uint32_t> order = directSendOrder(ctx, r);
    for (const Range& piece : chunks)
      for (const uint32_t j : order) {
        b.put(r, b.lane(r, sendRole(ctx, r, j), ch), bufRef(j, scratch, r * count + piece.begin),
              bufRef(r, ctx.input, j * count + piece.begin), piece.size, from[r]);
      }
  }
  // Rank order 0..p-1 on every destination: the result does not depend on arrival order.
  for (uint32_t j = 0; j < p; ++j) {
    const uint32_t lane = b.lane(j, LaneRole::Compute, ch);
    for (uint64_t c = 0; c < chunks.size(); ++c) {
      const Range piece = chunks[c];
      auto operand = [&](uint32_t s) {
        if (s == j) return bufRef(j, ctx.input, j * count + piece.begin);
        b.wait(j, lane, from[s], c + 1);
        return bufRef(j, scratch, s * count + piece.begin);
      };
      const BufRef out = bufRef(j, ctx.output, piece.begin);
      const BufRef first = operand(0);
      b.reduce(j, lane, out, first, operand(1), piece.size);
      for (uint32_t s = 2; s < p; ++s) b.reduce(j, lane, out, out, operand(s), piece.size);
    }
  }
}

/// Scratch layout of hierarchical reducescatter, in slots of `count` elements: per owned rail rho and node
/// m, one slot per source local index (region A: phase-1 inputs), then per (rho, step) the incoming ring

CostEstimate costReduceScatterDirect(const CostContext& c) {
  const ChunkPrices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  const double p = g.nRanks;
  const double k = x.chunks;
  // The destination reduces chunk by chunk in rank order; source s enters the chain at reduce max(1, s), so
  // p - max(1, s) reduces of that chunk remain after it lands. Its chunk k lands at the latest (k + 1) times
  // its lane's per-chunk work after t0; the chain is linear in k, so only k = 0 and k = K'-1 can be maximal.
  Term best = x.reduce * (k * (p - 1));
  for (uint32_t n = 0; n < g.nNodes(); ++n) {
    const double first = std::max<uint32_t>(1, g.nodeRanks[n].front());
    const double local = g.nodeSize(n) - 1.0;
    const double remote = p - g.nodeSize(n);
    for (double kk : {0.0, k - 1}) {
      const Term tail = x.reduce * (p - first + (k - 1 - kk) * (p - 1));
      if (local > 0) best = maxOf({best, x.nvl * ((kk + 1) * local) + tail});
      if (remote > 0) best = maxOf({best, x.netSends((kk + 1) * remote) + tail});
    }
  }
  return x.finish(best,
                  "t0 + max over nodes n (s_n = max(1, first rank of n)) and k in {1, K} of "
                  "k*(G_n-1)*T_nvl or k*(p-G_n)*T_net, + (p - s_n + (K-k)*(p-1))*R");
}

/// Uneven nodes: owners own different numbers of rails, so rings of one rail advance at different paces and
/// the "ring partials never stall" argument of the equal case fails. The same item recurrence is then
/// evaluated along the ring in (rail, step, chunk) order, which respects every dependency (an owner's items
/// are in that order, and an item needs only the previous step of its rail): E = max(E_prev + (G-1) R,
/// inputs) for the node partial, then max(., E of the ring predecessor) + R for step >= 1, + T_net for
/// step < M-1. Inputs of item j from node-mate x land after x's puts of the earlier rounds and of the

}  // namespace

AlgorithmDef reduceScatterDirect() {
  return {CollOp::ReduceScatter,
          "direct",
          "every rank puts block j into rank j's scratch; rank j reduces all p in rank order",
          setupReduceScatterDirect,
          emitReduceScatterDirect,
          costReduceScatterDirect,
          /*peersTouchUser=*/false};
}

}  // namespace mk::detail
