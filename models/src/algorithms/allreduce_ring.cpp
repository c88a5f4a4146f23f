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
  // Blocks are numbered by ring position (any numbering covers the data once); ranks follow ringOrder.
  const std::vector<uint32_t> order = ringOrder(ctx, channel);
  for (uint32_t i = 0; i < p; ++i) {
    const uint32_t r = order[i], succ = order[(i + 1) % p];
    // Lanes are looked up at each step so a rank whose pieces are all empty gets no empty lane.
    auto send = [&] { return lanes.to(r, succ); };
    auto red = [&] { return lanes.reducer(r); };
    uint64_t readyIdx = 0, agIdx = 0, rsIdx = 0;
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (i + p - s) % p;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        if (s > 0) b.wait(r, send(), reduced, ++readyIdx);
        const BufRef src = s == 0 ? bufRef(r, ctx.input, u.begin) : bufRef(r, scratch, u.begin);
        b.put(r, send(), bufRef(succ, scratch, u.begin), src, u.size, rsArrived);
      }
    }
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (i + 1 + p - s) % p;
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
      const uint32_t blockIdx = (i + 2 * p - 1 - s) % p;
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

/// The ring lattice's longest path (docs: "ring"), evaluated step by step: per representative rank
/// (ringRepresentatives) its sender (reduce-scatter then all-gather sends, chunk by chunk) and its reducer (one
/// reduction per arrival), a send across nodes landing netLands after its lane time. Exact for equal pieces up to
/// kExactRingRanks uneven ranks (a bound beyond); O(representatives x p x K).
PathCounts ringLongest(const UnitPrices& u, const GenContext& g, double k) {
  const Longest longest(&u);
  const RingReps reps = ringRepresentatives(g);
  const uint32_t p = g.nRanks, Q = reps.count;
  const auto K = static_cast<uint32_t>(k);
  std::vector<PathCounts> hop(Q), land(Q);
  for (uint32_t i = 0; i < Q; ++i) {
    const bool far = reps.crosses(g, i), near = reps.stays(g, i);
    hop[i] = far && near ? longest(nvMsg(), netMsg()) : far ? netMsg() : nvMsg();
    if (far) land[i] = netLands();
  }
  auto pred = [&](uint32_t i) { return (i + Q - 1) % Q; };
  const PathCounts zero, red = redMsg(), flag = flagHop();
  std::vector<PathCounts> snd(Q), rdc(Q);
  // Per representative and chunk: the last reduction (reduce-scatter) or arrival (all-gather) of the step.
  std::vector<std::vector<PathCounts>> done(Q, std::vector<PathCounts>(K)), sent = done;
  for (uint32_t s = 0; s + 1 < p; ++s)
    for (uint32_t c = 0; c < K; ++c) {
      for (uint32_t i = 0; i < Q; ++i) {
        snd[i] = longest(snd[i], s ? done[i][c] + flag : zero) + hop[i];
        sent[i][c] = snd[i] + land[i];
      }
      for (uint32_t i = 0; i < Q; ++i) done[i][c] = rdc[i] = longest(rdc[i], sent[pred(i)][c]) + red;
    }
  for (uint32_t s = 0; s + 1 < p; ++s)
    for (uint32_t c = 0; c < K; ++c) {
      for (uint32_t i = 0; i < Q; ++i) {
        snd[i] = longest(snd[i], s ? sent[pred(i)][c] : done[i][c] + flag) + hop[i];
        done[i][c] = snd[i] + land[i];  // the arrival at the successor
      }
      for (uint32_t i = 0; i < Q; ++i) sent[i][c] = done[i][c];
    }
  PathCounts total = zero;
  for (uint32_t i = 0; i < Q; ++i) {
    total = longest({total, snd[i], rdc[i]});
    for (uint32_t c = 0; c < K; ++c) total = longest(total, sent[pred(i)][c]);
  }
  return total;
}

namespace {

CostEstimate costRing(const CostContext& c) {
  const ClosedFormShape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const Range block0 = splitRange(s.part0, s.p, 0);
  const UnitPrices u = unitPrices(c, splitRange(block0, c.opt.chunks, 0).size, s.nodes > 1, /*ringEdges=*/true);
  const double k = chunkCount(block0.size, c.opt.chunks);
  return estimate(u, ringLongest(u, c.gen, k),
                  "ring: D + longest path of the send/reduce lattice (docs), 2(p-1)K*T when nothing waits; "
                  "a chunk sent on once reduced (R + F) or landed (L after a send across nodes), piece n/(C*p*K)");
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
