// mkernel — generators for allgather, reducescatter, broadcast and alltoall, with their closed forms.
//
// Every algorithm here is described step by step, with its closed-form cost, in docs/algorithms-collectives.md.
// Conventions shared by all of them:
//  * a channel owns elements `part` of every block (the per-rank block of allgather, the per-rank output
//    block of reducescatter, the per-peer block of alltoall, the whole buffer of broadcast) and has its own
//    lanes; inside a channel each transfer is cut into K' = min(chunks, part.size) chunks;
//  * NVLink puts run on the Intra lane, cross-node puts on the InterSend lane, local copies and reductions
//    that nothing sends from on the Compute lane, waits for data nothing is forwarded from on the lane of
//    the link it arrived by (Intra or InterRecv);
//  * a flag only ever receives increments from one lane of one rank, in order, so a threshold t means "the
//    first t transfers of that lane to me have landed" and no mix of chunks can reach it early;
//  * peers are visited in staggered order (rank r starts with r + 1), so no rank is everyone's first target.
#include <algorithm>
#include <cstdio>
#include <sstream>
#include <string>
#include <vector>

#include "builder.hpp"
#include "mk/error.hpp"

namespace mk::detail {
namespace {

// ---- placement helpers -----------------------------------------------------------------------------------

/// The chunks of one channel's part: K' = min(chunks, part.size) near-equal pieces (never an empty one).
std::vector<Range> chunksOf(Range part, uint32_t chunks) {
  const auto k = static_cast<uint32_t>(std::min<uint64_t>(chunks, part.size));
  std::vector<Range> out;
  out.reserve(k);
  for (uint32_t i = 0; i < k; ++i) out.push_back(splitRange(part, k, i));
  return out;
}

uint32_t nodeSize(const GenContext& ctx, uint32_t rank) {
  return static_cast<uint32_t>(ctx.nodeRanks[ctx.nodeOf[rank]].size());
}

/// Lane role of a transfer from `from` to `to`.
LaneRole sendRole(const GenContext& ctx, uint32_t from, uint32_t to) {
  return ctx.sameNode(from, to) ? LaneRole::Intra : LaneRole::InterSend;
}

/// Lane role a rank waits on for data from `from` that it does not forward.
LaneRole recvRole(const GenContext& ctx, uint32_t from, uint32_t to) {
  return ctx.sameNode(from, to) ? LaneRole::Intra : LaneRole::InterRecv;
}

/// Same-node peers of `rank` in staggered order: the ranks above it, then the ones below (what visiting
/// (rank + i) % p for i = 1..p-1 and keeping the same-node ones gives, since nodeRanks is ascending).
std::vector<uint32_t> localPeers(const GenContext& ctx, uint32_t rank) {
  const auto& mates = ctx.nodeRanks[ctx.nodeOf[rank]];
  const uint32_t me = ctx.localIndex[rank];
  std::vector<uint32_t> out;
  out.reserve(mates.size());
  for (std::size_t i = 1; i < mates.size(); ++i) out.push_back(mates[(me + i) % mates.size()]);
  return out;
}

/// Owner of rail g on `node`: the rank with local index g, or g % size on a smaller node.
uint32_t railOwner(const GenContext& ctx, uint32_t node, uint32_t g) {
  const auto& mates = ctx.nodeRanks[node];
  return mates[g % mates.size()];
}

/// Rails `rank` owns, ascending: its local index l, then l + size, l + 2 size, ... below maxLocal.
std::vector<uint32_t> railsOf(const GenContext& ctx, uint32_t rank) {
  std::vector<uint32_t> out;
  for (uint32_t g = ctx.localIndex[rank]; g < ctx.maxLocal; g += nodeSize(ctx, rank)) out.push_back(g);
  return out;
}

BufRef at(uint32_t rank, uint16_t buffer, uint64_t offset) { return ScheduleBuilder::ref(rank, buffer, offset); }

void addScratch(ScheduleBuilder& b, GenContext& ctx, uint64_t slots) {
  if (slots == 0) return;
  ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch, slots * ctx.spec.count);
}

/// Copy this channel's part of a local block on the Compute lane (p = 1, and the own block of gathers).
void localCopy(ScheduleBuilder& b, const GenContext& ctx, uint32_t rank, uint32_t channel, uint64_t dstOffset,
               uint16_t srcBuf, uint64_t srcOffset, uint64_t count) {
  b.copy(rank, b.lane(rank, LaneRole::Compute, channel), at(rank, ctx.output, dstOffset), at(rank, srcBuf, srcOffset),
         count);
}

// ---- allgather -------------------------------------------------------------------------------------------

void emitAllGatherRing(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint64_t count = ctx.spec.count;
  for (uint32_t r = 0; r < p; ++r) localCopy(b, ctx, r, ch, r * count + part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunksOf(part, ctx.opt.chunks);
  const uint64_t k = chunks.size();
  const uint32_t flag = b.newFlag();
  for (uint32_t r = 0; r < p; ++r) {
    const uint32_t next = (r + 1) % p;
    const uint32_t lane = b.lane(r, sendRole(ctx, r, next), ch);
    for (uint32_t step = 0; step + 1 < p; ++step) {
      // Step s forwards block r - s: the own block first, then what arrived from r - 1 in step s - 1.
      const uint64_t blk = (r + p - step) % p;
      for (uint64_t c = 0; c < k; ++c) {
        const Range piece = chunks[c];
        if (step > 0) b.wait(r, lane, flag, (step - 1) * k + c + 1);
        const BufRef src = step == 0 ? at(r, ctx.input, piece.begin) : at(r, ctx.output, blk * count + piece.begin);
        b.put(r, lane, at(next, ctx.output, blk * count + piece.begin), src, piece.size, flag);
      }
    }
    b.wait(r, lane, flag, (p - 1) * k);  // the last block, which is not forwarded
  }
}

/// Every rank sends one block to every peer (allgather: its input; alltoall: its input block j to rank j),
/// always into the receiver's output block r, and waits for one block from every peer.
void emitDirectExchange(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part, bool allToAll) {
  const uint32_t p = ctx.nRanks;
  const uint64_t count = ctx.spec.count;
  for (uint32_t r = 0; r < p; ++r) {
    const uint64_t srcOff = allToAll ? r * count : 0;
    localCopy(b, ctx, r, ch, r * count + part.begin, ctx.input, srcOff + part.begin, part.size);
  }
  if (p == 1) return;
  const auto chunks = chunksOf(part, ctx.opt.chunks);
  const auto from = b.newFlags(p);  // from[s]: increments at the receiver from sender s (one lane of s)
  for (uint32_t r = 0; r < p; ++r)
    for (const Range& piece : chunks)
      for (uint32_t i = 1; i < p; ++i) {
        const uint32_t j = (r + i) % p;
        const uint64_t srcOff = (allToAll ? j * count : 0) + piece.begin;
        b.put(r, b.lane(r, sendRole(ctx, r, j), ch), at(j, ctx.output, r * count + piece.begin),
              at(r, ctx.input, srcOff), piece.size, from[r]);
      }
  for (uint32_t r = 0; r < p; ++r)
    for (uint32_t i = 1; i < p; ++i) {
      const uint32_t s = (r + p - i) % p;
      b.waitAllSent(r, b.lane(r, recvRole(ctx, s, r), ch), from[s]);
    }
}

void emitAllGatherDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  emitDirectExchange(b, ctx, ch, part, false);
}

void emitAllGatherHierarchical(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint32_t nodes = ctx.nNodes();
  const uint64_t count = ctx.spec.count;
  for (uint32_t r = 0; r < p; ++r) localCopy(b, ctx, r, ch, r * count + part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunksOf(part, ctx.opt.chunks);
  const auto from = b.newFlags(p);  // from[s]: blocks put by rank s (phase 1 remote, phase 2 same node)
  // Phase 1: every rank sends its block over its rail to the rail's owner on every other node.
  for (uint32_t r = 0; r < p && nodes > 1; ++r) {
    const uint32_t n = ctx.nodeOf[r];
    const uint32_t lane = b.lane(r, LaneRole::InterSend, ch);
    for (uint32_t i = 1; i < nodes; ++i) {
      const uint32_t target = railOwner(ctx, (n + i) % nodes, ctx.localIndex[r]);
      for (const Range& piece : chunks)
        b.put(r, lane, at(target, ctx.output, r * count + piece.begin), at(r, ctx.input, piece.begin), piece.size,
              from[r]);
    }
  }
  // Phase 2: every owner hands its own block, then every block of its rails as it arrives, to its node.
  for (uint32_t o = 0; o < p; ++o) {
    const uint32_t n = ctx.nodeOf[o];
    const auto peers = localPeers(ctx, o);
    const uint32_t lane = b.lane(o, LaneRole::Intra, ch);
    for (const Range& piece : chunks)
      for (uint32_t y : peers)
        b.put(o, lane, at(y, ctx.output, o * count + piece.begin), at(o, ctx.input, piece.begin), piece.size, from[o]);
    for (uint32_t g : railsOf(ctx, o))
      for (uint32_t i = 1; i < nodes; ++i) {
        const uint32_t m = (n + nodes - i) % nodes;  // arrival order: node n - 1 puts to us first
        if (ctx.nodeRanks[m].size() <= g) continue;  // that node has no rank with local index g
        const uint32_t src = ctx.nodeRanks[m][g];
        for (uint64_t c = 0; c < chunks.size(); ++c) {
          const Range piece = chunks[c];
          b.wait(o, lane, from[src], c + 1);
          for (uint32_t y : peers)
            b.put(o, lane, at(y, ctx.output, src * count + piece.begin), at(o, ctx.output, src * count + piece.begin),
                  piece.size, from[o]);
        }
      }
  }
  for (uint32_t x = 0; x < p; ++x)
    for (uint32_t o : localPeers(ctx, x)) b.waitAllSent(x, b.lane(x, LaneRole::Intra, ch), from[o]);
}

// ---- reducescatter ---------------------------------------------------------------------------------------

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
  const auto chunks = chunksOf(part, ctx.opt.chunks);
  const uint64_t k = chunks.size();
  const uint32_t flag = b.newFlag();
  for (uint32_t r = 0; r < p; ++r) {
    const uint32_t next = (r + 1) % p;
    const uint32_t lane = b.lane(r, sendRole(ctx, r, next), ch);
    // Step s sends the partial of block r - s - 1; after p - 1 steps block r has been through every rank.
    for (uint32_t step = 0; step + 1 < p; ++step) {
      const uint64_t blk = (r + 2 * p - step - 1) % p;
      for (uint64_t c = 0; c < k; ++c) {
        const Range piece = chunks[c];
        BufRef src = at(r, ctx.input, blk * count + piece.begin);
        if (step > 0) {
          const BufRef partial = at(r, scratch, (step - 1) * count + piece.begin);
          b.wait(r, lane, flag, (step - 1) * k + c + 1);
          b.reduce(r, lane, partial, partial, src, piece.size);
          src = partial;
        }
        b.put(r, lane, at(next, scratch, step * count + piece.begin), src, piece.size, flag);
      }
    }
    for (uint64_t c = 0; c < k; ++c) {
      const Range piece = chunks[c];
      b.wait(r, lane, flag, (p - 2) * k + c + 1);
      b.reduce(r, lane, at(r, ctx.output, piece.begin), at(r, scratch, (p - 2) * count + piece.begin),
               at(r, ctx.input, r * count + piece.begin), piece.size);
    }
  }
}

void setupReduceScatterDirect(ScheduleBuilder& b, GenContext& ctx) {
  addScratch(b, ctx, ctx.nRanks > 1 ? ctx.nRanks : 0);  // slot s: sender s's copy of my block
}

void emitReduceScatterDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint64_t count = ctx.spec.count;
  if (p == 1) {
    localCopy(b, ctx, 0, ch, part.begin, ctx.input, part.begin, part.size);
    return;
  }
  const uint16_t scratch = scratchBuffer(ctx);
  const auto chunks = chunksOf(part, ctx.opt.chunks);
  const auto from = b.newFlags(p);
  for (uint32_t r = 0; r < p; ++r)
    for (const Range& piece : chunks)
      for (uint32_t i = 1; i < p; ++i) {
        const uint32_t j = (r + i) % p;
        b.put(r, b.lane(r, sendRole(ctx, r, j), ch), at(j, scratch, r * count + piece.begin),
              at(r, ctx.input, j * count + piece.begin), piece.size, from[r]);
      }
  // Rank order 0..p-1 on every destination: the result does not depend on arrival order.
  for (uint32_t j = 0; j < p; ++j) {
    const uint32_t lane = b.lane(j, LaneRole::Compute, ch);
    for (uint64_t c = 0; c < chunks.size(); ++c) {
      const Range piece = chunks[c];
      auto operand = [&](uint32_t s) {
        if (s == j) return at(j, ctx.input, j * count + piece.begin);
        b.wait(j, lane, from[s], c + 1);
        return at(j, scratch, s * count + piece.begin);
      };
      const BufRef out = at(j, ctx.output, piece.begin);
      const BufRef first = operand(0);
      b.reduce(j, lane, out, first, operand(1), piece.size);
      for (uint32_t s = 2; s < p; ++s) b.reduce(j, lane, out, out, operand(s), piece.size);
    }
  }
}

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
  const auto chunks = chunksOf(part, ctx.opt.chunks);
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
        b.put(x, lane, at(y, scratch, slots.a(it.rho, it.node, ctx.localIndex[x]) * count + piece.begin),
              at(x, ctx.input, dest * count + piece.begin), piece.size, fromLocal[ctx.localIndex[x]]);
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
      BufRef partial = at(o, ctx.input, dest * count + piece.begin);
      if (mates.size() > 1) {
        const BufRef target = (last && nodes == 1) ? at(o, ctx.output, piece.begin)
                                                   : at(o, scratch, slots.partial(it.rho, it.step) * count + piece.begin);
        auto operand = [&](uint32_t lx) {
          if (mates[lx] == o) return at(o, ctx.input, dest * count + piece.begin);
          b.wait(o, lane, fromLocal[lx], j + 1);
          return at(o, scratch, slots.a(it.rho, it.node, lx) * count + piece.begin);
        };
        const BufRef first = operand(0);
        b.reduce(o, lane, target, first, operand(1), piece.size);
        for (uint32_t lx = 2; lx < mates.size(); ++lx) b.reduce(o, lane, target, target, operand(lx), piece.size);
        partial = target;
      }
      if (it.step > 0) {
        b.wait(o, lane, ring[it.rail], ++ringSeen[it.rail]);
        const BufRef dst = last ? at(o, ctx.output, piece.begin)
                                : at(o, scratch, slots.partial(it.rho, it.step) * count + piece.begin);
        b.reduce(o, lane, dst, at(o, scratch, slots.ringIn(it.rho, it.step) * count + piece.begin), partial,
                 piece.size);
        partial = dst;
      }
      if (!last) {
        const uint32_t next = railOwner(ctx, (n + 1) % nodes, it.rail);
        const uint64_t rhoNext = it.rail / nodeSize(ctx, next);
        b.put(o, lane, at(next, scratch, slots.ringIn(rhoNext, it.step + 1) * count + piece.begin), partial,
              piece.size, ring[it.rail]);
      }
    }
  }
}

// ---- broadcast -------------------------------------------------------------------------------------------

void emitBroadcastDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint32_t root = ctx.spec.root;
  localCopy(b, ctx, root, ch, part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunksOf(part, ctx.opt.chunks);
  const uint32_t flag = b.newFlag();
  for (const Range& piece : chunks)
    for (uint32_t i = 1; i < p; ++i) {
      const uint32_t j = (root + i) % p;
      b.put(root, b.lane(root, sendRole(ctx, root, j), ch), at(j, ctx.output, piece.begin),
            at(root, ctx.input, piece.begin), piece.size, flag);
    }
  for (uint32_t i = 1; i < p; ++i) {
    const uint32_t j = (root + i) % p;
    b.waitAllSent(j, b.lane(j, recvRole(ctx, root, j), ch), flag);
  }
}

void emitBroadcastRing(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  const uint32_t p = ctx.nRanks;
  const uint32_t root = ctx.spec.root;
  localCopy(b, ctx, root, ch, part.begin, ctx.input, part.begin, part.size);
  if (p == 1) return;
  const auto chunks = chunksOf(part, ctx.opt.chunks);
  const uint32_t flag = b.newFlag();
  for (uint32_t pos = 0; pos + 1 < p; ++pos) {
    const uint32_t r = (root + pos) % p;
    const uint32_t next = (r + 1) % p;
    const uint32_t lane = b.lane(r, sendRole(ctx, r, next), ch);
    for (uint64_t c = 0; c < chunks.size(); ++c) {
      const Range piece = chunks[c];
      if (pos > 0) b.wait(r, lane, flag, c + 1);
      b.put(r, lane, at(next, ctx.output, piece.begin), at(r, pos == 0 ? ctx.input : ctx.output, piece.begin),
            piece.size, flag);
    }
  }
  const uint32_t last = (root + p - 1) % p;
  b.waitAllSent(last, b.lane(last, recvRole(ctx, (last + p - 1) % p, last), ch), flag);
}

// ---- alltoall --------------------------------------------------------------------------------------------

void emitAllToAllDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  emitDirectExchange(b, ctx, ch, part, true);
}

// ---- closed forms ----------------------------------------------------------------------------------------
//
// Every formula is the critical path of the uncontended timeline (docs/cost-model.md) of the schedule the
// matching emit function builds; the derivations are in docs/algorithms-collectives.md.

/// A time split into its alpha (latency), beta (bandwidth) and gamma (reduction) parts.
struct Term {
  double lat = 0, bw = 0, red = 0;
  double total() const { return lat + bw + red; }
  Term operator+(const Term& o) const { return Term{lat + o.lat, bw + o.bw, red + o.red}; }
  Term operator*(double f) const { return Term{lat * f, bw * f, red * f}; }
};

Term maxOf(std::initializer_list<Term> terms) {
  Term best = *terms.begin();
  for (const Term& t : terms)
    if (t.total() > best.total()) best = t;
  return best;
}

std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.4g", v);
  return buf;
}

/// Sizes and per-piece prices shared by every closed form. With C' = min(C, count) channels each rank runs
/// C' lanes per resource, so every transfer gets 1/C' of its link (rule 2); pieces are the largest ones
/// (channel 0, chunk 0), which makes the formulas exact for even splits and upper bounds otherwise.
struct Prices {
  const CostContext& c;
  double channels = 1;  ///< C'
  double chunks = 1;    ///< K' of the largest part
  double partBytes = 0, chunkBytes = 0;
  Term t0, nvl, net, copy, reduce;  ///< dispatch; one chunk over NVLink / network; copy of a part; reduce of a chunk

  explicit Prices(const CostContext& ctx) : c(ctx) {
    const Profile& pr = ctx.profile;
    const uint64_t count = ctx.spec.count;
    const uint64_t ch = std::min<uint64_t>(ctx.opt.channels, count);
    const uint64_t part = (count + ch - 1) / ch;
    const uint64_t k = std::min<uint64_t>(ctx.opt.chunks, part);
    const uint64_t chunk = (part + k - 1) / k;
    const auto esize = static_cast<double>(dtypeSize(ctx.spec.dtype));
    channels = static_cast<double>(ch);
    chunks = static_cast<double>(k);
    partBytes = static_cast<double>(part) * esize;
    chunkBytes = static_cast<double>(chunk) * esize;
    t0 = Term{pr.dispatchUs, 0, 0};
    nvl = Term{pr.nvlink.alphaUs, chunkBytes * channels / (pr.nvlink.bwGBs * 1e3), 0};
    net = Term{pr.proxyUs + pr.network.alphaUs, chunkBytes * channels / (pr.network.bwGBs * 1e3), 0};
    copy = Term{pr.local.alphaUs, partBytes * channels / (pr.local.bwGBs * 1e3), 0};
    reduce = Term{pr.local.alphaUs, 0, chunkBytes * channels / (pr.reduceGBs * 1e3)};
  }

  /// "p=8 M=2 G=4 n=4096B C=1 K=1 nc=4096B ...": the symbols every formula string uses (G = largest node).
  std::string symbols() const {
    const GenContext& g = c.gen;
    std::ostringstream os;
    os << "p=" << g.nRanks << " M=" << g.nNodes() << " G=" << g.maxLocal << " n=" << num(partBytes * channels)
       << "B C=" << num(channels) << " K=" << num(chunks) << " nc=" << num(chunkBytes) << "B; T_nvl=" << num(nvl.total())
       << " T_net=" << num(net.total()) << " T_copy=" << num(copy.total()) << " R=" << num(reduce.total()) << " t0="
       << num(t0.total());
    return os.str();
  }

  CostEstimate finish(const Term& critical, const std::string& formula) const {
    CostEstimate e;
    const Term all = t0 + critical;
    e.latencyUs = all.lat;
    e.bandwidthUs = all.bw;
    e.reduceUs = all.red;
    e.totalUs = all.total();
    e.formula = formula + "  [" + symbols() + "] = " + num(e.totalUs) + " us";
    return e;
  }
};

uint32_t ranksOnNode(const GenContext& g, uint32_t n) { return static_cast<uint32_t>(g.nodeRanks[n].size()); }

/// max over ranks of the work of their Intra lane ((G_n - 1) K' chunks) and InterSend lane ((p - G_n) K').
Term directSendTerm(const Prices& x) {
  const GenContext& g = x.c.gen;
  Term best;
  for (uint32_t n = 0; n < g.nNodes(); ++n) {
    const double local = ranksOnNode(g, n) - 1.0;
    const double remote = static_cast<double>(g.nRanks - ranksOnNode(g, n));
    best = maxOf({best, x.nvl * (local * x.chunks), x.net * (remote * x.chunks)});
  }
  return best;
}

/// The slowest hop price among ring edges r -> r + 1 (network if any edge crosses nodes).
Term slowestRingHop(const Prices& x) {
  const GenContext& g = x.c.gen;
  bool intra = false, inter = false;
  for (uint32_t r = 0; r < g.nRanks; ++r) (g.sameNode(r, (r + 1) % g.nRanks) ? intra : inter) = true;
  if (intra && inter) return maxOf({x.nvl, x.net});
  return inter ? x.net : x.nvl;
}

CostEstimate costAllGatherRing(const CostContext& c) {
  const Prices x(c);
  const double p = c.gen.nRanks;
  if (c.gen.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  const Term ring = slowestRingHop(x) * ((p - 1) * x.chunks);
  return x.finish(maxOf({x.copy, ring}), "t0 + max(T_copy, (p-1)*K*max(hop prices: T_nvl or T_net))");
}

CostEstimate costDirectExchange(const CostContext& c) {
  const Prices x(c);
  if (c.gen.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  return x.finish(maxOf({x.copy, directSendTerm(x)}),
                  "t0 + max(T_copy, max over nodes of K*(G_n-1)*T_nvl, K*(p-G_n)*T_net)");
}

bool equalNodes(const GenContext& g) {
  for (const auto& n : g.nodeRanks)
    if (n.size() != g.maxLocal) return false;
  return true;
}

CostEstimate costAllGatherHierarchical(const CostContext& c) {
  const Prices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  const uint32_t nodes = g.nNodes();
  const double k = x.chunks;
  Term best = maxOf({x.copy, x.net * ((nodes - 1.0) * k)});  // the inter-send lanes: (M-1) K' proxy puts
  // An owner's Intra lane hands out its own block (K' chunks of D = (G-1) T_nvl), then forwards J remote
  // chunks, chunk j taking D from max(its arrival a_j, the previous one's end): a two-stage flow line, so it
  // ends at max(K'D + J D, max_j a_j + (J - j) D). Every sender's inter lane only puts, so a_j is exact:
  // the block from node n - i is its sender's i-th target, chunk k lands at ((i-1) K' + k + 1) T_net.
  if (equalNodes(g)) {
    const Term d = x.nvl * (g.maxLocal - 1.0);
    const double j = (nodes - 1.0) * k;  // a_j grows by T_net and j by 1: the max is at j = 0 or J-1
    best = maxOf({best, d * (k + j)});
    if (nodes > 1) best = maxOf({best, x.net + d * j, x.net * j + d});
    return x.finish(best,
                    "t0 + max(T_copy, J*T_net, K*D + J*D, T_net + J*D, J*T_net + D) with D = (G-1)*T_nvl, "
                    "J = (M-1)*K remote chunks per owner");
  }
  for (uint32_t o = 0; o < g.nRanks; ++o) {
    const uint32_t n = g.nodeOf[o];
    std::vector<double> arrivals;  // in units of T_net, in the order the owner forwards them
    for (uint32_t rail : railsOf(g, o))
      for (uint32_t i = 1; i < nodes; ++i)
        if (ranksOnNode(g, (n + nodes - i) % nodes) > rail)
          for (double kk = 0; kk < k; kk += 1) arrivals.push_back((i - 1.0) * k + kk + 1);
    const double total = static_cast<double>(arrivals.size());
    const Term d = x.nvl * (ranksOnNode(g, n) - 1.0);
    best = maxOf({best, d * (k + total)});
    for (std::size_t j = 0; j < arrivals.size(); ++j)
      best = maxOf({best, x.net * arrivals[j] + d * (total - static_cast<double>(j))});
  }
  return x.finish(best,
                  "t0 + max(T_copy, (M-1)*K*T_net, max over owners of max(K*D + J*D, max_j a_j*T_net + (J-j)*D)) "
                  "with D = (G_n-1)*T_nvl, J the owner's remote chunks, a_j = (i-1)*K + k + 1 for chunk k of the "
                  "block from node n-i");
}

CostEstimate costReduceScatterRing(const CostContext& c) {
  const Prices x(c);
  const double p = c.gen.nRanks;
  if (c.gen.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  return x.finish((slowestRingHop(x) + x.reduce) * ((p - 1) * x.chunks),
                  "t0 + (p-1)*K*(max(hop prices: T_nvl or T_net) + R)");
}

CostEstimate costReduceScatterDirect(const CostContext& c) {
  const Prices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  const double p = g.nRanks;
  const double k = x.chunks;
  // The destination reduces chunk by chunk in rank order; source s enters the chain at reduce max(1, s), so
  // p - max(1, s) reduces of that chunk remain after it lands. Its chunk k lands at the latest (k + 1) times
  // its lane's per-chunk work after t0; the chain is linear in k, so only k = 0 and k = K'-1 can be maximal.
  Term best = x.reduce * (k * (p - 1));
  for (uint32_t n = 0; n < g.nNodes(); ++n) {
    const double first = std::max<uint32_t>(1, g.nodeRanks[n].front());
    const double local = ranksOnNode(g, n) - 1.0;
    const double remote = p - ranksOnNode(g, n);
    for (double kk : {0.0, k - 1}) {
      const Term tail = x.reduce * (p - first + (k - 1 - kk) * (p - 1));
      if (local > 0) best = maxOf({best, x.nvl * ((kk + 1) * local) + tail});
      if (remote > 0) best = maxOf({best, x.net * ((kk + 1) * remote) + tail});
    }
  }
  return x.finish(best,
                  "t0 + max over nodes n (s_n = max(1, first rank of n)) and k in {1, K} of "
                  "k*(G_n-1)*T_nvl or k*(p-G_n)*T_net, + (p - s_n + (K-k)*(p-1))*R");
}

/// Uneven nodes: owners own different numbers of rails, so rings of one rail advance at different paces and
/// the "ring partials never stall" argument of the equal case fails. The same item recurrence is then
/// evaluated along the ring in (rail, step, chunk) order, which respects every dependency (an owner's items
/// are in that order, and an item needs only the previous step of its rail): E = max(E_prev + (G-1) R,
/// inputs) for the node partial, then max(., E of the ring predecessor) + R for step >= 1, + T_net for
/// step < M-1. Inputs of item j from node-mate x land after x's puts of the earlier rounds and of the
/// mates before us in round j; then G - max(1, lx) reduces of the chain remain.
CostEstimate costReduceScatterHierarchicalUneven(const Prices& x) {
  const GenContext& g = x.c.gen;
  const uint32_t nodes = g.nNodes();
  const auto k = static_cast<uint32_t>(x.chunks);
  std::vector<double> items(g.nRanks, 0);  // per owner: how many items it has
  for (uint32_t o = 0; o < g.nRanks; ++o)
    for (uint32_t rail : railsOf(g, o))
      for (uint32_t m = 0; m < nodes; ++m)
        if (ranksOnNode(g, m) > rail) items[o] += k;
  std::vector<double> done(g.nRanks, 0);  // per owner: items evaluated so far
  std::vector<Term> laneEnd(g.nRanks);
  std::vector<std::vector<Term>> prev(nodes, std::vector<Term>(k)), cur = prev;
  Term best;
  for (uint32_t rail = 0; rail < g.maxLocal; ++rail)
    for (uint32_t step = 0; step < nodes; ++step) {
      for (uint32_t n = 0; n < nodes; ++n) {
        const uint32_t m = (n + 2 * nodes - step - 1) % nodes;
        if (ranksOnNode(g, m) <= rail) continue;
        const uint32_t o = railOwner(g, n, rail);
        const double gl = ranksOnNode(g, n) - 1.0;
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
              const double chain = ranksOnNode(g, n) - std::max(1.0, static_cast<double>(g.localIndex[sender]));
              t = maxOf({t, x.nvl * (before + position) + x.reduce * chain});
            }
          }
          if (step > 0) t = maxOf({t, prev[(n + nodes - 1) % nodes][kk]}) + x.reduce;
          if (step + 1 < nodes) t = t + x.net;
          laneEnd[o] = t;
          cur[n][kk] = t;
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
  const Prices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  if (!equalNodes(g)) return costReduceScatterHierarchicalUneven(x);
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
    const double gl = ranksOnNode(g, n) - 1.0;
    struct Run {
      double len;
      Term cost, post;
    };
    std::vector<Run> runs;
    for (uint32_t rail : railsOf(g, o))
      for (uint32_t step = 0; step < nodes; ++step) {
        const uint32_t m = (n + 2 * nodes - step - 1) % nodes;
        if (ranksOnNode(g, m) <= rail) continue;
        Term post;
        if (step > 0) post = post + x.reduce;
        if (step + 1 < nodes) post = post + x.net;
        runs.push_back(Run{x.chunks, x.reduce * gl + post, post});
      }
    Term suffix;       // their total cost
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

CostEstimate costBroadcastDirect(const CostContext& c) {
  const Prices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  const double local = ranksOnNode(g, g.nodeOf[c.spec.root]) - 1.0;
  const double remote = g.nRanks - ranksOnNode(g, g.nodeOf[c.spec.root]);
  return x.finish(maxOf({x.copy, x.nvl * (local * x.chunks), x.net * (remote * x.chunks)}),
                  "t0 + max(T_copy, K*(G_root-1)*T_nvl, K*(p-G_root)*T_net)");
}

CostEstimate costBroadcastRing(const CostContext& c) {
  const Prices x(c);
  const GenContext& g = c.gen;
  if (g.nRanks == 1) return x.finish(x.copy, "t0 + T_copy");
  // A flow line of p-1 hops over K' chunks: every hop once, plus K'-1 more times the slowest hop.
  Term sum, slowest;
  for (uint32_t pos = 0; pos + 1 < g.nRanks; ++pos) {
    const uint32_t r = (c.spec.root + pos) % g.nRanks;
    const Term hop = g.sameNode(r, (r + 1) % g.nRanks) ? x.nvl : x.net;
    sum = sum + hop;
    slowest = maxOf({slowest, hop});
  }
  return x.finish(maxOf({x.copy, sum + slowest * (x.chunks - 1)}),
                  "t0 + max(T_copy, sum over the p-1 hops of T_hop + (K-1)*max T_hop)");
}

}  // namespace

const std::vector<AlgorithmDef>& gatherScatterAlgorithms() {
  static const std::vector<AlgorithmDef> v = {
      {CollOp::AllGather, "ring", "ring in rank order, p-1 steps forwarding the block received last, chunks pipelined",
       nullptr, emitAllGatherRing, costAllGatherRing},
      {CollOp::AllGather, "direct", "every rank puts its block into every peer's output (staggered order)", nullptr,
       emitAllGatherDirect, costDirectExchange},
      {CollOp::AllGather, "hierarchical",
       "rails: each block crosses the network once to its rail owner per node, which forwards it over NVLink",
       nullptr, emitAllGatherHierarchical, costAllGatherHierarchical},
      {CollOp::ReduceScatter, "ring", "ring reduce-scatter in rank order, p-1 steps of put + reduce, chunks pipelined",
       setupReduceScatterRing, emitReduceScatterRing, costReduceScatterRing, /*peersTouchUser=*/false},
      {CollOp::ReduceScatter, "direct",
       "every rank puts block j into rank j's scratch; rank j reduces all p in rank order", setupReduceScatterDirect,
       emitReduceScatterDirect, costReduceScatterDirect, /*peersTouchUser=*/false},
      {CollOp::ReduceScatter, "hierarchical",
       "rail owners reduce their node's partials over NVLink, then a ring reduce-scatter across nodes per rail",
       setupReduceScatterHierarchical, emitReduceScatterHierarchical, costReduceScatterHierarchical,
       /*peersTouchUser=*/false},
      {CollOp::Broadcast, "direct", "the root puts its buffer into every other rank's output (staggered order)",
       nullptr, emitBroadcastDirect, costBroadcastDirect},
      {CollOp::Broadcast, "ring", "pipelined chain root -> root+1 -> ..., each rank forwards chunk k on arrival",
       nullptr, emitBroadcastRing, costBroadcastRing},
      {CollOp::AllToAll, "direct", "rank r puts block j into rank j's output block r (staggered order)", nullptr,
       emitAllToAllDirect, costDirectExchange},
  };
  return v;
}

}  // namespace mk::detail
