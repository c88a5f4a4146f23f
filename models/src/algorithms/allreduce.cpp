// mkernel — all-reduce generators: one-shot, two-shot, ring, hierarchical (docs/algorithms-allreduce.md).
//
// Conventions shared by the four generators:
//  * Every channel owns a slice `part` of [0, count) and its own lanes and flags; channels never touch
//    each other's elements, so they need no synchronisation between them.
//  * Lanes of one rank on one channel (created on first use, so no rank owns an empty lane):
//      mover    Intra      NVLink Puts (and the local Copy of p = 1)
//      reducer  Intra      Waits for arriving data and every Reduce; signals its own rank when a result
//                          is ready for a mover / sender
//      sender   InterSend  ProxyPuts to other nodes (the builder turns a cross-node put into a ProxyPut)
//    Splitting data movement from reduction lets the Reduce of chunk k overlap the transfer of chunk k+1;
//    a Signal to one's own rank is the only cross-lane ordering.
//  * Flags: every flag has one purpose and is one of three kinds: per chunk (its increments, from any
//    number of sources, all carry that chunk), fed by one lane of one rank in program order (a running
//    count is an exact threshold), or awaited once at its total (the mix of senders cannot matter).
//  * Pieces that come out empty (counts that do not divide evenly) emit nothing on every side, so flag
//    accounting stays consistent without zero-byte messages.
//  * Peer order is staggered: rank r visits (r + i) % p for i = 1..p-1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <initializer_list>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <vector>

#include "builder.hpp"
#include "mk/error.hpp"

namespace mk::detail {
namespace {

using SB = ScheduleBuilder;

/// Channels that actually emit (generate() never hands out an empty part).
uint32_t effectiveChannels(const GenContext& ctx) {
  return static_cast<uint32_t>(std::min<uint64_t>(ctx.opt.channels, ctx.spec.count));
}

/// Lazily created lanes of one channel (see the file comment).
class ChannelLanes {
 public:
  ChannelLanes(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel) : b_(b), ctx_(ctx), channel_(channel) {}
  uint32_t mover(uint32_t rank) { return b_.lane(rank, LaneRole::Intra, channel_); }
  // The reducer is a second Intra lane of the same channel: the builder keys lanes by (rank, role,
  // channel), so it gets a channel key no real channel uses.
  uint32_t reducer(uint32_t rank) { return b_.lane(rank, LaneRole::Intra, ctx_.opt.channels + channel_); }
  uint32_t sender(uint32_t rank) { return b_.lane(rank, LaneRole::InterSend, channel_); }
  /// The lane that moves data from `rank` to `peer`: mover inside a node, sender across nodes.
  uint32_t to(uint32_t rank, uint32_t peer) { return ctx_.sameNode(rank, peer) ? mover(rank) : sender(rank); }

 private:
  ScheduleBuilder& b_;
  const GenContext& ctx_;
  uint32_t channel_;
};

/// Final wait of `rank`'s reducer for everything sent to `flag`; emits nothing (and creates no lane) when
/// nothing was sent, e.g. when every piece this rank would receive is empty.
void waitForAll(ScheduleBuilder& b, ChannelLanes& lanes, uint32_t rank, uint32_t flag) {
  const uint64_t n = b.signalsSent(rank, flag);
  if (n > 0) b.wait(rank, lanes.reducer(rank), flag, n);
}

uint64_t checkedProduct(uint64_t a, uint64_t b, const char* what) {
  if (a != 0 && b > std::numeric_limits<uint64_t>::max() / a)
    throw Error(ErrorCode::InvalidArgument, std::string("scratch size of ") + what + " overflows 64 bits (" +
                                                std::to_string(a) + " x " + std::to_string(b) + " elements)");
  return a * b;
}

/// p = 1: the all-reduce of one rank is a copy of its input.
void emitLocalCopy(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  ChannelLanes lanes(b, ctx, channel);
  b.copy(0, lanes.mover(0), SB::ref(0, ctx.output, part.begin), SB::ref(0, ctx.input, part.begin), part.size);
}

/// dst <- x(0) op x(1) op ... op x(n-1), strictly left to right (n >= 2), on `lane` of `rank`.
template <class Operand>
void reduceChain(ScheduleBuilder& b, uint32_t rank, uint32_t lane, BufRef dst, uint32_t n, Operand x, uint64_t count) {
  b.reduce(rank, lane, dst, x(0), x(1), count);
  for (uint32_t i = 2; i < n; ++i) b.reduce(rank, lane, dst, dst, x(i), count);
}

// ---------------------------------------------------------------------------------------------------
// one-shot: every rank sends its slice to every peer, every rank reduces all p contributions itself.

void setupOneShot(ScheduleBuilder& b, GenContext& ctx) {
  if (ctx.nRanks == 1) return;
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
        b.put(r, lanes.to(r, peer), SB::ref(peer, scratch, uint64_t(r) * count + c.begin),
              SB::ref(r, ctx.input, c.begin), c.size, arrived);
      }
    for (uint32_t r = 0; r < p; ++r) {
      const uint32_t red = lanes.reducer(r);
      b.waitAllSent(r, red, arrived);
      // Rank order 0..p-1 on every rank: identical bits everywhere.
      auto x = [&](uint32_t j) {
        return j == r ? SB::ref(r, ctx.input, c.begin) : SB::ref(r, scratch, uint64_t(j) * count + c.begin);
      };
      reduceChain(b, r, red, SB::ref(r, ctx.output, c.begin), p, x, c.size);
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// two-shot: direct reduce-scatter (rank j owns shard j of the part) then direct all-gather.
//
// Scratch holds p slots (one per source rank); a slot holds, channel after channel, the shard a rank owns.
// Shard 0 of a channel is its largest, so slot offsets computed from shard 0 fit every rank.

uint64_t twoShotChannelBase(const GenContext& ctx, uint32_t channel) {
  uint64_t base = 0;
  for (uint32_t c = 0; c < channel; ++c)
    base += splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), c), ctx.nRanks, 0).size;
  return base;
}

void setupTwoShot(ScheduleBuilder& b, GenContext& ctx) {
  if (ctx.nRanks == 1) return;
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
        b.put(r, lanes.to(r, owner), SB::ref(owner, scratch, uint64_t(r) * slot + base + (u.begin - shard(owner).begin)),
              SB::ref(r, ctx.input, u.begin), u.size, arrived[k]);
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
        return src == j ? SB::ref(j, ctx.input, u.begin)
                        : SB::ref(j, scratch, uint64_t(src) * slot + base + (u.begin - shard(j).begin));
      };
      reduceChain(b, j, red, SB::ref(j, ctx.output, u.begin), p, x, u.size);
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
        b.put(j, lane, SB::ref(peer, ctx.output, u.begin), SB::ref(j, ctx.output, u.begin), u.size, gathered);
      }
    }
  }
  for (uint32_t r = 0; r < p; ++r) waitForAll(b, lanes, r, gathered);
}

// ---------------------------------------------------------------------------------------------------
// ring: reduce-scatter then all-gather around the ranks in rank order, K chunks per block.
//
// Rank r sends to r+1. At reduce-scatter step s it sends block (r - s): its own input at s = 0, then the
// partial sum it reduced in place in scratch; the reducer's last step (block r + 1) writes the final value
// into output, from where the all-gather forwards it. Every scratch block of a rank is written by its
// predecessor exactly once and then only touched by the rank after the matching Wait: no races.

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
        const BufRef src = s == 0 ? SB::ref(r, ctx.input, u.begin) : SB::ref(r, scratch, u.begin);
        b.put(r, send(), SB::ref(succ, scratch, u.begin), src, u.size, rsArrived);
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
        b.put(r, send(), SB::ref(succ, ctx.output, u.begin), SB::ref(r, ctx.output, u.begin), u.size, agArrived);
      }
    }
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (r + 2 * p - 1 - s) % p;
      const uint16_t dst = s + 2 < p ? scratch : ctx.output;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        b.wait(r, red(), rsArrived, ++rsIdx);
        b.reduce(r, red(), SB::ref(r, dst, u.begin), SB::ref(r, scratch, u.begin), SB::ref(r, ctx.input, u.begin), u.size);
        b.signal(r, red(), r, reduced);
      }
    }
  }
  // The last all-gather step is not forwarded: the reducer waits for it so the op ends with every block.
  for (uint32_t r = 0; r < p; ++r) waitForAll(b, lanes, r, agArrived);
}

// ---------------------------------------------------------------------------------------------------
// hierarchical: intra-node reduce-scatter (NVLink), inter-node ring all-reduce of each shard among its
// owners (one per node), intra-node all-gather.
//
// The part is cut into S = maxLocal shards; shard s is owned on node n by nodeRanks[n][s % size_n]. The ring
// cuts each shard into M blocks and each block into Kr ring chunks ("units"). Node n visits its units in
// "positions" q = 0 .. M*Kr-1: block n first (what the ring sends first), then n-1, ..., n+1 (its final
// block), chunks from the top down; that order walks the shard's elements downwards, wrapping once from
// element 0 to the top. Phases 1 and 3 work on K "groups" of consecutive positions, so their message count
// is O(G K), not O(G M K): the ring starts on group 0 while NVLink still carries the later groups, and phase
// 3 forwards group t as soon as the ring has delivered its last unit. A group is one element range, or two
// where it wraps; every group that crosses a block boundary is sent as two pieces on every node (cut at the
// wrap where there is one, else at the first block boundary), so all nodes run identical step sequences and
// the closed form stays exact. Kr = ceil(K / M) keeps K groups when K > M; with one rank per node there is
// nothing to group and Kr = K, which makes the schedule the plain ring over the nodes.
//
// Scratch holds only what a rank owns: S phase-1 slots (by source local index; only when S > 1) and one
// ring-receive slot (only when M > 1). A slot holds, channel after channel, maxOwned shard-sized regions
// (region m = the owner's m-th shard, m = s / size_n); shard 0 is a channel's largest, so offsets computed
// from it fit every rank. Total: S + 1 slots of about maxOwned x count / S elements (1.125 x count for
// equal nodes of 8, instead of 9 x count with whole-buffer slots).

struct HierLayout {
  uint32_t shards = 0;     ///< S
  uint32_t nodes = 0;      ///< M
  uint32_t maxOwned = 0;   ///< shards owned by a rank of the smallest node: ceil(S / smallest node)
  uint64_t slot = 0;       ///< elements of one slot (all channels)
  uint64_t ringBase = 0;   ///< scratch offset of the ring-receive slot
  uint64_t scratchCount = 0;
};

/// Elements of one slot used by channels before `channel`.
uint64_t hierChannelBase(const GenContext& ctx, uint32_t maxOwned, uint32_t channel) {
  uint64_t base = 0;
  for (uint32_t c = 0; c < channel; ++c)
    base += uint64_t(maxOwned) *
            splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), c), ctx.maxLocal, 0).size;
  return base;
}

/// The inter-node phase is recursive halving/doubling (generate() resolved "auto" before any emitter runs).
bool useRhd(const GenContext& ctx) {
  if (ctx.opt.inter != InterPhase::Ring && ctx.opt.inter != InterPhase::Rhd)
    throw Error(ErrorCode::Internal,
                std::string("hierarchical: inter '") + toString(ctx.opt.inter) + "' reached the generator unresolved");
  return ctx.opt.inter == InterPhase::Rhd && ctx.nNodes() > 1;
}

/// Recursive halving/doubling over the M nodes of a rail: the first M2 (largest power of two <= M) take part;
/// extra node M2 + i folds into host node i before and receives the result after.
struct RhdPlan {
  uint32_t pow2 = 1;   ///< M2
  uint32_t extra = 0;  ///< E = M - M2
  uint32_t steps = 0;  ///< J = log2(M2): exchanges per pass
  /// Partner distance of reduce-scatter step j (all-gather walks the same distances backwards).
  uint32_t distance(uint32_t j) const { return pow2 >> (j + 1); }
};

RhdPlan rhdPlan(uint32_t nodes) {
  RhdPlan p;
  while (p.pow2 * 2 <= nodes) {
    p.pow2 *= 2;
    ++p.steps;
  }
  p.extra = nodes - p.pow2;
  return p;
}

/// Elements of one owned shard's RHD receive region on `channel`: the fold slot (one shard, only with extra
/// nodes) and, per chunk and step j, room for the half received at step j (at most ceil(chunk / 2^(j+1))).
uint64_t rhdStride(const GenContext& ctx, uint32_t channel) {
  const RhdPlan plan = rhdPlan(ctx.nNodes());
  const uint64_t shardMax =
      splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), channel), ctx.maxLocal, 0).size;
  const uint64_t chunkMax = splitRange(Range{0, shardMax}, ctx.opt.chunks, 0).size;
  uint64_t steps = 0;
  for (uint32_t j = 0; j < plan.steps; ++j) steps += (chunkMax + (uint64_t(1) << (j + 1)) - 1) >> (j + 1);
  return (plan.extra > 0 ? shardMax : 0) + checkedProduct(ctx.opt.chunks, steps, "hierarchical rhd (chunks x steps)");
}

HierLayout hierLayout(const GenContext& ctx) {
  HierLayout h;
  h.shards = ctx.maxLocal;
  h.nodes = ctx.nNodes();
  h.maxOwned = maxOwnedShards(ctx);
  h.slot = hierChannelBase(ctx, h.maxOwned, effectiveChannels(ctx));
  h.ringBase = checkedProduct(h.shards > 1 ? h.shards : 0, h.slot, "hierarchical (maxLocal x shard)");
  if (useRhd(ctx)) {
    // Phase-1 slots as for the ring, then the RHD regions (maxOwned per channel) instead of the ring slot.
    uint64_t rhd = 0;
    for (uint32_t c = 0; c < effectiveChannels(ctx); ++c) rhd += checkedProduct(h.maxOwned, rhdStride(ctx, c), "hierarchical rhd");
    h.scratchCount = h.ringBase + rhd;
    return h;
  }
  const uint64_t slots = (h.shards > 1 ? h.shards : 0) + (h.nodes > 1 ? 1 : 0);
  h.scratchCount = checkedProduct(slots, h.slot, "hierarchical (slots x shard)");
  return h;
}

void setupHierarchical(ScheduleBuilder& b, GenContext& ctx) {
  const HierLayout h = hierLayout(ctx);
  if (h.scratchCount > 0) ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch, h.scratchCount);
}

/// Positions and groups of one rank's walk through a shard (the same for every node, shard and channel).
struct HierGeometry {
  uint32_t nodes = 0;       ///< M
  uint32_t ringChunks = 0;  ///< Kr: units per block
  uint32_t positions = 0;   ///< P = M * Kr
  uint32_t ringSteps = 0;   ///< L = (M - 1) * Kr: units one reduce-scatter (or all-gather) pass sends
  std::vector<Range> groups;       ///< group t -> its positions [q0, q1); K groups, none empty
  std::vector<uint32_t> groupOf;   ///< position -> group
  std::vector<uint8_t> twoPieces;  ///< group t crosses a block boundary: sent as two pieces everywhere
};

HierGeometry hierGeometry(uint32_t shards, uint32_t nodes, uint32_t chunks) {
  HierGeometry g;
  g.nodes = nodes;
  g.ringChunks = shards == 1 ? chunks : (chunks + nodes - 1) / nodes;
  if (uint64_t(nodes) * g.ringChunks > std::numeric_limits<uint32_t>::max() / 2)
    throw Error(ErrorCode::InvalidArgument, "hierarchical: chunks " + std::to_string(chunks) + " on " +
                                                std::to_string(nodes) + " nodes gives more than 2^31 ring units per shard");
  g.positions = nodes * g.ringChunks;
  g.ringSteps = (nodes - 1) * g.ringChunks;
  if (shards == 1) return g;  // no phases 1 and 3: nothing to group
  g.groupOf.resize(g.positions);
  for (uint32_t t = 0; t < chunks; ++t) {
    const Range r = splitRange(Range{0, g.positions}, chunks, t);
    g.groups.push_back(r);
    for (uint64_t q = r.begin; q < r.end(); ++q) g.groupOf[q] = t;
    g.twoPieces.push_back((r.end() - 1) / g.ringChunks > r.begin / g.ringChunks ? 1 : 0);
  }
  return g;
}

/// At most two element ranges (empty ones have size 0).
struct Pieces {
  Range piece[2];
  uint32_t n = 0;
  uint32_t nonEmpty() const { return (n > 0 && piece[0].size > 0 ? 1u : 0u) + (n > 1 && piece[1].size > 0 ? 1u : 0u); }
};

void emitHierarchicalRhd(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part);

void emitHierarchical(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  if (ctx.nRanks == 1) return emitLocalCopy(b, ctx, channel, part);
  if (useRhd(ctx)) return emitHierarchicalRhd(b, ctx, channel, part);
  ChannelLanes lanes(b, ctx, channel);
  const HierLayout h = hierLayout(ctx);
  const uint32_t S = h.shards, M = h.nodes, K = ctx.opt.chunks, maxOwned = h.maxOwned;
  const HierGeometry geo = hierGeometry(S, M, K);
  const uint32_t Kr = geo.ringChunks, P = geo.positions, L = geo.ringSteps;
  const uint16_t scratch = h.scratchCount > 0 ? scratchBuffer(ctx) : 0;
  auto size = [&](uint32_t n) { return static_cast<uint32_t>(ctx.nodeRanks[n].size()); };
  auto owner = [&](uint32_t n, uint32_t s) { return ctx.nodeRanks[n][s % size(n)]; };
  auto ordinal = [&](uint32_t n, uint32_t s) { return s / size(n); };  // which of its shards s is, for its owner
  auto shard = [&](uint32_t s) { return splitRange(part, S, s); };
  // The unit at position q of node n's walk through shard s.
  auto unitAt = [&](uint32_t n, uint32_t s, uint32_t q) {
    const uint32_t blockIdx = (n + M - q / Kr) % M;
    return splitRange(splitRange(shard(s), M, blockIdx), Kr, Kr - 1 - q % Kr);
  };
  // Positions [x, y) that do not wrap cover one element range.
  auto span = [&](uint32_t n, uint32_t s, uint32_t x, uint32_t y) {
    const uint64_t lo = unitAt(n, s, y - 1).begin;
    return Range{lo, unitAt(n, s, x).end() - lo};
  };
  auto pieces = [&](uint32_t n, uint32_t s, uint32_t t) {
    const auto q0 = static_cast<uint32_t>(geo.groups[t].begin), q1 = static_cast<uint32_t>(geo.groups[t].end());
    Pieces out;
    if (!geo.twoPieces[t]) {
      out.piece[0] = span(n, s, q0, q1);
      out.n = 1;
      return out;
    }
    const uint32_t wrap = (n + 1) * Kr;  // node n's walk wraps between positions wrap-1 and wrap
    const uint32_t cut = q0 < wrap && wrap < q1 ? wrap : (q0 / Kr + 1) * Kr;
    out.piece[0] = span(n, s, q0, cut);
    out.piece[1] = span(n, s, cut, q1);
    out.n = 2;
    return out;
  };
  // Where element `e` of shard s lives in a slot of the shard's owner on node n.
  const uint64_t chanBase = hierChannelBase(ctx, maxOwned, channel);
  const uint64_t shardStride = shard(0).size;
  auto inSlot = [&](uint32_t n, uint32_t s, uint64_t e) {
    return chanBase + uint64_t(ordinal(n, s)) * shardStride + (e - shard(s).begin);
  };
  auto p1Slot = [&](uint32_t n, uint32_t sourceLocal, uint32_t s, uint64_t e) {
    return uint64_t(sourceLocal) * h.slot + inSlot(n, s, e);
  };
  auto ringSlot = [&](uint32_t n, uint32_t s, uint64_t e) { return h.ringBase + inSlot(n, s, e); };

  // Flags. Phase 1: one per source local index (a source sends to an owner in the owner's reduce order).
  // Per owned shard (ordinal): ring arrivals of reduce-scatter / all-gather (one predecessor each), and the
  // reducer's self-signals "phase-1 group reduced" and "ring unit reduced". Phase 3: one total.
  const std::vector<uint32_t> p1Flag = b.newFlags(S > 1 ? S : 0), p1Ready = b.newFlags(S > 1 ? maxOwned : 0);
  const std::vector<uint32_t> rsFlag = b.newFlags(M > 1 ? maxOwned : 0), agFlag = b.newFlags(M > 1 ? maxOwned : 0),
                              ringReady = b.newFlags(M > 1 ? maxOwned : 0);
  const uint32_t p3Flag = S > 1 ? b.newFlag() : 0;
  // Every unit is non-empty: all lanes exist and the step counts below are known.
  const bool full = part.size >= uint64_t(S) * P;

  for (uint32_t n = 0; n < M; ++n) {
    const uint32_t G = size(n);
    const uint32_t succNode = (n + 1) % M;
    for (uint32_t li = 0; li < G; ++li) {
      const uint32_t r = ctx.nodeRanks[n][li];
      const uint16_t acc = G == 1 ? ctx.input : ctx.output;  // where this rank's node partial lives
      std::vector<uint32_t> owned;
      for (uint32_t s = li; s < S; s += G) owned.push_back(s);
      const auto own = static_cast<uint32_t>(owned.size());
      // Per owned shard: non-empty units before each position, non-empty groups before each group, and how
      // many phase-1 groups the ring's first sends wait for (only those are signalled: every flag is fully
      // consumed).
      std::vector<std::vector<uint64_t>> posBefore(own, std::vector<uint64_t>(P + 1, 0));
      std::vector<std::vector<uint64_t>> groupsBefore(own, std::vector<uint64_t>(K + 1, 0));
      std::vector<uint64_t> p1Signals(own, 0);
      for (uint32_t j = 0; j < own; ++j) {
        for (uint32_t q = 0; q < P; ++q) posBefore[j][q + 1] = posBefore[j][q] + (unitAt(n, owned[j], q).size > 0);
        if (S == 1) continue;
        for (uint32_t t = 0; t < K; ++t) {
          const Range qs = geo.groups[t];
          groupsBefore[j][t + 1] = groupsBefore[j][t] + (posBefore[j][qs.end()] > posBefore[j][qs.begin]);
        }
        if (G == 1) continue;
        if (M == 1) {
          p1Signals[j] = groupsBefore[j][K];
        } else {
          for (uint32_t q = 0; q < Kr; ++q)
            if (posBefore[j][q + 1] > posBefore[j][q]) p1Signals[j] = groupsBefore[j][geo.groupOf[q] + 1];
        }
      }
      if (full) {
        uint64_t pieceSum = 0;
        for (uint32_t t = 0; t < K && S > 1; ++t) pieceSum += geo.twoPieces[t] ? 2 : 1;
        if (G > 1) {
          b.reserveSteps(r, lanes.mover(r), pieceSum * (S - own + uint64_t(own) * (G - 1)) + 2ull * K * own);
          b.reserveSteps(r, lanes.reducer(r), (pieceSum + K) * own * (G - 1) + uint64_t(K) * own + 3ull * L * own + 1);
        } else {
          b.reserveSteps(r, lanes.reducer(r), 3ull * L * own + own);
        }
        if (M > 1) b.reserveSteps(r, lanes.sender(r), 4ull * L * own);
      }

      // Phase 1, mover: every group of the input to each shard's owner, in the order every owner reduces
      // (group, then shard), into the slot "from local index li".
      for (uint32_t t = 0; t < K && G > 1; ++t)
        for (uint32_t i = 1; i < G; ++i) {
          const uint32_t peer = ctx.nodeRanks[n][(li + i) % G];
          for (uint32_t s = (li + i) % G; s < S; s += G) {
            const Pieces ps = pieces(n, s, t);
            for (uint32_t k = 0; k < ps.n; ++k)
              if (ps.piece[k].size > 0)
                b.put(r, lanes.mover(r), SB::ref(peer, scratch, p1Slot(n, li, s, ps.piece[k].begin)),
                      SB::ref(r, ctx.input, ps.piece[k].begin), ps.piece[k].size, p1Flag[li]);
          }
        }

      // Reducer: phase-1 groups of the owned shards in local-rank order, each reduced just before the first
      // ring step that consumes it (the ring's first sends need the groups of positions 0..Kr-1), then the
      // ring's reductions.
      std::vector<uint64_t> p1Count(G, 0), p1Sent(own, 0), rsCount(own, 0);
      uint32_t nextGroup = 0;
      auto phase1Through = [&](uint32_t last) {
        for (; nextGroup <= last && nextGroup < K && G > 1; ++nextGroup)
          for (uint32_t j = 0; j < own; ++j) {
            const uint32_t s = owned[j];
            const Pieces ps = pieces(n, s, nextGroup);
            const uint32_t np = ps.nonEmpty();
            if (np == 0) continue;
            const uint32_t red = lanes.reducer(r);
            for (uint32_t l = 0; l < G; ++l)
              if (l != li) b.wait(r, red, p1Flag[l], p1Count[l] += np);
            for (uint32_t k = 0; k < ps.n; ++k) {
              const Range u = ps.piece[k];
              if (u.size == 0) continue;
              auto x = [&](uint32_t l) {
                return l == li ? SB::ref(r, ctx.input, u.begin) : SB::ref(r, scratch, p1Slot(n, l, s, u.begin));
              };
              reduceChain(b, r, red, SB::ref(r, ctx.output, u.begin), G, x, u.size);
            }
            if (p1Sent[j] < p1Signals[j]) {
              b.signal(r, red, r, p1Ready[ordinal(n, s)]);
              ++p1Sent[j];
            }
          }
      };
      if (S > 1) phase1Through(geo.groupOf[Kr - 1]);
      for (uint32_t i = 0; i < L; ++i) {
        const uint32_t q = i + Kr;  // the position ring step i brings in
        if (S > 1) phase1Through(geo.groupOf[q]);
        for (uint32_t j = 0; j < own; ++j) {
          const uint32_t s = owned[j], m = ordinal(n, s);
          const Range u = unitAt(n, s, q);
          if (u.size == 0) continue;
          const uint32_t red = lanes.reducer(r);
          b.wait(r, red, rsFlag[m], ++rsCount[j]);
          const BufRef dst = q >= L ? SB::ref(r, ctx.output, u.begin) : SB::ref(r, scratch, ringSlot(n, s, u.begin));
          b.reduce(r, red, dst, SB::ref(r, scratch, ringSlot(n, s, u.begin)), SB::ref(r, acc, u.begin), u.size);
          b.signal(r, red, r, ringReady[m]);
        }
      }

      // Sender: the ring's reduce-scatter (send position i: the own partial at i < Kr, then what the reducer
      // produced) and all-gather (the own final units, then each arrival forwarded), all hops cross-node.
      if (M > 1) {
        std::vector<uint64_t> p1Waited(own, 0), readyWait(own, 0), agWait(own, 0);
        for (uint32_t i = 0; i < L; ++i)
          for (uint32_t j = 0; j < own; ++j) {
            const uint32_t s = owned[j], m = ordinal(n, s);
            const Range u = unitAt(n, s, i);
            if (u.size == 0) continue;
            BufRef src = SB::ref(r, scratch, ringSlot(n, s, u.begin));
            if (i < Kr) {
              src = SB::ref(r, acc, u.begin);
              const uint64_t need = G > 1 ? groupsBefore[j][geo.groupOf[i] + 1] : 0;
              if (need > p1Waited[j]) {
                b.wait(r, lanes.sender(r), p1Ready[m], need);
                p1Waited[j] = need;
              }
            } else {
              b.wait(r, lanes.sender(r), ringReady[m], ++readyWait[j]);
            }
            b.put(r, lanes.sender(r), SB::ref(owner(succNode, s), scratch, ringSlot(succNode, s, u.begin)), src, u.size,
                  rsFlag[ordinal(succNode, s)]);
          }
        for (uint32_t i = 0; i < L; ++i)
          for (uint32_t j = 0; j < own; ++j) {
            const uint32_t s = owned[j], m = ordinal(n, s);
            const Range u = unitAt(n, s, i < Kr ? L + i : i - Kr);
            if (u.size == 0) continue;
            if (i < Kr)
              b.wait(r, lanes.sender(r), ringReady[m], ++readyWait[j]);
            else
              b.wait(r, lanes.sender(r), agFlag[m], ++agWait[j]);
            b.put(r, lanes.sender(r), SB::ref(owner(succNode, s), ctx.output, u.begin), SB::ref(r, ctx.output, u.begin),
                  u.size, agFlag[ordinal(succNode, s)]);
          }
      }

      // Phase 3, mover: each group of the owned shards to the node's other ranks once it is final (all-gather
      // arrivals for positions < L, the own final reductions for the rest; with one node, phase 1's result).
      if (G > 1) {
        std::vector<uint64_t> agSeen(own, 0), readySeen(own, 0), p1Seen(own, 0);
        auto waitFor = [&](uint32_t flag, uint64_t need, uint64_t& seen) {
          if (need <= seen) return;
          b.wait(r, lanes.mover(r), flag, need);
          seen = need;
        };
        for (uint32_t t = 0; t < K; ++t)
          for (uint32_t j = 0; j < own; ++j) {
            const uint32_t s = owned[j], m = ordinal(n, s);
            const Pieces ps = pieces(n, s, t);
            if (ps.nonEmpty() == 0) continue;
            const auto q0 = static_cast<uint32_t>(geo.groups[t].begin), q1 = static_cast<uint32_t>(geo.groups[t].end());
            if (M == 1) {
              waitFor(p1Ready[m], groupsBefore[j][t + 1], p1Seen[j]);
            } else {
              if (q0 < L) waitFor(agFlag[m], posBefore[j][std::min(q1, L)], agSeen[j]);
              if (q1 > L) waitFor(ringReady[m], posBefore[j][q1] - posBefore[j][Kr], readySeen[j]);
            }
            for (uint32_t i = 1; i < G; ++i) {
              const uint32_t peer = ctx.nodeRanks[n][(li + i) % G];
              for (uint32_t k = 0; k < ps.n; ++k)
                if (ps.piece[k].size > 0)
                  b.put(r, lanes.mover(r), SB::ref(peer, ctx.output, ps.piece[k].begin),
                        SB::ref(r, ctx.output, ps.piece[k].begin), ps.piece[k].size, p3Flag);
            }
          }
      }
    }
  }
  // Completion: a rank ends holding every shard. Non-owned shards arrive in phase 3; with one rank per
  // node the last all-gather arrivals are not forwarded, so the reducer waits for them.
  for (uint32_t r = 0; r < ctx.nRanks; ++r) {
    const uint32_t n = ctx.nodeOf[r];
    if (S > 1) waitForAll(b, lanes, r, p3Flag);
    if (M > 1 && size(n) == 1)
      for (uint32_t m = 0; m < maxOwned; ++m) waitForAll(b, lanes, r, agFlag[m]);
  }
}

// hierarchical with inter = "rhd": phase 1 and phase 3 as above but on K plain chunks of each shard (one
// piece per group), and per chunk a Rabenseifner all-reduce among the shard's owners on all nodes: recursive
// halving (reduce-scatter: at step j exchange half of the current range with the node at distance M2/2^(j+1),
// keep the half the own bit selects, reduce the received half into it) then recursive doubling (all-gather:
// the same partners backwards, each sending its whole current range straight into the partner's output). A
// non-power-of-two M folds: extra node M2 + i sends each chunk of its node partial to host node i, which
// reduces it before the exchanges and sends the final chunk back at the end. Chunks are pipelined: the
// sender runs chunk t's reduce-scatter and all-gather while NVLink still carries later groups and phase 3
// forwards chunk t as soon as its last piece arrived.
//
// Flags per owned shard (ordinal m): one per reduce-scatter step and one per all-gather step (each fed by one
// partner, chunks in order: running counts are exact, and separate flags per step keep a later partner's early
// arrival from satisfying an earlier step's wait), fold-in and fold-back, and the reducer's self-signal
// `ready` (phase-1 group reduced, then each reduction of a step). Every step's receive range has its own
// scratch region, because the partner of step j+1 may send before this rank's step-j reduction has read its
// region: nothing orders the two.
void emitHierarchicalRhd(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  ChannelLanes lanes(b, ctx, channel);
  const HierLayout h = hierLayout(ctx);
  const uint32_t S = h.shards, M = h.nodes, K = ctx.opt.chunks, maxOwned = h.maxOwned;
  const RhdPlan plan = rhdPlan(M);
  const uint32_t J = plan.steps, M2 = plan.pow2;
  const uint16_t scratch = scratchBuffer(ctx);
  auto size = [&](uint32_t n) { return static_cast<uint32_t>(ctx.nodeRanks[n].size()); };
  auto owner = [&](uint32_t n, uint32_t s) { return ctx.nodeRanks[n][s % size(n)]; };
  auto ordinal = [&](uint32_t n, uint32_t s) { return s / size(n); };
  auto shard = [&](uint32_t s) { return splitRange(part, S, s); };
  auto chunk = [&](uint32_t s, uint32_t t) { return splitRange(shard(s), K, t); };
  // The range node n keeps after reduce-scatter step j (j = -1: the whole chunk) and the one it sends at j.
  auto kept = [&](uint32_t n, uint32_t s, uint32_t t, int j) {
    Range r = chunk(s, t);
    for (int i = 0; i <= j; ++i) r = splitRange(r, 2, (n & plan.distance(uint32_t(i))) ? 1 : 0);
    return r;
  };
  auto sent = [&](uint32_t n, uint32_t s, uint32_t t, uint32_t j) {
    return splitRange(kept(n, s, t, int(j) - 1), 2, (n & plan.distance(j)) ? 0 : 1);
  };
  // Scratch: phase-1 slots (by source local index), then per channel and owned shard the RHD region.
  const uint64_t chanBase = hierChannelBase(ctx, maxOwned, channel);
  const uint64_t shardStride = shard(0).size;
  uint64_t rhdBase = h.ringBase;
  for (uint32_t c = 0; c < channel; ++c) rhdBase += uint64_t(maxOwned) * rhdStride(ctx, c);
  const uint64_t stride = rhdStride(ctx, channel);
  const uint64_t chunkMax = splitRange(Range{0, shardStride}, K, 0).size;
  std::vector<uint64_t> stepOff(J + 1, plan.extra > 0 ? shardStride : 0), cap(J, 0);
  for (uint32_t j = 0; j < J; ++j) {
    cap[j] = (chunkMax + (uint64_t(1) << (j + 1)) - 1) >> (j + 1);
    stepOff[j + 1] = stepOff[j] + uint64_t(K) * cap[j];
  }
  auto p1Slot = [&](uint32_t n, uint32_t sourceLocal, uint32_t s, uint64_t e) {
    return uint64_t(sourceLocal) * h.slot + chanBase + uint64_t(ordinal(n, s)) * shardStride + (e - shard(s).begin);
  };
  auto region = [&](uint32_t n, uint32_t s) { return rhdBase + uint64_t(ordinal(n, s)) * stride; };
  auto foldSlot = [&](uint32_t n, uint32_t s, uint64_t e) { return region(n, s) + (e - shard(s).begin); };
  // Where the half received at step j of chunk t lands on node n (range `r` = what n keeps at step j).
  auto stepSlot = [&](uint32_t n, uint32_t s, uint32_t t, uint32_t j, Range r, uint64_t e) {
    return region(n, s) + stepOff[j] + uint64_t(t) * cap[j] + (e - r.begin);
  };

  const std::vector<uint32_t> p1Flag = b.newFlags(S > 1 ? S : 0), ready = b.newFlags(maxOwned);
  std::vector<std::vector<uint32_t>> rsFlag, agFlag;
  for (uint32_t j = 0; j < J; ++j) {
    rsFlag.push_back(b.newFlags(maxOwned));
    agFlag.push_back(b.newFlags(maxOwned));
  }
  const std::vector<uint32_t> foldIn = b.newFlags(plan.extra > 0 ? maxOwned : 0),
                              foldBack = b.newFlags(plan.extra > 0 ? maxOwned : 0);
  const uint32_t p3Flag = S > 1 ? b.newFlag() : 0;
  // Every exchanged half is non-empty (the smallest chunk splits into M2 pieces): every lane exists.
  const bool full = splitRange(shard(S - 1), K, K - 1).size >= M2;

  for (uint32_t n = 0; n < M; ++n) {
    const uint32_t G = size(n);
    const bool isExtra = n >= M2, isHost = n < plan.extra;
    const uint32_t foldPeer = isExtra ? n - M2 : n + M2;  // only meaningful for extra and host nodes
    for (uint32_t li = 0; li < G; ++li) {
      const uint32_t r = ctx.nodeRanks[n][li];
      std::vector<uint32_t> owned;
      for (uint32_t s = li; s < S; s += G) owned.push_back(s);
      const auto own = static_cast<uint32_t>(owned.size());
      // Where the node partial of a chunk lives before the exchanges: output after phase 1 (or the fold), the
      // input itself on a node of one rank.
      const uint16_t acc0 = (G > 1 || isHost) ? ctx.output : ctx.input;
      auto accAt = [&](uint32_t j) { return j == 0 && !isHost ? (G > 1 ? ctx.output : ctx.input) : ctx.output; };
      if (full) {
        // Upper bounds of each lane's steps (exact up to a few skipped waits): growing 24 k lane vectors by
        // doubling made malloc half of the generation time at 8192 ranks.
        const uint64_t k = K, o = own, g = G, j = J;
        if (G > 1) b.reserveSteps(r, lanes.mover(r), k * (S - o + o * (g - 1)) + k * o * (g - 1 + 1 + j));
        b.reserveSteps(r, lanes.reducer(r), k * o * (2 * (g - 1) + 3 + 3 * j) + 1 + uint64_t(maxOwned) * j);
        b.reserveSteps(r, lanes.sender(r), k * o * (4 * j + 3 + j));
      }

      // Phase 1, mover: chunk t of the input to each shard's owner (group, then shard), one piece per group.
      for (uint32_t t = 0; t < K && G > 1; ++t)
        for (uint32_t i = 1; i < G; ++i) {
          const uint32_t peer = ctx.nodeRanks[n][(li + i) % G];
          for (uint32_t s = (li + i) % G; s < S; s += G) {
            const Range c = chunk(s, t);
            if (c.size > 0)
              b.put(r, lanes.mover(r), SB::ref(peer, scratch, p1Slot(n, li, s, c.begin)), SB::ref(r, ctx.input, c.begin),
                    c.size, p1Flag[li]);
          }
        }

      // Reducer, per chunk: phase-1 group (+ the fold on a host), then the reduction of each reduce-scatter
      // step. readyAt[j'][t][k] = signals to `ready` after stage k of chunk t (k = 0: the chunk's partial is
      // complete; k = j + 1: step j reduced), what the sender waits for.
      std::vector<std::vector<std::vector<uint64_t>>> readyAt(own, std::vector<std::vector<uint64_t>>(K, std::vector<uint64_t>(J + 1, 0)));
      {
        std::vector<uint64_t> p1Count(G, 0), foldCount(own, 0), rsCount(own * size_t(J), 0);
        for (uint32_t t = 0; t < K; ++t) {
          for (uint32_t jo = 0; jo < own; ++jo) {
            const uint32_t s = owned[jo], m = ordinal(n, s);
            const Range c = chunk(s, t);
            if (c.size > 0 && G > 1) {
              const uint32_t red = lanes.reducer(r);
              for (uint32_t l = 0; l < G; ++l)
                if (l != li) b.wait(r, red, p1Flag[l], ++p1Count[l]);
              auto x = [&](uint32_t l) {
                return l == li ? SB::ref(r, ctx.input, c.begin) : SB::ref(r, scratch, p1Slot(n, l, s, c.begin));
              };
              reduceChain(b, r, red, SB::ref(r, ctx.output, c.begin), G, x, c.size);
            }
            if (c.size > 0 && isHost) {
              const uint32_t red = lanes.reducer(r);
              b.wait(r, red, foldIn[m], ++foldCount[jo]);
              b.reduce(r, red, SB::ref(r, ctx.output, c.begin), SB::ref(r, G > 1 ? ctx.output : ctx.input, c.begin),
                       SB::ref(r, scratch, foldSlot(n, s, c.begin)), c.size);
            }
            if (c.size > 0 && (G > 1 || isHost)) b.signal(r, lanes.reducer(r), r, ready[m]);
            readyAt[jo][t][0] = b.signalsSent(r, ready[m]);
          }
          for (uint32_t j = 0; j < J && !isExtra; ++j)
            for (uint32_t jo = 0; jo < own; ++jo) {
              const uint32_t s = owned[jo], m = ordinal(n, s);
              const Range u = kept(n, s, t, int(j));
              if (u.size > 0) {
                const uint32_t red = lanes.reducer(r);
                b.wait(r, red, rsFlag[j][m], ++rsCount[jo * size_t(J) + j]);
                b.reduce(r, red, SB::ref(r, ctx.output, u.begin), SB::ref(r, accAt(j), u.begin),
                         SB::ref(r, scratch, stepSlot(n, s, t, j, u, u.begin)), u.size);
                b.signal(r, red, r, ready[m]);
              }
              readyAt[jo][t][j + 1] = b.signalsSent(r, ready[m]);
            }
        }
      }

      // Sender, per chunk: the fold (extra node), or the reduce-scatter and all-gather exchanges and, on a
      // host, the final chunk back to its extra node. Arrivals counted per flag to give exact thresholds.
      std::vector<uint64_t> readyWaited(own, 0), agSeen(own * size_t(J), 0), agWaited(own * size_t(J), 0);
      auto waitReady = [&](uint32_t jo, uint32_t m, uint64_t need) {
        if (need <= readyWaited[jo]) return;
        b.wait(r, lanes.sender(r), ready[m], need);
        readyWaited[jo] = need;
      };
      auto waitAg = [&](uint32_t jo, uint32_t m, uint32_t j) {
        const size_t k = jo * size_t(J) + j;
        if (agSeen[k] <= agWaited[k]) return;
        b.wait(r, lanes.sender(r), agFlag[j][m], agSeen[k]);
        agWaited[k] = agSeen[k];
      };
      for (uint32_t t = 0; t < K; ++t) {
        if (isExtra) {
          for (uint32_t jo = 0; jo < own; ++jo) {
            const uint32_t s = owned[jo], m = ordinal(n, s);
            const Range c = chunk(s, t);
            if (c.size == 0) continue;
            waitReady(jo, m, readyAt[jo][t][0]);  // the phase-1 reduction of this chunk (none on a node of one rank)
            b.put(r, lanes.sender(r), SB::ref(owner(foldPeer, s), scratch, foldSlot(foldPeer, s, c.begin)),
                  SB::ref(r, acc0, c.begin), c.size, foldIn[ordinal(foldPeer, s)]);
          }
          continue;
        }
        for (uint32_t j = 0; j < J; ++j)
          for (uint32_t jo = 0; jo < own; ++jo) {
            const uint32_t s = owned[jo], m = ordinal(n, s);
            const Range u = sent(n, s, t, j);
            if (u.size == 0) continue;
            waitReady(jo, m, readyAt[jo][t][j]);
            const uint32_t partner = n ^ plan.distance(j);
            b.put(r, lanes.sender(r), SB::ref(owner(partner, s), scratch, stepSlot(partner, s, t, j, u, u.begin)),
                  SB::ref(r, accAt(j), u.begin), u.size, rsFlag[j][ordinal(partner, s)]);
          }
        for (uint32_t k = 0; k < J; ++k) {
          const uint32_t j = J - 1 - k;
          for (uint32_t jo = 0; jo < own; ++jo) {
            const uint32_t s = owned[jo], m = ordinal(n, s);
            // What arrives at this step: the partner's kept range, i.e. what this node sent at step j.
            if (sent(n, s, t, j).size > 0) ++agSeen[jo * size_t(J) + j];
            const Range u = kept(n, s, t, int(j));
            if (u.size == 0) continue;
            if (k == 0)
              waitReady(jo, m, readyAt[jo][t][J]);
            else
              waitAg(jo, m, j + 1);
            const uint32_t partner = n ^ plan.distance(j);
            b.put(r, lanes.sender(r), SB::ref(owner(partner, s), ctx.output, u.begin), SB::ref(r, ctx.output, u.begin),
                  u.size, agFlag[j][ordinal(partner, s)]);
          }
        }
        for (uint32_t jo = 0; jo < own && isHost; ++jo) {
          const uint32_t s = owned[jo], m = ordinal(n, s);
          const Range c = chunk(s, t);
          if (c.size == 0) continue;
          waitReady(jo, m, readyAt[jo][t][J]);
          for (uint32_t j = 0; j < J; ++j) waitAg(jo, m, j);
          b.put(r, lanes.sender(r), SB::ref(owner(foldPeer, s), ctx.output, c.begin), SB::ref(r, ctx.output, c.begin),
                c.size, foldBack[ordinal(foldPeer, s)]);
        }
      }

      // Phase 3, mover: chunk t of each owned shard to the node's other ranks once final (own reductions and
      // every all-gather arrival of the chunk; on an extra node the chunk sent back by the host).
      if (G > 1) {
        std::vector<uint64_t> readySeen(own, 0), agCount(own * size_t(J), 0), agDone(own * size_t(J), 0),
            backCount(own, 0);
        for (uint32_t t = 0; t < K; ++t)
          for (uint32_t jo = 0; jo < own; ++jo) {
            const uint32_t s = owned[jo], m = ordinal(n, s);
            const Range c = chunk(s, t);
            if (c.size == 0) continue;
            const uint32_t mv = lanes.mover(r);
            if (isExtra) {
              b.wait(r, mv, foldBack[m], ++backCount[jo]);
            } else {
              const uint64_t need = readyAt[jo][t][J];
              if (need > readySeen[jo]) {
                b.wait(r, mv, ready[m], need);
                readySeen[jo] = need;
              }
              for (uint32_t j = 0; j < J; ++j) {
                const size_t k = jo * size_t(J) + j;
                if (sent(n, s, t, j).size > 0) ++agCount[k];
                if (agCount[k] > agDone[k]) {
                  b.wait(r, mv, agFlag[j][m], agCount[k]);
                  agDone[k] = agCount[k];
                }
              }
            }
            for (uint32_t i = 1; i < G; ++i) {
              const uint32_t peer = ctx.nodeRanks[n][(li + i) % G];
              b.put(r, mv, SB::ref(peer, ctx.output, c.begin), SB::ref(r, ctx.output, c.begin), c.size, p3Flag);
            }
          }
      }
    }
  }
  // Completion: non-owned shards arrive in phase 3; a node of one rank ends with its own last arrivals.
  for (uint32_t r = 0; r < ctx.nRanks; ++r) {
    const uint32_t n = ctx.nodeOf[r];
    if (S > 1) waitForAll(b, lanes, r, p3Flag);
    if (size(n) == 1) {
      for (uint32_t m = 0; m < maxOwned; ++m) {
        if (n >= M2) waitForAll(b, lanes, r, foldBack[m]);
        for (uint32_t j = 0; j < J && n < M2; ++j) waitForAll(b, lanes, r, agFlag[j][m]);
      }
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// Closed forms (docs/algorithms-allreduce.md derives each one).
//
// Every formula is the longest path through the lanes of the uncontended timeline (cost.hpp,
// simulateUncontended): a lane runs its steps back to back, every step costs alpha + bytes / (bw / share),
// and a rank's share of a resource is the number of its lanes using it, i.e. the channel count C. A path is
// kept as counts of unit prices, so the estimate splits into latency, bandwidth and reduce parts and the
// formula text can print the critical path it found.
//
// Exact (relative 1e-9) when count divides evenly into every piece and all nodes have the same size (ring
// on several nodes: when a network message costs at least an NVLink message). Otherwise the prices use
// the largest piece and the largest node (for the ring on uneven nodes: the slower hop on every rank), which
// bounds the timeline from above: the longest path only grows with step prices.

/// Unit prices of the four kinds of message one step moves, for the largest piece.
struct UnitPrices {
  double bytes = 0;          ///< payload of one piece
  double share = 1;          ///< lanes of one rank sharing each resource (the channel count)
  double nvLat = 0, nvBw = 0, netLat = 0, netBw = 0, redLat = 0, redBw = 0, copyLat = 0, copyBw = 0, flag = 0, dispatch = 0;
  double nv() const { return nvLat + nvBw; }
  double net() const { return netLat + netBw; }
  double red() const { return redLat + redBw; }
  double copy() const { return copyLat + copyBw; }
};

/// A path through the timeline as counts of unit prices. Latency (alpha) and bytes terms are counted apart:
/// most messages carry one piece (both counts grow together), but hierarchical's phase-1/3 messages carry a
/// group of g units in one or two pieces (g bytes terms, one or two alphas).
struct PathCounts {
  double nvA = 0, nvB = 0, netA = 0, netB = 0, redA = 0, redB = 0, copyA = 0, copyB = 0, flag = 0;
  double value(const UnitPrices& u) const {
    return nvA * u.nvLat + nvB * u.nvBw + netA * u.netLat + netB * u.netBw + redA * u.redLat + redB * u.redBw +
           copyA * u.copyLat + copyB * u.copyBw + flag * u.flag;
  }
};
PathCounts operator+(PathCounts a, const PathCounts& b) {
  a.nvA += b.nvA;
  a.nvB += b.nvB;
  a.netA += b.netA;
  a.netB += b.netB;
  a.redA += b.redA;
  a.redB += b.redB;
  a.copyA += b.copyA;
  a.copyB += b.copyB;
  a.flag += b.flag;
  return a;
}
PathCounts operator*(double k, PathCounts a) {
  a.nvA *= k;
  a.nvB *= k;
  a.netA *= k;
  a.netB *= k;
  a.redA *= k;
  a.redB *= k;
  a.copyA *= k;
  a.copyB *= k;
  a.flag *= k;
  return a;
}
PathCounts nvMsg() {
  PathCounts c;
  c.nvA = c.nvB = 1;
  return c;
}
PathCounts netMsg() {
  PathCounts c;
  c.netA = c.netB = 1;
  return c;
}
PathCounts redMsg() {
  PathCounts c;
  c.redA = c.redB = 1;
  return c;
}
PathCounts copyMsg() {
  PathCounts c;
  c.copyA = c.copyB = 1;
  return c;
}
PathCounts flagHop() {
  PathCounts c;
  c.flag = 1;
  return c;
}
/// An NVLink message of `units` units in `pieces` steps.
PathCounts nvGroup(double pieces, double units) {
  PathCounts c;
  c.nvA = pieces;
  c.nvB = units;
  return c;
}
/// Local reductions of `units` units in `pieces` steps.
PathCounts redGroup(double pieces, double units) {
  PathCounts c;
  c.redA = pieces;
  c.redB = units;
  return c;
}

/// Chooses the longer of paths under fixed unit prices (the first on ties, so results are deterministic).
class Longest {
 public:
  explicit Longest(const UnitPrices* u) : u_(u) {}
  PathCounts operator()(const PathCounts& a, const PathCounts& b) const { return b.value(*u_) > a.value(*u_) ? b : a; }
  PathCounts operator()(std::initializer_list<PathCounts> all) const {
    PathCounts best = *all.begin();
    for (const auto& c : all) best = (*this)(best, c);
    return best;
  }

 private:
  const UnitPrices* u_;
};

void requirePositive(double v, const char* field) {
  if (!(v > 0))
    throw Error(ErrorCode::InvalidArgument,
                std::string("profile field ") + field + " must be > 0 for this closed form (got " + std::to_string(v) + ")");
}

/// Prices for pieces of `elems` elements of the spec's dtype.
UnitPrices unitPrices(const CostContext& c, uint64_t elems, bool needsNet) {
  const Profile& pf = c.profile;
  requirePositive(pf.nvlink.bwGBs, "nvlink.bwGBs");
  requirePositive(pf.local.bwGBs, "local.bwGBs");
  requirePositive(pf.reduceGBs, "reduceGBs");
  if (needsNet) requirePositive(pf.network.bwGBs, "network.bwGBs");
  UnitPrices u;
  u.share = effectiveChannels(c.gen);
  u.bytes = double(elems) * double(dtypeSize(c.spec.dtype));
  const double b = u.bytes * u.share / 1e3;  // bytes / (GB/s * 1e3 / share) = b / GB/s
  u.nvLat = pf.nvlink.alphaUs;
  u.nvBw = b / pf.nvlink.bwGBs;
  u.netLat = pf.proxyUs + pf.network.alphaUs;
  u.netBw = needsNet ? b / pf.network.bwGBs : 0;
  u.redLat = pf.local.alphaUs;
  u.redBw = b / pf.reduceGBs;
  u.copyLat = pf.local.alphaUs;
  u.copyBw = b / pf.local.bwGBs;
  u.flag = pf.localFlagUs;  // every F of these formulas is a reducer lane signalling a lane of its own GPU
  u.dispatch = pf.dispatchUs;
  return u;
}

std::string fmt(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.6g", v);
  return buf;
}

/// Fill a CostEstimate from the critical path; `symbolic` is the algorithm's formula.
CostEstimate estimate(const UnitPrices& u, const PathCounts& path, const std::string& symbolic) {
  CostEstimate e;
  e.latencyUs = u.dispatch + path.nvA * u.nvLat + path.netA * u.netLat + path.redA * u.redLat +
                path.copyA * u.copyLat + path.flag * u.flag;
  e.bandwidthUs = path.nvB * u.nvBw + path.netB * u.netBw + path.copyB * u.copyBw;
  e.reduceUs = path.redB * u.redBw;
  e.totalUs = u.dispatch + path.value(u);
  std::ostringstream f;
  f << symbolic << "; critical path = D";
  bool split = false;
  auto term = [&](double a, double bytes, const char* name) {
    if (a == bytes) {
      if (a != 0) f << " + " << fmt(a) << "*t_" << name;
      return;
    }
    split = true;
    if (a != 0) f << " + " << fmt(a) << "*a_" << name;
    if (bytes != 0) f << " + " << fmt(bytes) << "*b_" << name;
  };
  term(path.nvA, path.nvB, "nv");
  term(path.netA, path.netB, "net");
  term(path.redA, path.redB, "red");
  term(path.copyA, path.copyB, "copy");
  if (path.flag != 0) f << " + " << fmt(path.flag) << "*F";
  f << " = " << fmt(e.totalUs) << " us with piece " << fmt(u.bytes) << " B, C " << fmt(u.share) << ", D " << fmt(u.dispatch)
    << ", t_nv " << fmt(u.nv()) << ", t_net " << fmt(u.net()) << ", t_red " << fmt(u.red()) << ", t_copy " << fmt(u.copy())
    << ", F " << fmt(u.flag) << " us";
  if (split) f << " (a_x: the alpha of t_x, b_x: its bytes term)";
  e.formula = f.str();
  return e;
}

/// Largest channel part (channel 0) and the node-size facts every formula needs.
struct Shape {
  uint32_t p = 0, nodes = 0, gMax = 0, gMin = 0;
  bool evenNodes = true;
  Range part0;
};
Shape shapeOf(const CostContext& c) {
  Shape s;
  s.p = c.gen.nRanks;
  s.nodes = c.gen.nNodes();
  s.gMax = c.gen.maxLocal;
  s.gMin = s.gMax;
  for (const auto& n : c.gen.nodeRanks) s.gMin = std::min(s.gMin, static_cast<uint32_t>(n.size()));
  s.evenNodes = s.gMin == s.gMax;
  s.part0 = splitRange(Range{0, c.spec.count}, effectiveChannels(c.gen), 0);
  return s;
}

CostEstimate costLocalCopy(const CostContext& c, const Shape& s) {
  const UnitPrices u = unitPrices(c, s.part0.size, false);
  return estimate(u, copyMsg(), "p = 1: D + t_copy(n/C)");
}

/// Non-empty chunks of a piece of `size` elements.
double chunksOf(uint64_t size, uint32_t chunks) { return double(std::min<uint64_t>(size, chunks)); }

CostEstimate costOneShot(const CostContext& c) {
  const Shape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const UnitPrices u = unitPrices(c, splitRange(s.part0, c.opt.chunks, 0).size, s.nodes > 1);
  const Longest longest(&u);
  const double k = chunksOf(s.part0.size, c.opt.chunks);
  // Chunk k has arrived everywhere when both send lanes finished their (k+1)-th round; the reducer then
  // runs p-1 Reduces per chunk: a two-stage flow shop.
  const PathCounts send = longest(double(s.gMax - 1) * nvMsg(), double(s.p - s.gMin) * netMsg());
  const PathCounts reduce = double(s.p - 1) * redMsg();
  const PathCounts path = send + reduce + (k - 1) * longest(send, reduce);
  return estimate(u, path,
                  "one-shot: D + S + R + (K-1)*max(S, R), S = max((G-1)*t_nv, (p-G)*t_net), R = (p-1)*t_red, piece n/(C*K)");
}

CostEstimate costTwoShot(const CostContext& c) {
  const Shape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const Range shard0 = splitRange(s.part0, s.p, 0);
  const UnitPrices u = unitPrices(c, splitRange(shard0, c.opt.chunks, 0).size, s.nodes > 1);
  const Longest longest(&u);
  const double k = chunksOf(shard0.size, c.opt.chunks);
  const PathCounts sendI = double(s.gMax - 1) * nvMsg();
  const PathCounts sendX = double(s.p - s.gMin) * netMsg();
  const PathCounts send = longest(sendI, sendX);
  const PathCounts reduce = double(s.p - 1) * redMsg();
  // Each send lane runs its K reduce-scatter rounds, then its K all-gather rounds, round k not before the
  // owner's reduction of chunk k (flow shop of arrivals and reductions) plus the self-signal.
  PathCounts path;
  bool first = true;
  for (const PathCounts* lane : {&sendI, &sendX}) {
    if (lane->value(u) == 0) continue;
    const PathCounts e = longest(2 * k * *lane, send + reduce + flagHop() + (k - 1) * longest(send, reduce) + *lane);
    path = first ? e : longest(path, e);
    first = false;
  }
  return estimate(u, path,
                  "two-shot: D + max over send lanes L of max(2K*S_L, S + R + F + (K-1)*max(S, R) + S_L), "
                  "S_nv = (G-1)*t_nv, S_net = (p-G)*t_net, S = max, R = (p-1)*t_red, piece n/(C*p*K)");
}

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

CostEstimate costRing(const CostContext& c) {
  const Shape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const Range block0 = splitRange(s.part0, s.p, 0);
  const UnitPrices u = unitPrices(c, splitRange(block0, c.opt.chunks, 0).size, s.nodes > 1);
  const double k = chunksOf(block0.size, c.opt.chunks);
  return estimate(u, ringLongest(u, s.p, s.gMax, k, s.nodes > 1, s.evenNodes),
                  "ring: D + 2(p-1)K*T + max(0, gain(m) for m in {1, G-1, G, G+1, p-G-1, p-G, p-G+1, p-1}), "
                  "gain(m) = m*(R + F) - m*K*T_last + (passed sends) + spare*(R - T_last), piece n/(C*p*K)");
}

/// What the busiest rank of one node does per phase-1/3 round and ring position (see hierLongest).
struct HierNodeLoad {
  double p1Puts = 0;    ///< messages per phase-1 round and piece (shards owned by the node's other ranks)
  double perOwner = 0;  ///< phase-1 reductions and phase-3 messages per round and piece (owned shards x (G-1))
  double owned = 0;     ///< units per ring position (owned shards)
  bool phases = false;  ///< the node has several ranks (phases 1 and 3 exist)
};

/// Hierarchical with several ranks on some node: the longest path through the lanes of the ranks (mover:
/// phase-1 rounds then phase-3 rounds; reducer: phase-1 groups interleaved with ring reductions in the
/// generator's order; sender: ring reduce-scatter then all-gather) as a max-plus recurrence over the K
/// groups and the 2L ring sends. `nodes` holds one representative per node, fed by its ring predecessor
/// (node n-1); with equal nodes every rank runs the same step sequence at the same times, so one
/// representative that is its own predecessor is exact. Otherwise each representative carries its node's
/// heaviest loads, which bounds every rank of the node from above. The chains have constant prices: this
/// is the closed form's evaluation in O(nodes x (M Kr + K)), not a simulation of ranks.
PathCounts hierLongest(const UnitPrices& u, const HierGeometry& geo, const std::vector<HierNodeLoad>& nodes) {
  const Longest longest(&u);
  const auto N = static_cast<uint32_t>(nodes.size());
  const uint32_t K = static_cast<uint32_t>(geo.groups.size()), Kr = geo.ringChunks, L = geo.ringSteps;
  const PathCounts zero;
  std::vector<PathCounts> put(K), reduce(K);
  for (uint32_t t = 0; t < K; ++t) {
    const double pieces = geo.twoPieces[t] ? 2 : 1, units = double(geo.groups[t].size);
    put[t] = nvGroup(pieces, units);
    reduce[t] = redGroup(pieces, units);
  }
  struct State {
    std::vector<PathCounts> a, q, x, rho;  // mover rounds, phase-1 groups, sends, ring reductions
    PathCounts red, snd;
    uint32_t next = 0;
  };
  std::vector<State> st(N);
  auto phase1Through = [&](uint32_t n, uint32_t last) {
    State& s = st[n];
    for (; s.next <= last && s.next < K; ++s.next) s.q[s.next] = s.red = longest(s.red, s.a[s.next]) + nodes[n].perOwner * reduce[s.next];
  };
  for (uint32_t n = 0; n < N; ++n) {
    State& s = st[n];
    s.a.resize(K);
    s.q.resize(K);
    s.x.resize(2 * size_t(L));
    s.rho.resize(L);
    for (uint32_t t = 0; t < K; ++t) s.a[t] = (t ? s.a[t - 1] : zero) + nodes[n].p1Puts * put[t];  // back to back
    if (nodes[n].phases) phase1Through(n, geo.groupOf[Kr - 1]);
  }
  auto pred = [&](uint32_t n) { return (n + N - 1) % N; };
  for (uint32_t i = 0; i < 2 * L; ++i) {
    for (uint32_t n = 0; n < N; ++n) {
      State& s = st[n];
      PathCounts ready = zero;  // a node of one rank sends its own input at once
      if (i < Kr && nodes[n].phases) ready = s.q[geo.groupOf[i]] + flagHop();
      if (i >= Kr) ready = i < L + Kr ? s.rho[i - Kr] + flagHop() : st[pred(n)].x[i - Kr];
      s.x[i] = s.snd = longest(s.snd, ready) + nodes[n].owned * netMsg();
    }
    if (i >= L) continue;
    for (uint32_t n = 0; n < N; ++n) {
      State& s = st[n];
      if (nodes[n].phases) phase1Through(n, geo.groupOf[i + Kr]);
      s.rho[i] = s.red = longest(s.red, st[pred(n)].x[i]) + nodes[n].owned * redMsg();
    }
  }
  PathCounts total = zero;
  for (uint32_t n = 0; n < N; ++n) {
    const State& s = st[n];
    PathCounts end = s.red;
    if (L > 0) end = longest({end, s.x[2 * L - 1], st[pred(n)].x[2 * L - 1]});
    if (nodes[n].phases) {
      PathCounts mover = s.a[K - 1];
      for (uint32_t t = 0; t < K; ++t) {
        const auto q0 = static_cast<uint32_t>(geo.groups[t].begin), q1 = static_cast<uint32_t>(geo.groups[t].end());
        PathCounts available = zero;
        if (L == 0) available = s.q[t] + flagHop();
        if (L > 0 && q0 < L) available = longest(available, st[pred(n)].x[L + std::min(q1, L) - 1]);
        if (L > 0 && q1 > L) available = longest(available, s.rho[q1 - 1 - Kr] + flagHop());
        mover = longest(mover, available) + nodes[n].perOwner * put[t];
      }
      end = longest(end, mover);
    }
    total = n ? longest(total, end) : end;
  }
  return total;
}

/// A network message of `units` units in `pieces` steps.
PathCounts netGroup(double pieces, double units) {
  PathCounts c;
  c.netA = pieces;
  c.netB = units;
  return c;
}

/// Hierarchical with inter = "rhd": the longest path through the lanes, as a max-plus recurrence over the K
/// chunks and the 2 log2(M2) exchanges of each, one representative per node (its busiest rank's loads) fed
/// by its partners' representatives (docs/algorithms-allreduce.md, "hierarchical, rhd"). A unit is one chunk
/// of a shard; the half exchanged at step j costs ceil(chunk / 2^(j+1)) / chunk units (exact when the chunk
/// divides by M2, and never below the real half otherwise). With equal nodes every rank of a node runs the
/// same steps at the same times, so the recurrence is the timeline; uneven nodes make it a bound.
PathCounts rhdLongest(const UnitPrices& u, uint32_t K, uint64_t chunkMax, const std::vector<HierNodeLoad>& nodes) {
  const Longest longest(&u);
  const auto M = static_cast<uint32_t>(nodes.size());
  const RhdPlan plan = rhdPlan(M);
  const uint32_t J = plan.steps, M2 = plan.pow2;
  std::vector<double> frac(J);
  for (uint32_t j = 0; j < J; ++j)
    frac[j] = double((chunkMax + (uint64_t(1) << (j + 1)) - 1) >> (j + 1)) / double(chunkMax);
  const PathCounts zero, put = nvGroup(1, 1), red1 = redGroup(1, 1);
  struct State {
    PathCounts red, snd, mu, ready, finalReady, arrivals, fold, back;
    std::vector<PathCounts> rs, ag;  // this chunk's send ends per step
  };
  std::vector<State> st(M);
  for (uint32_t n = 0; n < M; ++n) {
    st[n].rs.resize(J);
    st[n].ag.resize(J);
  }
  std::vector<std::vector<PathCounts>> rounds(M, std::vector<PathCounts>(K));
  for (uint32_t n = 0; n < M; ++n)
    for (uint32_t t = 0; t < K; ++t) rounds[n][t] = (t ? rounds[n][t - 1] : zero) + nodes[n].p1Puts * put;
  for (uint32_t n = 0; n < M; ++n) st[n].mu = rounds[n][K - 1];
  auto partner = [&](uint32_t n, uint32_t j) { return n ^ plan.distance(j); };
  for (uint32_t t = 0; t < K; ++t) {
    for (uint32_t n = 0; n < M; ++n) {  // phase-1 group t on the reducer
      State& s = st[n];
      s.ready = zero;  // a node of one rank sends its own input at once
      if (nodes[n].phases) {
        s.red = longest(s.red, rounds[n][t]) + nodes[n].perOwner * red1;
        s.ready = s.red + flagHop();
      }
    }
    for (uint32_t n = M2; n < M; ++n) st[n].fold = st[n].snd = longest(st[n].snd, st[n].ready) + nodes[n].owned * netGroup(1, 1);
    for (uint32_t n = 0; n < plan.extra; ++n) {
      State& s = st[n];
      s.red = longest(s.red, st[n + M2].fold) + nodes[n].owned * red1;
      s.ready = s.red + flagHop();
    }
    for (uint32_t j = 0; j < J; ++j) {
      for (uint32_t n = 0; n < M2; ++n)
        st[n].rs[j] = st[n].snd = longest(st[n].snd, st[n].ready) + nodes[n].owned * netGroup(1, frac[j]);
      for (uint32_t n = 0; n < M2; ++n) {
        State& s = st[n];
        s.red = longest(s.red, st[partner(n, j)].rs[j]) + nodes[n].owned * redGroup(1, frac[j]);
        s.ready = s.red + flagHop();
      }
    }
    for (uint32_t k = 0; k < J; ++k) {
      const uint32_t j = J - 1 - k;
      for (uint32_t n = 0; n < M2; ++n) {
        const PathCounts ready = k == 0 ? st[n].ready : st[partner(n, j + 1)].ag[k - 1];
        st[n].ag[k] = longest(st[n].snd, ready) + nodes[n].owned * netGroup(1, frac[j]);
      }
      for (uint32_t n = 0; n < M2; ++n) st[n].snd = st[n].ag[k];
    }
    for (uint32_t n = 0; n < M2; ++n) {  // this chunk is final on node n
      State& s = st[n];
      s.finalReady = s.ready;
      for (uint32_t k = 0; k < J; ++k) s.finalReady = longest(s.finalReady, st[partner(n, J - 1 - k)].ag[k]);
      s.arrivals = longest(s.arrivals, s.finalReady);
    }
    for (uint32_t n = 0; n < plan.extra; ++n) {
      State& s = st[n];
      st[n + M2].back = s.snd = longest(s.snd, s.finalReady) + nodes[n].owned * netGroup(1, 1);
      st[n + M2].finalReady = st[n + M2].back;
      st[n + M2].arrivals = longest(st[n + M2].arrivals, st[n + M2].back);
    }
    for (uint32_t n = 0; n < M; ++n)  // phase 3: chunk t to the node's other ranks
      if (nodes[n].phases) st[n].mu = longest(st[n].mu, st[n].finalReady) + nodes[n].perOwner * put;
  }
  PathCounts total = zero;
  for (uint32_t n = 0; n < M; ++n) {
    const State& s = st[n];
    PathCounts end = longest({s.red, s.snd, nodes[n].phases ? s.mu : s.arrivals});
    total = n ? longest(total, end) : end;
  }
  return total;
}

/// The busiest rank's loads of each of the first `nodes` nodes: a rank owns ceil(S/size) shards and sends the
/// rest in phase 1.
std::vector<HierNodeLoad> hierNodeLoads(const CostContext& c, uint32_t nodes) {
  const double S = c.gen.maxLocal;
  std::vector<HierNodeLoad> loads;
  for (uint32_t n = 0; n < nodes; ++n) {
    const double size = double(c.gen.nodeRanks[n].size()), own = std::ceil(S / size);
    HierNodeLoad l;
    l.p1Puts = S - std::floor(S / size);
    l.perOwner = own * (size - 1);
    l.owned = own;
    l.phases = size > 1;
    loads.push_back(l);
  }
  return loads;
}

CostEstimate costHierarchical(const CostContext& c) {
  if (c.opt.inter == InterPhase::Auto) {  // the cheaper variant under this profile
    GenOptions resolved = c.opt;
    resolved.inter = resolveInter(c.spec, c.gen.nodeOf, c.opt, c.profile);
    const GenContext gen = makeContext(c.spec, c.gen.nodeOf, resolved);
    return costHierarchical(CostContext{c.spec, resolved, c.topo, gen, c.profile});
  }
  const Shape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const uint32_t S = s.gMax, M = s.nodes;
  if (useRhd(c.gen)) {
    const Range shard0 = splitRange(s.part0, S, 0);
    const uint64_t chunkMax = splitRange(shard0, c.opt.chunks, 0).size;
    const UnitPrices u = unitPrices(c, chunkMax, true);
    const RhdPlan plan = rhdPlan(M);
    // Every node: a node's partners differ in role (host, extra, plain), so even nodes need all of them.
    return estimate(u, rhdLongest(u, c.opt.chunks, chunkMax, hierNodeLoads(c, M)),
                    "hierarchical, rhd: longest path of the chunk/exchange recurrence (docs); one chunk alone: "
                    "D + S1 + R1 + F + sum_j (t_net(h_j) + t_red(h_j) + F) + sum_j t_net(h_j) + S1, "
                    "h_j = chunk/2^(j+1), M2 = " +
                        std::to_string(plan.pow2) + " nodes exchange in " + std::to_string(plan.steps) +
                        " steps" + (plan.extra ? ", " + std::to_string(plan.extra) + " fold in and out" : "") +
                        ", S1 = (G-1)*t_nv(chunk), unit = chunk n/(C*G*K)");
  }
  const HierGeometry geo = hierGeometry(S, M, c.opt.chunks);
  const Range unit0 = splitRange(splitRange(splitRange(s.part0, S, 0), M, 0), geo.ringChunks, 0);
  const UnitPrices u = unitPrices(c, unit0.size, M > 1);
  if (S == 1) {  // one rank per node: exactly the ring over the M nodes
    const Range block0 = splitRange(splitRange(s.part0, S, 0), M, 0);
    return estimate(u, ringLongest(u, M, 1, chunksOf(block0.size, c.opt.chunks), true, true),
                    "hierarchical, one rank per node = ring over M nodes: see ring, piece n/(C*M*K)");
  }
  // Equal nodes: one representative that is its own ring predecessor is exact.
  return estimate(u, hierLongest(u, geo, hierNodeLoads(c, s.evenNodes ? 1 : M)),
                  M == 1 ? "hierarchical, one node: D + max(2K*S1, 2*S1 + R1 + F + (K-1)*max(S1, R1)), "
                           "S1 = (G-1)*t_nv, R1 = (G-1)*t_red, piece n/(C*G*K)"
                         : "hierarchical: longest path of the group/ring recurrence (docs), bandwidth-bound "
                           "D + S1(0) + R1(0) + F + 2(M-1)Kr*t_net + S1(K-1), NVLink-bound D + 2*sum S1(t), "
                           "S1(t) = (G-1)*(pieces*a_nv + units*b_nv), R1(t) likewise with red, "
                           "unit n/(C*G*M*Kr), Kr = ceil(K/M)");
}

}  // namespace

const std::vector<AlgorithmDef>& allReduceAlgorithms() {
  static const std::vector<AlgorithmDef> defs = {
      {CollOp::AllReduce, "one-shot",
       "every rank sends its data to every peer and reduces all p contributions in rank order (latency-optimal)",
       setupOneShot, emitOneShot, costOneShot, /*peersTouchUser=*/false},
      {CollOp::AllReduce, "two-shot",
       "direct reduce-scatter (rank j reduces shard j) then direct all-gather (2 hops, bandwidth-optimal)",
       setupTwoShot, emitTwoShot, costTwoShot},
      {CollOp::AllReduce, "ring",
       "ring reduce-scatter then ring all-gather over all ranks in rank order, K chunks per step",
       setupRing, emitRing, costRing},
      {CollOp::AllReduce, "hierarchical",
       "NVLink reduce-scatter in each node, ring all-reduce of each shard across nodes, NVLink all-gather",
       setupHierarchical, emitHierarchical, costHierarchical},
  };
  return defs;
}

}  // namespace mk::detail
