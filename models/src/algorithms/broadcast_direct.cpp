// mkernel — broadcast, direct: the root puts its buffer into every other rank's output, in staggered order
// (docs/algorithms-collectives.md).
#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void emitBroadcastDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint32_t root = ctx.spec.root;
  localCopy(b, ctx, root, ch, part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const uint32_t flag = b.newFlag();
  for (const Range& piece : chunks)
    for (uint32_t i = 1; i < p; ++i) {
      const uint32_t j = (root + i) % p;
      b.put(root, b.lane(root, sendRole(ctx, root, j), ch), bufRef(j, ctx.output, piece.begin),
            bufRef(root, ctx.input, piece.begin), piece.size, flag);
    }
  for (uint32_t i = 1; i < p; ++i) {
    const uint32_t j = (root + i) % p;
    b.waitAllSent(j, b.lane(j, recvRole(ctx, root, j), ch), flag);
  }
}

CostEstimate costBroadcastDirect(const CostContext& c) {
  const ChunkPrices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  const double local = g.nodeSize(g.nodeOf[c.spec.root]) - 1.0;
  const double remote = g.nRanks - g.nodeSize(g.nodeOf[c.spec.root]);
  return x.finish(maxOf({x.copy, x.nvl * (local * x.chunks), x.netSends(remote * x.chunks)}),
                  "t0 + max(T_copy, K*(G_root-1)*T_nvl, K*(p-G_root)*T_net)");
}

}  // namespace

AlgorithmDef broadcastDirect() {
  return {CollOp::Broadcast,
          "direct",
          "the root puts its buffer into every other rank's output (staggered order)",
          nullptr,
          emitBroadcastDirect,
          costBroadcastDirect};
}

}  // namespace mk::detail
