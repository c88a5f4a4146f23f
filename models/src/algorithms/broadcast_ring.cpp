// mkernel — broadcast, ring: a pipelined chain root -> root+1 -> ..., each rank forwarding chunk k as it
// arrives (docs/algorithms-collectives.md).
#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void emitBroadcastRing(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint32_t root = ctx.spec.root;
  localCopy(b, ctx, root, ch, part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const uint32_t flag = b.newFlag();
  for (uint32_t pos = 0; pos + 1 < p; ++pos) {
    const uint32_t r = (root + pos) % p;
    const uint32_t next = (r + 1) % p;
    const uint32_t lane = b.lane(r, sendRole(ctx, r, next), ch);
    for (uint64_t c = 0; c < chunks.size(); ++c) {
      const Range piece = chunks[c];
      if (pos > 0) b.wait(r, lane, flag, c + 1);
      b.put(r, lane, bufRef(next, ctx.output, piece.begin), bufRef(r, pos == 0 ? ctx.input : ctx.output, piece.begin),
            piece.size, flag);
    }
  }
  const uint32_t last = (root + p - 1) % p;
  b.waitAllSent(last, b.lane(last, recvRole(ctx, (last + p - 1) % p, last), ch), flag);
}

CostEstimate costBroadcastRing(const CostContext& c) {
  const ChunkPrices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  // A flow line of p-1 hops over K' chunks: every hop once, plus K'-1 more times the slowest hop.
  Term sum, slowest;
  for (uint32_t pos = 0; pos + 1 < g.nRanks; ++pos) {
    const uint32_t r = (c.spec.root + pos) % g.nRanks;
    const bool near = g.sameNode(r, (r + 1) % g.nRanks);
    const Term hop = near ? x.nvl : x.netRing;
    sum = sum + hop + (near ? Term{} : x.netLand);  // the next rank forwards a chunk once it has landed
    slowest = maxOf({slowest, hop});
  }
  return x.finish(maxOf({x.copy, sum + slowest * (x.chunks - 1)}),
                  "t0 + max(T_copy, sum over the p-1 hops of T_hop + (K-1)*max T_hop)");
}

}  // namespace

AlgorithmDef broadcastRing() {
  return {CollOp::Broadcast,
          "ring",
          "pipelined chain root -> root+1 -> ..., each rank forwards chunk k on arrival",
          nullptr,
          emitBroadcastRing,
          costBroadcastRing};
}

}  // namespace mk::detail
