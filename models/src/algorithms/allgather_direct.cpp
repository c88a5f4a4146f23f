// mkernel — all-gather, direct: every rank puts its block into every peer's output, in staggered order
// (docs/algorithms-collectives.md); the exchange is all-to-all's too (alltoall_direct.cpp).
#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {

void emitDirectExchange(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part, bool allToAll) {
  const uint32_t p = ctx.nRanks;
  const uint64_t count = ctx.spec.count;
  for (uint32_t r = 0; r < p; ++r) {
    const uint64_t srcOff = allToAll ? r * count : 0;
    localCopy(b, ctx, r, ch, r * count + part.begin, ctx.input, srcOff + part.begin, part.size);
  }
  if (p == 1) return;
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const auto from = b.newFlags(p);  // from[s]: increments at the receiver from sender s (one lane of s)
  for (uint32_t r = 0; r < p; ++r) {
    const std::vector<uint32_t> order = directSendOrder(ctx, r);
    for (const Range& piece : chunks)
      for (const uint32_t j : order) {
        const uint64_t srcOff = (allToAll ? j * count : 0) + piece.begin;
        b.put(r, b.lane(r, sendRole(ctx, r, j), ch), bufRef(j, ctx.output, r * count + piece.begin),
              bufRef(r, ctx.input, srcOff), piece.size, from[r]);
      }
  }
  for (uint32_t r = 0; r < p; ++r)
    for (uint32_t i = 1; i < p; ++i) {
      const uint32_t s = (r + p - i) % p;
      b.waitAllSent(r, b.lane(r, recvRole(ctx, s, r), ch), from[s]);
    }
}

namespace {

/// max over ranks of the work of their Intra lane ((G_n - 1) K' chunks) and InterSend lane ((p - G_n) K').
Term directSendTerm(const ChunkPrices& x) {
  const GenContext& g = x.c.gen;
  Term best;
  for (uint32_t n = 0; n < g.nNodes(); ++n) {
    const double local = g.nodeSize(n) - 1.0;
    const double remote = static_cast<double>(g.nRanks - g.nodeSize(n));
    best = maxOf({best, x.nvl * (local * x.chunks), x.netSends(remote * x.chunks)});
  }
  return best;
}

void emitAllGatherDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  emitDirectExchange(b, ctx, ch, part, false);
}

void setupAllGatherDirect(ScheduleBuilder&, GenContext& ctx) { setupPacketPuts(ctx); }

CostEstimate costAllGatherDirect(const CostContext& c) { return packetPriced(c, costDirectExchange); }

}  // namespace

CostEstimate costDirectExchange(const CostContext& c) {
  const ChunkPrices x(c);
  if (c.gen.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  return x.finish(maxOf({x.copy, directSendTerm(x)}),
                  "t0 + max(T_copy, max over nodes of K*(G_n-1)*T_nvl, K*(p-G_n)*T_net)");
}

AlgorithmDef allGatherDirect() {
  return {CollOp::AllGather,
          "direct",
          "every rank puts its block into every peer's output (staggered order)",
          setupAllGatherDirect,
          emitAllGatherDirect,
          costAllGatherDirect};
}

}  // namespace mk::detail
