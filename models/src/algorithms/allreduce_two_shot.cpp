// mkernel — all-reduce, two-shot: a direct reduce-scatter (rank j owns shard j of the part) then a direct
// all-gather (docs/algorithms-allreduce.md, "two-shot").
//
// Scratch holds p slots (one per source rank); a slot holds, channel after channel, the shard a rank owns.
// Shard 0 of a channel is its largest, so slot offsets computed from shard 0 fit every rank.
#include <map>
#include <vector>

#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

uint64_t twoShotChannelBase(const GenContext& ctx, uint32_t channel) {
  uint64_t base = 0;
  for (uint32_t c = 0; c < channel; ++c)
    base += splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), c), ctx.nRanks, 0).size;
  return base;
}

void setupTwoShot(ScheduleBuilder& b, GenContext& ctx) {
  if (ctx.nRanks == 1) return;
  setupPacketPuts(ctx);
  const uint64_t slot = twoShotChannelBase(ctx, effectiveChannels(ctx));
  ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch,
                            checkedProduct(ctx.nRanks, slot, "two-shot (nRanks x shard)"));
}

void emitTwoShot(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  const uint32_t p = ctx.nRanks;
  if (p == 1) return emitLocalCopy(b, ctx, channel, part);
  ChannelLanes lanes(b, ctx, channel);
  const uint16_t scratch = scratchBuffer(ctx);
  const uint32_t chunks = ctx.opt.chunks;
  const uint64_t slot = twoShotChannelBase(ctx, effectiveChannels(ctx));
  const uint64_t base = twoShotChannelBase(ctx, channel);
  auto shard = [&](uint32_t j) { return splitRange(part, p, j); };
  auto unit = [&](uint32_t j, uint32_t k) { return splitRange(shard(j), chunks, k); };

  // Reduce-scatter: a flag per chunk index (every owner's chunk k counts p-1 arrivals on it).
  std::vector<uint32_t> arrived(chunks, 0);
  for (uint32_t k = 0; k < chunks; ++k) {
    if (unit(0, k).size == 0) continue;  // shard 0 is the largest: empty there means empty everywhere
    arrived[k] = b.newFlag();
    for (uint32_t r = 0; r < p; ++r)
      for (uint32_t i = 1; i < p; ++i) {
        const uint32_t owner = (r + i) % p;
        const Range u = unit(owner, k);
        if (u.size == 0) continue;
        b.put(r, lanes.to(r, owner), bufRef(owner, scratch, uint64_t(r) * slot + base + (u.begin - shard(owner).begin)),
              bufRef(r, ctx.input, u.begin), u.size, arrived[k]);
      }
  }
  const uint32_t reduced = b.newFlag();   // reducer -> own mover/sender, once per chunk, in chunk order
  const uint32_t gathered = b.newFlag();  // all-gather arrivals; awaited once, as a total, at the end
  for (uint32_t j = 0; j < p; ++j) {
    for (uint32_t k = 0; k < chunks; ++k) {
      const Range u = unit(j, k);
      if (u.size == 0) continue;
      const uint32_t red = lanes.reducer(j);
      b.waitAllSent(j, red, arrived[k]);
      auto x = [&](uint32_t src) {
        return src == j ? bufRef(j, ctx.input, u.begin)
                        : bufRef(j, scratch, uint64_t(src) * slot + base + (u.begin - shard(j).begin));
      };
      reduceChain(b, j, red, bufRef(j, ctx.output, u.begin), p, x, u.size);
      b.signal(j, red, j, reduced);
    }
  }
  for (uint32_t j = 0; j < p; ++j) {
    uint64_t ready = 0;
    for (uint32_t k = 0; k < chunks; ++k) {
      const Range u = unit(j, k);
      if (u.size == 0) continue;
      ++ready;
      std::map<uint32_t, bool> waited;  // lane -> already waited for this chunk
      for (uint32_t i = 1; i < p; ++i) {
        const uint32_t peer = (j + i) % p;
        const uint32_t lane = lanes.to(j, peer);
        if (!waited[lane]) {
          b.wait(j, lane, reduced, ready);
          waited[lane] = true;
        }
        b.put(j, lane, bufRef(peer, ctx.output, u.begin), bufRef(j, ctx.output, u.begin), u.size, gathered);
      }
    }
  }
  for (uint32_t r = 0; r < p; ++r) waitForAll(b, lanes, r, gathered);
}

CostEstimate costTwoShotWith(const CostContext& c) {
  const ClosedFormShape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const Range shard0 = splitRange(s.part0, s.p, 0);
  const UnitPrices u = unitPrices(c, splitRange(shard0, c.opt.chunks, 0).size, s.nodes > 1);
  const Longest longest(&u);
  const double k = chunkCount(shard0.size, c.opt.chunks);
  const PathCounts sendI = double(s.gMax - 1) * nvMsg();
  const PathCounts sendX = double(s.p - s.gMin) * netMsg();
  const PathCounts send = longest(sendI, sendX);
  // What the owner waits for: the network round lands netLands after its lane is done with it.
  const PathCounts arrived = s.p > s.gMin ? longest(sendI, sendX + netLands()) : sendI;
  const PathCounts reduce = double(s.p - 1) * redMsg();
  // Each send lane runs its K reduce-scatter rounds, then its K all-gather rounds, round k not before the
  // owner's reduction of chunk k (flow shop of arrivals and reductions) plus the self-signal.
  PathCounts path;
  bool first = true;
  for (const PathCounts* lane : {&sendI, &sendX}) {
    if (lane->value(u) == 0) continue;
    const PathCounts land = lane == &sendX ? netLands() : PathCounts{};  // the lane's last all-gather message
    const PathCounts e =
        longest(2 * k * *lane, arrived + reduce + flagHop() + (k - 1) * longest(send, reduce) + *lane) + land;
    path = first ? e : longest(path, e);
    first = false;
  }
  return estimate(u, path,
                  "two-shot: D + max over send lanes L of max(2K*S_L, S + R + F + (K-1)*max(S, R) + S_L), "
                  "S_nv = (G-1)*t_nv, S_net = (p-G)*t_net, S = max, R = (p-1)*t_red, piece n/(C*p*K)");
}

CostEstimate costTwoShot(const CostContext& c) { return packetPriced(c, costTwoShotWith); }

}  // namespace

AlgorithmDef allReduceTwoShot() {
  return {CollOp::AllReduce,
          "two-shot",
          "direct reduce-scatter (rank j reduces shard j) then direct all-gather (2 hops, bandwidth-optimal)",
          setupTwoShot,
          emitTwoShot,
          costTwoShot};
}

}  // namespace mk::detail
