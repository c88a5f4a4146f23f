// mkernel — reduce-scatter, hierarchical: rail owners reduce their node's partials over NVLink, then a ring
// reduce-scatter across nodes per rail (docs/algorithms-collectives.md).
#include <algorithm>
#include <utility>
#include <vector>

#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

/// Scratch layout of hierarchical reducescatter, in slots of `count` elements: per owned rail rho and node
/// m, one slot per source local index (region A: phase-1 inputs), then per (rho, step) the incoming ring
/// partial (region B) and the node partial (region C).
struct HierSlots {
  uint64_t rails = 0, nodes = 0, maxLocal = 0;
  uint64_t a(uint64_t rho, uint64_t node, uint64_t lx) const { return (rho * nodes + node) * maxLocal + lx; }
  uint64_t ringIn(uint64_t rho, uint64_t step) const { return rails * nodes * maxLocal + rho * nodes + step; }
  uint64_t partial(uint64_t rho, uint64_t step) const { return rails * nodes * (maxLocal + 1) + rho * nodes + step; }
  uint64_t total() const { return rails * nodes * (maxLocal + 2); }
};

HierSlots hierSlots(const GenContext& ctx) { return HierSlots{maxOwnedShards(ctx), ctx.nNodes(), ctx.maxLocal}; }

void setupReduceScatterHierarchical(ScheduleBuilder& b, GenContext& ctx) {
  addScratch(b, ctx, ctx.nRanks > 1 ? hierSlots(ctx).total() : 0);
}

/// One unit of an owner's work: chunk `chunk` of the block of destination node `node` on rail `rail`, at
/// ring step `step`.
struct HierItem {
  uint32_t rail, rho, step, node;
  uint64_t chunk;
};

/// An owner's items in the order it processes them (and its node-mates send its inputs): rails ascending,
/// ring steps, chunks; blocks whose destination does not exist (a smaller node) are skipped everywhere.
std::vector<HierItem> hierItems(const GenContext& ctx, uint32_t owner, uint64_t chunks) {
  const uint32_t nodes = ctx.nNodes();
  const uint32_t n = ctx.nodeOf[owner];
  std::vector<HierItem> items;
  const auto rails = railsOf(ctx, owner);
  for (uint32_t rho = 0; rho < rails.size(); ++rho)
    for (uint32_t step = 0; step < nodes; ++step) {
      const uint32_t m = (n + 2 * nodes - step - 1) % nodes;
      if (ctx.nodeRanks[m].size() <= rails[rho]) continue;
      for (uint64_t c = 0; c < chunks; ++c) items.push_back(HierItem{rails[rho], rho, step, m, c});
    }
  return items;
}

void emitReduceScatterHierarchical(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint32_t nodes = ctx.nNodes();
  const uint64_t count = ctx.spec.count;
  if (p == 1) {
    localCopy(b, ctx, 0, ch, part.begin, ctx.input, part.begin, part.size);
    return;
  }
  const uint16_t scratch = scratchBuffer(ctx);
  const HierSlots slots = hierSlots(ctx);
  const auto chunks = chunkRanges(part, ctx.opt.chunks);
  const auto fromLocal = b.newFlags(ctx.maxLocal);  // phase-1 inputs, by the sender's local index
  const auto ring = b.newFlags(ctx.maxLocal);       // incoming ring partials, by rail
  std::vector<std::vector<HierItem>> items(p);
  for (uint32_t r = 0; r < p; ++r) items[r] = hierItems(ctx, r, chunks.size());

  // Phase 1 (senders): round j carries every node-mate's j-th item, so each owner gets one input per item
  // from each node-mate, in its own item order.
  for (uint32_t x = 0; x < p; ++x) {
    const auto peers = localPeers(ctx, x);
    std::size_t rounds = 0;
    for (uint32_t y : peers) rounds = std::max(rounds, items[y].size());
    if (peers.empty()) continue;  // a node of one: the owner of every rail, nothing to send
    const uint32_t lane = b.lane(x, LaneRole::Intra, ch);
    for (std::size_t j = 0; j < rounds; ++j)
      for (uint32_t y : peers) {
        if (j >= items[y].size()) continue;
        const HierItem& it = items[y][j];
        const Range piece = chunks[it.chunk];
        const uint64_t dest = ctx.nodeRanks[it.node][it.rail];
        b.put(x, lane, bufRef(y, scratch, slots.a(it.rho, it.node, ctx.localIndex[x]) * count + piece.begin),
              bufRef(x, ctx.input, dest * count + piece.begin), piece.size, fromLocal[ctx.localIndex[x]]);
      }
  }

  // Owners: reduce the node's inputs in local-rank order, fold in the ring partial, pass it on.
  for (uint32_t o = 0; o < p; ++o) {
    const uint32_t n = ctx.nodeOf[o];
    const auto& mates = ctx.nodeRanks[n];
    const uint32_t lane = b.lane(o, nodes > 1 ? LaneRole::InterSend : LaneRole::Compute, ch);
    std::vector<uint64_t> ringSeen(ctx.maxLocal, 0);
    for (std::size_t j = 0; j < items[o].size(); ++j) {
      const HierItem& it = items[o][j];
      const Range piece = chunks[it.chunk];
      const uint64_t dest = ctx.nodeRanks[it.node][it.rail];
      const bool last = it.step + 1 == nodes;
      BufRef partial = bufRef(o, ctx.input, dest * count + piece.begin);
      if (mates.size() > 1) {
        const BufRef target = (last && nodes == 1)
                                  ? bufRef(o, ctx.output, piece.begin)
                                  : bufRef(o, scratch, slots.partial(it.rho, it.step) * count + piece.begin);
        auto operand = [&](uint32_t lx) {
          if (mates[lx] == o) return bufRef(o, ctx.input, dest * count + piece.begin);
          b.wait(o, lane, fromLocal[lx], j + 1);
          return bufRef(o, scratch, slots.a(it.rho, it.node, lx) * count + piece.begin);
        };
        const BufRef first = operand(0);
        b.reduce(o, lane, target, first, operand(1), piece.size);
        for (uint32_t lx = 2; lx < mates.size(); ++lx) b.reduce(o, lane, target, target, operand(lx), piece.size);
        partial = target;
      }
      if (it.step > 0) {
        b.wait(o, lane, ring[it.rail], ++ringSeen[it.rail]);
        const BufRef dst = last ? bufRef(o, ctx.output, piece.begin)
                                : bufRef(o, scratch, slots.partial(it.rho, it.step) * count + piece.begin);
        b.reduce(o, lane, dst, bufRef(o, scratch, slots.ringIn(it.rho, it.step) * count + piece.begin), partial,
                 piece.size);
        partial = dst;
      }
      if (!last) {
        const uint32_t next = railOwner(ctx, (n + 1) % nodes, it.rail);
        const uint64_t rhoNext = it.rail / ctx.nodeSize(ctx.nodeOf[next]);
        b.put(o, lane, bufRef(next, scratch, slots.ringIn(rhoNext, it.step + 1) * count + piece.begin), partial,
              piece.size, ring[it.rail]);
      }
    }
  }
}

/// Uneven nodes: owners own different numbers of rails, so rings of one rail advance at different paces and
/// the "ring partials never stall" argument of the equal case fails. The same item recurrence is then
/// evaluated along the ring in (rail, step, chunk) order, which respects every dependency (an owner's items
/// are in that order, and an item needs only the previous step of its rail): E = max(E_prev + (G-1) R,
/// inputs) for the node partial, then max(., E of the ring predecessor) + R for step >= 1, + T_net for
/// step < M-1. Inputs of item j from node-mate x land after x's puts of the earlier rounds and of the
/// mates before us in round j; then G - max(1, lx) reduces of the chain remain.
CostEstimate costReduceScatterHierarchicalUneven(const ChunkPrices& x) {
  const GenContext& g = x.c.gen;
  const uint32_t nodes = g.nNodes();
  const auto k = static_cast<uint32_t>(x.chunks);
  std::vector<double> items(g.nRanks, 0);  // per owner: how many items it has
  for (uint32_t o = 0; o < g.nRanks; ++o)
    for (uint32_t rail : railsOf(g, o))
      for (uint32_t m = 0; m < nodes; ++m)
        if (g.nodeSize(m) > rail) items[o] += k;
  std::vector<double> done(g.nRanks, 0);  // per owner: items evaluated so far
  std::vector<Term> laneEnd(g.nRanks);
  std::vector<std::vector<Term>> prev(nodes, std::vector<Term>(k)), cur = prev;
  Term best;
  for (uint32_t rail = 0; rail < g.maxLocal; ++rail)
    for (uint32_t step = 0; step < nodes; ++step) {
      for (uint32_t n = 0; n < nodes; ++n) {
        const uint32_t m = (n + 2 * nodes - step - 1) % nodes;
        if (g.nodeSize(m) <= rail) continue;
        const uint32_t o = railOwner(g, n, rail);
        const double gl = g.nodeSize(n) - 1.0;
        for (uint32_t kk = 0; kk < k; ++kk) {
          const double j = done[o]++;
          Term t = laneEnd[o];
          if (gl > 0) {
            t = t + x.reduce * gl;
            for (uint32_t sender : localPeers(g, o)) {
              double before = 0, position = 1;  // puts of `sender` before this one
              bool passed = false;
              for (uint32_t y : localPeers(g, sender)) {
                before += std::min(j, items[y]);
                if (y == o) passed = true;
                if (!passed && items[y] > j) position += 1;
              }
              const double chain = g.nodeSize(n) - std::max(1.0, static_cast<double>(g.localIndex[sender]));
              t = maxOf({t, x.nvl * (before + position) + x.reduce * chain});
            }
          }
          if (step > 0) t = maxOf({t, prev[(n + nodes - 1) % nodes][kk]}) + x.reduce;
          if (step + 1 < nodes) t = t + x.net;
          laneEnd[o] = t;
          cur[n][kk] = step + 1 < nodes ? t + x.netLand : t;  // the ring successor waits for the landing
          best = maxOf({best, t});
        }
      }
      std::swap(prev, cur);
    }
  return x.finish(best,
                  "t0 + longest path of the owners' items in (rail, step, chunk) order: E = max(E_prev + (G_n-1)*R, "
                  "inputs) [+ max(., E_pred) + R if step >= 1] [+ T_net if step < M-1]");
}

CostEstimate costReduceScatterHierarchical(const CostContext& c) {
  const ChunkPrices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  // The even nodes' closed form below assumes ring partials never stall; a partial that lands after its
  // sender's lane moved on (ProxyPut latency, netLand) can stall its successor: the recurrence then.
  if (!shapeOf(c).evenNodes || (g.nNodes() > 1 && x.netLand.total() > 0)) return costReduceScatterHierarchicalUneven(x);
  const uint32_t nodes = g.nNodes();
  Term best;
  // Per owner, its ring lane runs items (one chunk of one block at one ring step) in order; an item costs
  // (G-1) R for the node's partial, + R to fold in the ring partial (step >= 1), + T_net to pass it on
  // (step < M-1). The node-mates' inputs for item i land by (i + 1)(G-1) T_nvl, after which (G-1) R of the
  // item remain. Ring partials never stall (every owner of a rail runs the same timeline one node behind).
  // The longest path enters the lane at some item i1; f is linear inside each run of equal items, so the
  // ends of the runs are the only candidates.
  for (uint32_t o = 0; o < g.nRanks; ++o) {
    const uint32_t n = g.nodeOf[o];
    const double gl = g.nodeSize(n) - 1.0;
    struct Run {
      double len;
      Term cost, post;
    };
    std::vector<Run> runs;
    for (uint32_t rail : railsOf(g, o))
      for (uint32_t step = 0; step < nodes; ++step) {
        const uint32_t m = (n + 2 * nodes - step - 1) % nodes;
        if (g.nodeSize(m) <= rail) continue;
        Term post;
        if (step > 0) post = post + x.reduce;
        if (step + 1 < nodes) post = post + x.net;
        runs.push_back(Run{x.chunks, x.reduce * gl + post, post});
      }
    Term suffix;  // their total cost
    std::vector<Term> suffixOf(runs.size());
    for (std::size_t i = runs.size(); i-- > 0;) {
      suffixOf[i] = suffix;
      suffix = suffix + runs[i].cost * runs[i].len;
    }
    best = maxOf({best, suffix});
    if (gl == 0) continue;
    double before = 0;  // items before the current run
    for (std::size_t i = 0; i < runs.size(); ++i) {
      for (double off : {0.0, runs[i].len - 1}) {
        const double index = before + off;
        const Term f = x.nvl * ((index + 1) * gl) + x.reduce * gl + runs[i].post +
                       runs[i].cost * (runs[i].len - 1 - off) + suffixOf[i];
        best = maxOf({best, f});
      }
      before += runs[i].len;
    }
  }
  return x.finish(best,
                  "t0 + max over owners of max(sum of item costs c_i, max over i1 of (i1+1)*(G-1)*T_nvl + (G-1)*R + "
                  "post(i1) + sum_{i>i1} c_i) with c_i = (G-1)*R + [step>=1]*R + [step<M-1]*T_net");
}

}  // namespace

AlgorithmDef reduceScatterHierarchical() {
  return {CollOp::ReduceScatter,
          "hierarchical",
          "rail owners reduce their node's partials over NVLink, then a ring reduce-scatter across nodes per rail",
          setupReduceScatterHierarchical,
          emitReduceScatterHierarchical,
          costReduceScatterHierarchical,
          /*peersTouchUser=*/false};
}

}  // namespace mk::detail
