// mkernel — all-gather, ring: p-1 steps around the ranks in rank order, each forwarding the block received
// last, chunks pipelined (docs/algorithms-collectives.md).
#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void emitAllGatherRing(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint64_t count = ctx.spec.count;
  for (uint32_t r = 0; r < p; ++r) localCopy(b, ctx, r, ch, r * count + part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const uint64_t k = chunks.size();
  const uint32_t flag = b.newFlag();
  const std::vector<uint32_t> order = ringOrder(ctx, ch);
  for (uint32_t i = 0; i < p; ++i) {
    const uint32_t r = order[i], next = order[(i + 1) % p];
    const uint32_t lane = b.lane(r, sendRole(ctx, r, next), ch);
    for (uint32_t step = 0; step + 1 < p; ++step) {
      // Step s forwards the block of the rank s places back in the ring: the own block first, then what arrived
      // from the predecessor in step s - 1.
      const uint64_t blk = order[(i + p - step) % p];
      for (uint64_t c = 0; c < k; ++c) {
        const Range piece = chunks[c];
        if (step > 0) b.wait(r, lane, flag, (step - 1) * k + c + 1);
        const BufRef src =
            step == 0 ? bufRef(r, ctx.input, piece.begin) : bufRef(r, ctx.output, blk * count + piece.begin);
        b.put(r, lane, bufRef(next, ctx.output, blk * count + piece.begin), src, piece.size, flag);
      }
    }
    b.wait(r, lane, flag, (p - 1) * k);  // the last block, which is not forwarded
  }
}

/// Every rank sends one block to every peer (allgather: its input; alltoall: its input block j to rank j),

CostEstimate costAllGatherRing(const CostContext& c) {
  const ChunkPrices x(c);
  if (c.gen.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  return x.finish(maxOf({x.copy, ringFlowLine(x, false)}),
                  "t0 + max(T_copy, ring flow line of p-1 steps x K chunks: a chunk forwarded once it landed; "
                  "(p-1)*K*max hop price when nothing waits)");
}

}  // namespace

AlgorithmDef allGatherRing() {
  return {CollOp::AllGather,
          "ring",
          "ring in rank order, p-1 steps forwarding the block received last, chunks pipelined",
          nullptr,
          emitAllGatherRing,
          costAllGatherRing};
}

}  // namespace mk::detail
