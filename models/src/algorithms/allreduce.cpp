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
//  * Flags: every flag has one purpose; where increments come from several sources the flag is per chunk
//    (so any threshold can only be reached by that chunk's data), otherwise its increments come from one
//    lane in one order and a running count is the threshold.
//  * Pieces that come out empty (counts that do not divide evenly) emit nothing on every side, so flag
//    accounting stays consistent without zero-byte messages.
//  * Peer order is staggered: rank r visits (r + i) % p for i = 1..p-1.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <sstream>
#include <string>
#include <tuple>
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

uint16_t scratchId(const GenContext& ctx) {
  if (ctx.scratch < 0) throw Error(ErrorCode::Internal, "all-reduce generator used scratch without declaring it");
  return static_cast<uint16_t>(ctx.scratch);
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
  const uint16_t scratch = scratchId(ctx);
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
  const uint16_t scratch = scratchId(ctx);
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
    const uint32_t red = lanes.reducer(j);
    for (uint32_t k = 0; k < chunks; ++k) {
      const Range u = unit(j, k);
      if (u.size == 0) continue;
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
  for (uint32_t r = 0; r < p; ++r) b.waitAllSent(r, lanes.reducer(r), gathered);
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
  const uint16_t scratch = scratchId(ctx);
  const uint32_t chunks = ctx.opt.chunks;
  auto unit = [&](uint32_t blockIdx, uint32_t k) { return splitRange(splitRange(part, p, blockIdx), chunks, k); };
  // All three flags have a single source lane each (predecessor's sender, own reducer), so running
  // counts in emission order are exact thresholds.
  const uint32_t rsArrived = b.newFlag();
  const uint32_t agArrived = b.newFlag();
  const uint32_t reduced = b.newFlag();
  for (uint32_t r = 0; r < p; ++r) {
    const uint32_t succ = (r + 1) % p;
    const uint32_t send = lanes.to(r, succ);
    const uint32_t red = lanes.reducer(r);
    uint64_t readyIdx = 0, agIdx = 0, rsIdx = 0;
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (r + p - s) % p;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        if (s > 0) b.wait(r, send, reduced, ++readyIdx);
        const BufRef src = s == 0 ? SB::ref(r, ctx.input, u.begin) : SB::ref(r, scratch, u.begin);
        b.put(r, send, SB::ref(succ, scratch, u.begin), src, u.size, rsArrived);
      }
    }
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (r + 1 + p - s) % p;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        if (s == 0)
          b.wait(r, send, reduced, ++readyIdx);
        else
          b.wait(r, send, agArrived, ++agIdx);
        b.put(r, send, SB::ref(succ, ctx.output, u.begin), SB::ref(r, ctx.output, u.begin), u.size, agArrived);
      }
    }
    for (uint32_t s = 0; s + 1 < p; ++s) {
      const uint32_t blockIdx = (r + 2 * p - 1 - s) % p;
      const uint16_t dst = s + 2 < p ? scratch : ctx.output;
      for (uint32_t k = 0; k < chunks; ++k) {
        const Range u = unit(blockIdx, k);
        if (u.size == 0) continue;
        b.wait(r, red, rsArrived, ++rsIdx);
        b.reduce(r, red, SB::ref(r, dst, u.begin), SB::ref(r, scratch, u.begin), SB::ref(r, ctx.input, u.begin), u.size);
        b.signal(r, red, r, reduced);
      }
    }
  }
  // The last all-gather step is not forwarded: the reducer waits for it so the op ends with every block.
  for (uint32_t r = 0; r < p; ++r) b.waitAllSent(r, lanes.reducer(r), agArrived);
}

// ---------------------------------------------------------------------------------------------------
// hierarchical: intra-node reduce-scatter (NVLink), inter-node ring all-reduce of each shard among its
// owners (one per node), intra-node all-gather.
//
// The part is cut into S = maxLocal shards; shard s is owned on node n by nodeRanks[n][s % size_n]. Each
// shard is cut into M blocks (the inter-node ring's blocks) and each block into K chunks: a "unit"
// (s, block, k) is the granule of every phase, so phase 2 can start on a block while phase 1 still works
// on the next one. The owner accumulates phase 1 into its output (the ring then reduces in place there);
// a node of one rank uses its input as the accumulator. Scratch: S phase-1 slots (by source local index)
// when S > 1, then one ring-receive slot when M > 1, each `count` elements addressed by element offset.

struct HierLayout {
  uint32_t shards = 0;   ///< S
  uint32_t nodes = 0;    ///< M
  uint64_t p1Base = 0;   ///< scratch offset of phase-1 slot 0
  uint64_t ringBase = 0; ///< scratch offset of the ring-receive slot
  uint64_t scratchCount = 0;
};

HierLayout hierLayout(const GenContext& ctx) {
  HierLayout h;
  h.shards = ctx.maxLocal;
  h.nodes = ctx.nNodes();
  const uint64_t p1Slots = h.shards > 1 ? h.shards : 0;
  h.ringBase = checkedProduct(p1Slots, ctx.spec.count, "hierarchical (maxLocal x count)");
  h.scratchCount = h.ringBase + (h.nodes > 1 ? ctx.spec.count : 0);
  if (h.scratchCount < h.ringBase) throw Error(ErrorCode::InvalidArgument, "hierarchical scratch size overflows 64 bits");
  return h;
}

void setupHierarchical(ScheduleBuilder& b, GenContext& ctx) {
  const HierLayout h = hierLayout(ctx);
  if (h.scratchCount > 0) ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch, h.scratchCount);
}

void emitHierarchical(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  if (ctx.nRanks == 1) return emitLocalCopy(b, ctx, channel, part);
  ChannelLanes lanes(b, ctx, channel);
  const HierLayout h = hierLayout(ctx);
  const uint32_t S = h.shards, M = h.nodes, chunks = ctx.opt.chunks;
  const uint64_t count = ctx.spec.count;
  const uint16_t scratch = h.scratchCount > 0 ? scratchId(ctx) : 0;
  auto unit = [&](uint32_t s, uint32_t blockIdx, uint32_t k) {
    return splitRange(splitRange(splitRange(part, S, s), M, blockIdx), chunks, k);
  };
  auto size = [&](uint32_t n) { return static_cast<uint32_t>(ctx.nodeRanks[n].size()); };
  auto owner = [&](uint32_t n, uint32_t s) { return ctx.nodeRanks[n][s % size(n)]; };
  auto ordinal = [&](uint32_t n, uint32_t s) { return s / size(n); };  // which of its shards s is, for its owner
  uint32_t minSize = ctx.maxLocal;
  for (uint32_t n = 0; n < M; ++n) minSize = std::min(minSize, size(n));
  const uint32_t maxOwned = (S + minSize - 1) / minSize;

  // Flags. Phase 1: one per source local index (a source sends to an owner in the owner's reduce order).
  // Per owned shard (ordinal): ring arrivals of reduce-scatter / all-gather (one predecessor each) and the
  // reducer's "result ready" self-signal. Phase 3: one total.
  std::vector<uint32_t> p1Flag(S > 1 ? S : 0), rsFlag, agFlag, readyFlag(maxOwned);
  for (auto& f : p1Flag) f = b.newFlag();
  if (M > 1) {
    rsFlag.resize(maxOwned);
    agFlag.resize(maxOwned);
    for (auto& f : rsFlag) f = b.newFlag();
    for (auto& f : agFlag) f = b.newFlag();
  }
  for (auto& f : readyFlag) f = b.newFlag();
  const uint32_t p3Flag = S > 1 ? b.newFlag() : 0;

  for (uint32_t n = 0; n < M; ++n) {
    const uint32_t G = size(n);
    const uint32_t succNode = (n + 1) % M;
    for (uint32_t li = 0; li < G; ++li) {
      const uint32_t r = ctx.nodeRanks[n][li];
      const uint16_t acc = G == 1 ? ctx.input : ctx.output;  // where this rank's node partial lives
      // Phase 1 sends, in the order every owner reduces: ring blocks n, n-1, ..., then chunk, then shard.
      for (uint32_t t = 0; t < M && G > 1; ++t) {
        const uint32_t blockIdx = (n + M - t) % M;
        for (uint32_t k = 0; k < chunks; ++k)
          for (uint32_t i = 1; i < G; ++i) {
            const uint32_t peer = ctx.nodeRanks[n][(li + i) % G];
            for (uint32_t s = (li + i) % G; s < S; s += G) {
              const Range u = unit(s, blockIdx, k);
              if (u.size == 0) continue;
              b.put(r, lanes.mover(r), SB::ref(peer, scratch, h.p1Base + uint64_t(li) * count + u.begin),
                    SB::ref(r, ctx.input, u.begin), u.size, p1Flag[li]);
            }
          }
      }
      // Reducer: phase-1 reduction of owned shards in local-rank order, then the ring's reductions.
      std::vector<uint64_t> p1Count(G, 0), readySent(maxOwned, 0), rsCount(maxOwned, 0);
      std::map<std::tuple<uint32_t, uint32_t>, uint64_t> finalReady;  // (s, k) of block n+1 -> threshold
      if (G > 1) {
        const uint32_t red = lanes.reducer(r);
        for (uint32_t t = 0; t < M; ++t) {
          const uint32_t blockIdx = (n + M - t) % M;
          for (uint32_t k = 0; k < chunks; ++k)
            for (uint32_t s = li; s < S; s += G) {
              const Range u = unit(s, blockIdx, k);
              if (u.size == 0) continue;
              for (uint32_t l = 0; l < G; ++l)
                if (l != li) b.wait(r, red, p1Flag[l], ++p1Count[l]);
              auto x = [&](uint32_t l) {
                return l == li ? SB::ref(r, ctx.input, u.begin)
                               : SB::ref(r, scratch, h.p1Base + uint64_t(l) * count + u.begin);
              };
              reduceChain(b, r, red, SB::ref(r, ctx.output, u.begin), G, x, u.size);
              // The ring's first send needs block n; with one node the result is final.
              if (t == 0) {
                b.signal(r, red, r, readyFlag[ordinal(n, s)]);
                ++readySent[ordinal(n, s)];
                if (M == 1) finalReady[{s, k}] = readySent[ordinal(n, s)];
              }
            }
        }
      }
      if (M > 1) {
        const uint32_t red = lanes.reducer(r);
        for (uint32_t st = 0; st + 1 < M; ++st) {
          const uint32_t blockIdx = (n + 2 * M - 1 - st) % M;
          const bool last = st + 2 == M;
          for (uint32_t k = 0; k < chunks; ++k)
            for (uint32_t s = li; s < S; s += G) {
              const Range u = unit(s, blockIdx, k);
              if (u.size == 0) continue;
              const uint32_t m = ordinal(n, s);
              b.wait(r, red, rsFlag[m], ++rsCount[m]);
              const BufRef dst = last ? SB::ref(r, ctx.output, u.begin) : SB::ref(r, scratch, h.ringBase + u.begin);
              b.reduce(r, red, dst, SB::ref(r, scratch, h.ringBase + u.begin), SB::ref(r, acc, u.begin), u.size);
              b.signal(r, red, r, readyFlag[m]);
              ++readySent[m];
              if (last) finalReady[{s, k}] = readySent[m];
            }
        }
        // Sender: the ring's reduce-scatter then all-gather, all hops cross-node.
        const uint32_t send = lanes.sender(r);
        std::vector<uint64_t> readyWait(maxOwned, 0), agWait(maxOwned, 0);
        for (uint32_t st = 0; st + 1 < M; ++st) {
          const uint32_t blockIdx = (n + M - st) % M;
          for (uint32_t k = 0; k < chunks; ++k)
            for (uint32_t s = li; s < S; s += G) {
              const Range u = unit(s, blockIdx, k);
              if (u.size == 0) continue;
              const uint32_t m = ordinal(n, s);
              if (st > 0 || G > 1) b.wait(r, send, readyFlag[m], ++readyWait[m]);
              const BufRef src = st == 0 ? SB::ref(r, acc, u.begin) : SB::ref(r, scratch, h.ringBase + u.begin);
              b.put(r, send, SB::ref(owner(succNode, s), scratch, h.ringBase + u.begin), src, u.size,
                    rsFlag[ordinal(succNode, s)]);
            }
        }
        for (uint32_t st = 0; st + 1 < M; ++st) {
          const uint32_t blockIdx = (n + 1 + M - st) % M;
          for (uint32_t k = 0; k < chunks; ++k)
            for (uint32_t s = li; s < S; s += G) {
              const Range u = unit(s, blockIdx, k);
              if (u.size == 0) continue;
              const uint32_t m = ordinal(n, s);
              if (st == 0)
                b.wait(r, send, readyFlag[m], ++readyWait[m]);
              else
                b.wait(r, send, agFlag[m], ++agWait[m]);
              b.put(r, send, SB::ref(owner(succNode, s), ctx.output, u.begin), SB::ref(r, ctx.output, u.begin), u.size,
                    agFlag[ordinal(succNode, s)]);
            }
        }
      }
      // Phase 3: forward every final unit of the owned shards to the node's other ranks, in the order the
      // units become final (own block first, then the all-gather's arrivals).
      if (G > 1) {
        std::vector<uint64_t> agSeen(maxOwned, 0);
        for (uint32_t t = 0; t < M; ++t) {
          const uint32_t blockIdx = (n + 1 + M - t) % M;
          for (uint32_t k = 0; k < chunks; ++k)
            for (uint32_t s = li; s < S; s += G) {
              const Range u = unit(s, blockIdx, k);
              if (u.size == 0) continue;
              const uint32_t m = ordinal(n, s);
              if (t == 0)
                b.wait(r, lanes.mover(r), readyFlag[m], finalReady.at({s, k}));
              else
                b.wait(r, lanes.mover(r), agFlag[m], ++agSeen[m]);
              for (uint32_t i = 1; i < G; ++i) {
                const uint32_t peer = ctx.nodeRanks[n][(li + i) % G];
                b.put(r, lanes.mover(r), SB::ref(peer, ctx.output, u.begin), SB::ref(r, ctx.output, u.begin), u.size,
                      p3Flag);
              }
            }
        }
      }
    }
  }
  // Completion: a rank ends holding every shard. Non-owned shards arrive in phase 3; with one rank per
  // node the last all-gather arrivals are not forwarded, so the reducer waits for them.
  for (uint32_t r = 0; r < ctx.nRanks; ++r) {
    const uint32_t n = ctx.nodeOf[r];
    if (S > 1) b.waitAllSent(r, lanes.reducer(r), p3Flag);
    if (M > 1 && size(n) == 1)
      for (uint32_t m = 0; m < maxOwned; ++m) b.waitAllSent(r, lanes.reducer(r), agFlag[m]);
  }
}

// ---------------------------------------------------------------------------------------------------
// Closed forms: see the bottom half of this file (added below).

CostEstimate costOneShot(const CostContext& c);
CostEstimate costTwoShot(const CostContext& c);
CostEstimate costRing(const CostContext& c);
CostEstimate costHierarchical(const CostContext& c);

}  // namespace

const std::vector<AlgorithmDef>& allReduceAlgorithms() {
  static const std::vector<AlgorithmDef> defs = {
      {CollOp::AllReduce, "one-shot",
       "every rank sends its data to every peer and reduces all p contributions in rank order (latency-optimal)",
       setupOneShot, emitOneShot, costOneShot},
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

namespace {
CostEstimate costOneShot(const CostContext&) { return {}; }
CostEstimate costTwoShot(const CostContext&) { return {}; }
CostEstimate costRing(const CostContext&) { return {}; }
CostEstimate costHierarchical(const CostContext&) { return {}; }
}  // namespace

}  // namespace mk::detail
