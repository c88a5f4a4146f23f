// mkernel — all-reduce, ring: a reduce-scatter then an all-gather around the ranks in rank order, K chunks per
// block (docs/algorithms-allreduce.md, "ring").
//
//
// Rank r sends to r+1. At reduce-scatter step s it sends block (r - s): its own input at s = 0, then the
// partial sum it reduced in place in scratch; the reducer's last step (block r + 1) writes the final value
// into output, from where the all-gather forwards it. Every scratch block of a rank is written by its
// predecessor exactly once and then only touched by the rank after the matching Wait: no races.
#include <vector>

#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void setupRing(ScheduleBuilder& b, GenContext& ctx) {
  if (ctx.nRanks == 1) return;
  ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch, ctx.spec.count);
}

void emitRing(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  const uint32_t p = ctx.nRanks;
  if (p == 1) return emitLocalCopy(b, ctx, channel, part);
  ChannelLanes lanes(b, ctx, channel);
  const uint16_t scratch = scratchBuffer(ctx);
  const uint32_t chunks = ctx.opt.chunks;
  auto unit = [&](uint32_t blockIdx, uint32_t k) { return splitRange(splitRange(part, p, blockIdx), chunks, k); };
  // All three flags have a single source lane each (predecessor's sender, own reducer), so running
  // counts in emission order are exact thresholds.
  const uint32_t rsArrived = b.newFlag();
  const uint32_t agArrived = b.newFlag();
  const uint32_t reduced = b.newFlag();
  for (uint32_t r = 0; r < p; ++r) {
    const uint32_t succ = (r + 1) % p;
    // Lanes are looked up at each step so a rank whose pieces are all empty gets no empty lane.
    auto send = [&] { return lanes.to(r, succ); };
    auto red = [&] { return lanes.reducer(r); };
    uint64_t readyIdx = 0, agIdx = 0, rsIdx = 0;
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (r + p - s) % p;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        if (s > 0) b.wait(r, send(), reduced, ++readyIdx);
        const BufRef src = s == 0 ? bufRef(r, ctx.input, u.begin) : bufRef(r, scratch, u.begin);
        b.put(r, send(), bufRef(succ, scratch, u.begin), src, u.size, rsArrived);
      }
    }
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (r + 1 + p - s) % p;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        if (s == 0)
          b.wait(r, send(), reduced, ++readyIdx);
        else
          b.wait(r, send(), agArrived, ++agIdx);
        b.put(r, send(), bufRef(succ, ctx.output, u.begin), bufRef(r, ctx.output, u.begin), u.size, agArrived);
      }
    }
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (r + 2 * p - 1 - s) % p;
      const uint16_t dst = s + 2 < p ? scratch : ctx.output;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        b.wait(r, red(), rsArrived, ++rsIdx);
        b.reduce(r, red(), bufRef(r, dst, u.begin), bufRef(r, scratch, u.begin), bufRef(r, ctx.input, u.begin), u.size);
        b.signal(r, red(), r, reduced);
      }
    }
  }
  // The last all-gather step is not forwarded: the reducer waits for it so the op ends with every block.
  for (uint32_t r = 0; r < p; ++r) waitForAll(b, lanes, r, agArrived);
}

}  // namespace

/// The ring lattice's longest path (docs: "ring"): 2L sends on the slowest lane, or m excursions
/// through the reducers (each R + F instead of K-1 sends), the spare positions on the reducers if a
/// Reduce costs more than a send. `tail` is the price of the lane a path ends on, `nb` how many of the m
/// ranks passed before it send over the network.
PathCounts ringLongest(const UnitPrices& u, uint32_t p, uint32_t groupSize, double k, bool multiNode, bool evenNodes) {
  const Longest longest(&u);
  const double L = double(p - 1) * k;
  const bool allNet = multiNode && groupSize == 1;
  const bool uniform = !multiNode || allNet || !evenNodes;
  const PathCounts tFast = allNet ? netMsg() : nvMsg();
  const PathCounts tSlow = uniform ? (multiNode && !allNet ? longest(nvMsg(), netMsg()) : tFast) : netMsg();
  PathCounts best = 2 * L * longest(tFast, tSlow);
  auto candidate = [&](double m, const PathCounts& last, double nb) {
    const bool spareOnReducer = u.red() > last.value(u);
    const double spare = spareOnReducer ? (double(p) - m) * k - 1 : 0;
    PathCounts passed = uniform ? m * tSlow : nb * netMsg() + (m - nb) * nvMsg();
    return passed + (m + spare) * redMsg() + m * flagHop() + (2 * L - m * k - spare) * last;
  };
  const double g = groupSize;
  for (double m : {1.0, g - 1, g, g + 1, double(p) - g - 1, double(p) - g, double(p) - g + 1, double(p) - 1}) {
    if (m < 1 || m > double(p) - 1) continue;
    if (uniform) {
      best = longest(best, candidate(m, tSlow, 0));
      continue;
    }
    const auto mi = static_cast<uint64_t>(m), gi = static_cast<uint64_t>(g);
    best = longest({best, candidate(m, netMsg(), double(mi / gi)), candidate(m, nvMsg(), double((mi + 1) / gi)),
                    candidate(m, nvMsg(), double((mi + gi - 1) / gi))});
  }
  return best;
}

namespace {

CostEstimate costRing(const CostContext& c) {
  const ClosedFormShape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const Range block0 = splitRange(s.part0, s.p, 0);
  const UnitPrices u = unitPrices(c, splitRange(block0, c.opt.chunks, 0).size, s.nodes > 1, /*ringEdges=*/true);
  const double k = chunkCount(block0.size, c.opt.chunks);
  return estimate(u, ringLongest(u, s.p, s.gMax, k, s.nodes > 1, s.evenNodes),
                  "ring: D + 2(p-1)K*T + max(0, gain(m) for m in {1, G-1, G, G+1, p-G-1, p-G, p-G+1, p-1}), "
                  "gain(m) = m*(R + F) - m*K*T_last + (passed sends) + spare*(R - T_last), piece n/(C*p*K)");
}

}  // namespace

AlgorithmDef allReduceRing() {
  return {CollOp::AllReduce,
          "ring",
          "ring reduce-scatter then ring all-gather over all ranks in rank order, K chunks per step",
          setupRing,
          emitRing,
          costRing};
}

}  // namespace mk::detail
