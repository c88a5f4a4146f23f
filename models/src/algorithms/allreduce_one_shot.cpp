// mkernel — all-reduce, one-shot: every rank sends its slice to every peer and reduces all p contributions
// itself, in rank order (docs/algorithms-allreduce.md, "one-shot"). Lanes and flags: common.hpp.
#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void setupOneShot(ScheduleBuilder& b, GenContext& ctx) {
  if (ctx.nRanks == 1) return;
  setupPacketPuts(ctx);
  ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch,
                            checkedProduct(ctx.nRanks, ctx.spec.count, "one-shot (nRanks x count)"));
}

void emitOneShot(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  const uint32_t p = ctx.nRanks;
  if (p == 1) return emitLocalCopy(b, ctx, channel, part);
  ChannelLanes lanes(b, ctx, channel);
  const uint16_t scratch = scratchBuffer(ctx);
  const uint64_t count = ctx.spec.count;
  for (uint32_t chunkIdx = 0; chunkIdx < ctx.opt.chunks; ++chunkIdx) {
    const Range c = splitRange(part, ctx.opt.chunks, chunkIdx);
    if (c.size == 0) continue;
    // One flag per chunk: its p-1 increments all carry this chunk, whatever order sources arrive in.
    const uint32_t arrived = b.newFlag();
    for (uint32_t r = 0; r < p; ++r)
      for (uint32_t i = 1; i < p; ++i) {
        const uint32_t peer = (r + i) % p;
        b.put(r, lanes.to(r, peer), bufRef(peer, scratch, uint64_t(r) * count + c.begin), bufRef(r, ctx.input, c.begin),
              c.size, arrived);
      }
    for (uint32_t r = 0; r < p; ++r) {
      const uint32_t red = lanes.reducer(r);
      b.waitAllSent(r, red, arrived);
      // Rank order 0..p-1 on every rank: identical bits everywhere.
      auto x = [&](uint32_t j) {
        return j == r ? bufRef(r, ctx.input, c.begin) : bufRef(r, scratch, uint64_t(j) * count + c.begin);
      };
      reduceChain(b, r, red, bufRef(r, ctx.output, c.begin), p, x, c.size);
    }
  }
}

CostEstimate costOneShotWith(const CostContext& c) {
  const ClosedFormShape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const UnitPrices u = unitPrices(c, splitRange(s.part0, c.opt.chunks, 0).size, s.nodes > 1);
  const Longest longest(&u);
  const double k = chunkCount(s.part0.size, c.opt.chunks);
  // Chunk k has arrived everywhere when both send lanes finished their (k+1)-th round; the reducer then
  // runs p-1 Reduces per chunk: a two-stage flow shop.
  // A network round lands netLands after its lane is done with it: a constant lag of that stage of the shop.
  const PathCounts sendI = double(s.gMax - 1) * nvMsg(), sendX = double(s.p - s.gMin) * netMsg();
  const PathCounts reduce = double(s.p - 1) * redMsg();
  PathCounts path = sendI + reduce + (k - 1) * longest(sendI, reduce);
  if (s.p > s.gMin) path = longest(path, sendX + netLands() + reduce + (k - 1) * longest(sendX, reduce));
  return estimate(
      u, path,
      "one-shot: D + S + R + (K-1)*max(S, R), S = max((G-1)*t_nv, (p-G)*t_net), R = (p-1)*t_red, piece n/(C*K)");
}

CostEstimate costOneShot(const CostContext& c) { return packetPriced(c, costOneShotWith); }

}  // namespace

AlgorithmDef allReduceOneShot() {
  return {CollOp::AllReduce,
          "one-shot",
          "every rank sends its data to every peer and reduces all p contributions in rank order (latency-optimal)",
          setupOneShot,
          emitOneShot,
          costOneShot,
          /*peersTouchUser=*/false};
}

}  // namespace mk::detail
