// mkernel — reduce-scatter, ring: p-1 steps of put + reduce around the ranks in rank order, chunks pipelined
// (docs/algorithms-collectives.md).
#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void setupReduceScatterRing(ScheduleBuilder& b, GenContext& ctx) {
  addScratch(b, ctx, ctx.nRanks > 1 ? ctx.nRanks - 1 : 0);  // slot s: the partial that arrives in step s
}

void emitReduceScatterRing(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint64_t count = ctx.spec.count;
  if (p == 1) {
    localCopy(b, ctx, 0, ch, part.begin, ctx.input, part.begin, part.size);
    return;
  }
  const uint16_t scratch = scratchBuffer(ctx);
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const uint64_t k = chunks.size();
  const uint32_t flag = b.newFlag();
  const std::vector<uint32_t> order = ringOrder(ctx, ch);
  for (uint32_t i = 0; i < p; ++i) {
    const uint32_t r = order[i], next = order[(i + 1) % p];
    const uint32_t lane = b.lane(r, sendRole(ctx, r, next), ch);
    // Step s sends the partial of the block of the rank s + 1 places back in the ring; after p - 1 steps the
    // block of rank r has been through every rank.
    for (uint32_t step = 0; step + 1 < p; ++step) {
      const uint64_t blk = order[(i + 2 * p - step - 1) % p];
      for (uint64_t c = 0; c < k; ++c) {
        const Range piece = chunks[c];
        BufRef src = bufRef(r, ctx.input, blk * count + piece.begin);
        if (step > 0) {
          const BufRef partial = bufRef(r, scratch, (step - 1) * count + piece.begin);
          b.wait(r, lane, flag, (step - 1) * k + c + 1);
          b.reduce(r, lane, partial, partial, src, piece.size);
          src = partial;
        }
        b.put(r, lane, bufRef(next, scratch, step * count + piece.begin), src, piece.size, flag);
      }
    }
    for (uint64_t c = 0; c < k; ++c) {
      const Range piece = chunks[c];
      b.wait(r, lane, flag, (p - 2) * k + c + 1);
      b.reduce(r, lane, bufRef(r, ctx.output, piece.begin), bufRef(r, scratch, (p - 2) * count + piece.begin),
               bufRef(r, ctx.input, r * count + piece.begin), piece.size);
    }
  }
}

CostEstimate costReduceScatterRing(const CostContext& c) {
  const ChunkPrices x(c);
  if (c.gen.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  return x.finish(ringFlowLine(x, true),
                  "t0 + ring flow line of p-1 steps x K chunks: a chunk reduced and sent once it landed, "
                  "(p-1)*K*(max hop price + R) when nothing waits");
}

}  // namespace

AlgorithmDef reduceScatterRing() {
  return {CollOp::ReduceScatter,
          "ring",
          "ring reduce-scatter in rank order, p-1 steps of put + reduce, chunks pipelined",
          setupReduceScatterRing,
          emitReduceScatterRing,
          costReduceScatterRing,
          /*peersTouchUser=*/false};
}

}  // namespace mk::detail
