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

/// Final wait of `rank`'s reducer for everything sent to `flag`; emits nothing (and creates no lane) when
/// nothing was sent, e.g. when every piece this rank would receive is empty.
void waitForAll(ScheduleBuilder& b, ChannelLanes& lanes, uint32_t rank, uint32_t flag) {
  const uint64_t n = b.signalsSent(rank, flag);
  if (n > 0) b.wait(rank, lanes.reducer(rank), flag, n);
}

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
// The part is cut into S = maxLocal shards; shard s is owned on node n by nodeRanks[n][s % size_n]. Each
// shard is cut into M blocks (the inter-node ring's blocks) and each block into K chunks: a "unit"
// (s, block, k) is the granule of every phase, so phase 2 can start on a block while phase 1 still works
// on the next one. The owner accumulates phase 1 into its output (the ring then reduces in place there);
// a node of one rank uses its input as the accumulator.
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

HierLayout hierLayout(const GenContext& ctx) {
  HierLayout h;
  h.shards = ctx.maxLocal;
  h.nodes = ctx.nNodes();
  uint32_t minSize = ctx.maxLocal;
  for (const auto& n : ctx.nodeRanks) minSize = std::min(minSize, static_cast<uint32_t>(n.size()));
  h.maxOwned = (h.shards + minSize - 1) / minSize;
  h.slot = hierChannelBase(ctx, h.maxOwned, effectiveChannels(ctx));
  const uint64_t slots = (h.shards > 1 ? h.shards : 0) + (h.nodes > 1 ? 1 : 0);
  h.ringBase = checkedProduct(h.shards > 1 ? h.shards : 0, h.slot, "hierarchical (maxLocal x shard)");
  h.scratchCount = checkedProduct(slots, h.slot, "hierarchical (slots x shard)");
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
  const uint32_t S = h.shards, M = h.nodes, chunks = ctx.opt.chunks, maxOwned = h.maxOwned;
  const uint16_t scratch = h.scratchCount > 0 ? scratchId(ctx) : 0;
  auto unit = [&](uint32_t s, uint32_t blockIdx, uint32_t k) {
    return splitRange(splitRange(splitRange(part, S, s), M, blockIdx), chunks, k);
  };
  auto size = [&](uint32_t n) { return static_cast<uint32_t>(ctx.nodeRanks[n].size()); };
  auto owner = [&](uint32_t n, uint32_t s) { return ctx.nodeRanks[n][s % size(n)]; };
  auto ordinal = [&](uint32_t n, uint32_t s) { return s / size(n); };  // which of its shards s is, for its owner
  // Where element `e` of shard s lives in a slot of the shard's owner on node n.
  const uint64_t chanBase = hierChannelBase(ctx, maxOwned, channel);
  const uint64_t shardStride = splitRange(part, S, 0).size;
  auto inSlot = [&](uint32_t n, uint32_t s, uint64_t e) {
    return chanBase + uint64_t(ordinal(n, s)) * shardStride + (e - splitRange(part, S, s).begin);
  };
  auto p1Slot = [&](uint32_t n, uint32_t sourceLocal, uint32_t s, uint64_t e) {
    return uint64_t(sourceLocal) * h.slot + inSlot(n, s, e);
  };
  auto ringSlot = [&](uint32_t n, uint32_t s, uint64_t e) { return h.ringBase + inSlot(n, s, e); };

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
              b.put(r, lanes.mover(r), SB::ref(peer, scratch, p1Slot(n, li, s, u.begin)),
                    SB::ref(r, ctx.input, u.begin), u.size, p1Flag[li]);
            }
          }
      }
      // Reducer: phase-1 reduction of owned shards in local-rank order, interleaved with the ring's
      // reductions so that ring step st only waits for the phase-1 unit it consumes (block n-1-st, chunk k),
      // not for the whole of phase 1.
      std::vector<uint64_t> p1Count(G, 0), readySent(maxOwned, 0), rsCount(maxOwned, 0);
      std::map<std::tuple<uint32_t, uint32_t>, uint64_t> finalReady;  // (s, k) of block n+1 -> threshold
      auto phase1 = [&](uint32_t t, uint32_t k) {
        if (G == 1) return;
        const uint32_t blockIdx = (n + M - t) % M;
        for (uint32_t s = li; s < S; s += G) {
          const Range u = unit(s, blockIdx, k);
          if (u.size == 0) continue;
          for (uint32_t l = 0; l < G; ++l)
            if (l != li) b.wait(r, lanes.reducer(r), p1Flag[l], ++p1Count[l]);
          auto x = [&](uint32_t l) {
            return l == li ? SB::ref(r, ctx.input, u.begin) : SB::ref(r, scratch, p1Slot(n, l, s, u.begin));
          };
          reduceChain(b, r, lanes.reducer(r), SB::ref(r, ctx.output, u.begin), G, x, u.size);
          // The ring's first send needs block n; with one node the result is final.
          if (t == 0) {
            const uint32_t m = ordinal(n, s);
            b.signal(r, lanes.reducer(r), r, readyFlag[m]);
            ++readySent[m];
            if (M == 1) finalReady[{s, k}] = readySent[m];
          }
        }
      };
      auto ringReduce = [&](uint32_t st, uint32_t k) {
        const uint32_t blockIdx = (n + 2 * M - 1 - st) % M;
        const bool last = st + 2 == M;
        for (uint32_t s = li; s < S; s += G) {
          const Range u = unit(s, blockIdx, k);
          if (u.size == 0) continue;
          const uint32_t m = ordinal(n, s);
          const uint32_t red = lanes.reducer(r);
          b.wait(r, red, rsFlag[m], ++rsCount[m]);
          const BufRef dst = last ? SB::ref(r, ctx.output, u.begin) : SB::ref(r, scratch, ringSlot(n, s, u.begin));
          b.reduce(r, red, dst, SB::ref(r, scratch, ringSlot(n, s, u.begin)), SB::ref(r, acc, u.begin), u.size);
          b.signal(r, red, r, readyFlag[m]);
          ++readySent[m];
          if (last) finalReady[{s, k}] = readySent[m];
        }
      };
      for (uint32_t k = 0; k < chunks; ++k) phase1(0, k);
      for (uint32_t st = 0; st + 1 < M; ++st)
        for (uint32_t k = 0; k < chunks; ++k) {
          phase1(st + 1, k);
          ringReduce(st, k);
        }
      if (M > 1) {
        // Sender: the ring's reduce-scatter then all-gather, all hops cross-node.
        auto send = [&] { return lanes.sender(r); };
        std::vector<uint64_t> readyWait(maxOwned, 0), agWait(maxOwned, 0);
        for (uint32_t st = 0; st + 1 < M; ++st) {
          const uint32_t blockIdx = (n + M - st) % M;
          for (uint32_t k = 0; k < chunks; ++k)
            for (uint32_t s = li; s < S; s += G) {
              const Range u = unit(s, blockIdx, k);
              if (u.size == 0) continue;
              const uint32_t m = ordinal(n, s);
              if (st > 0 || G > 1) b.wait(r, send(), readyFlag[m], ++readyWait[m]);
              const BufRef src = st == 0 ? SB::ref(r, acc, u.begin) : SB::ref(r, scratch, ringSlot(n, s, u.begin));
              b.put(r, send(), SB::ref(owner(succNode, s), scratch, ringSlot(succNode, s, u.begin)), src, u.size,
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
                b.wait(r, send(), readyFlag[m], ++readyWait[m]);
              else
                b.wait(r, send(), agFlag[m], ++agWait[m]);
              b.put(r, send(), SB::ref(owner(succNode, s), ctx.output, u.begin), SB::ref(r, ctx.output, u.begin), u.size,
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
    if (S > 1) waitForAll(b, lanes, r, p3Flag);
    if (M > 1 && size(n) == 1)
      for (uint32_t m = 0; m < maxOwned; ++m) waitForAll(b, lanes, r, agFlag[m]);
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

/// A path through the timeline as counts of unit prices.
struct PathCounts {
  double nv = 0, net = 0, red = 0, copy = 0, flag = 0;
  double value(const UnitPrices& u) const { return nv * u.nv() + net * u.net() + red * u.red() + copy * u.copy() + flag * u.flag; }
};
PathCounts operator+(PathCounts a, const PathCounts& b) {
  a.nv += b.nv;
  a.net += b.net;
  a.red += b.red;
  a.copy += b.copy;
  a.flag += b.flag;
  return a;
}
PathCounts operator*(double k, PathCounts a) {
  a.nv *= k;
  a.net *= k;
  a.red *= k;
  a.copy *= k;
  a.flag *= k;
  return a;
}
PathCounts nvMsg() { return PathCounts{1, 0, 0, 0, 0}; }
PathCounts netMsg() { return PathCounts{0, 1, 0, 0, 0}; }
PathCounts redMsg() { return PathCounts{0, 0, 1, 0, 0}; }
PathCounts copyMsg() { return PathCounts{0, 0, 0, 1, 0}; }
PathCounts flagHop() { return PathCounts{0, 0, 0, 0, 1}; }

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
  u.flag = pf.flagUs;
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
  e.latencyUs = u.dispatch + path.nv * u.nvLat + path.net * u.netLat + path.red * u.redLat + path.copy * u.copyLat +
                path.flag * u.flag;
  e.bandwidthUs = path.nv * u.nvBw + path.net * u.netBw + path.copy * u.copyBw;
  e.reduceUs = path.red * u.redBw;
  e.totalUs = u.dispatch + path.value(u);
  std::ostringstream f;
  f << symbolic << "; critical path = D";
  auto term = [&](double n, const char* name) {
    if (n != 0) f << " + " << fmt(n) << "*" << name;
  };
  term(path.nv, "t_nv");
  term(path.net, "t_net");
  term(path.red, "t_red");
  term(path.copy, "t_copy");
  term(path.flag, "F");
  f << " = " << fmt(e.totalUs) << " us with piece " << fmt(u.bytes) << " B, C " << fmt(u.share) << ", D " << fmt(u.dispatch)
    << ", t_nv " << fmt(u.nv()) << ", t_net " << fmt(u.net()) << ", t_red " << fmt(u.red()) << ", t_copy " << fmt(u.copy())
    << ", F " << fmt(u.flag) << " us";
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

/// Hierarchical, several ranks on some node and several nodes: the longest path through the chains of one
/// rank (mover: phase-1 rounds then phase-3 rounds; reducer: phase-1 reductions interleaved with ring
/// reductions; sender: ring reduce-scatter then all-gather) as a max-plus recurrence over the M*K units.
/// The chains have constant prices, so this is the closed form's evaluation, not a simulation of ranks.
PathCounts hierLongest(const UnitPrices& u, uint32_t M, double kd, const PathCounts& s1, const PathCounts& s3,
                       const PathCounts& r1, const PathCounts& rr, const PathCounts& tx) {
  const Longest longest(&u);
  const auto K = static_cast<uint64_t>(kd);
  const uint64_t units = uint64_t(M) * K, L = uint64_t(M - 1) * K;
  const PathCounts zero;
  std::vector<PathCounts> a(units), p0(K), y(L), x(2 * L);
  for (uint64_t j = 0; j < units; ++j) a[j] = (j ? a[j - 1] : zero) + s1;
  PathCounts red = zero, snd = zero;
  for (uint64_t k = 0; k < K; ++k) p0[k] = red = longest(red, a[k]) + r1;
  for (uint64_t i = 0; i < 2 * L; ++i) {
    const PathCounts ready = i < K ? p0[i] + flagHop() : i < L + K ? y[i - K] + flagHop() : x[i - K];
    x[i] = snd = longest(snd, ready) + tx;
    if (i < L) {
      red = longest(red, a[K + i]) + r1;
      y[i] = red = longest(red, x[i]) + rr;
    }
  }
  PathCounts mover = a[units - 1];
  for (uint64_t q = 0; q < units; ++q) {
    const PathCounts available = q < K ? (M == 1 ? p0[q] : y[L - K + q]) + flagHop() : x[L + q - K];
    mover = longest(mover, available) + s3;
  }
  return L > 0 ? longest(mover, x[2 * L - 1]) : mover;
}

CostEstimate costHierarchical(const CostContext& c) {
  const Shape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const uint32_t S = s.gMax, M = s.nodes;
  const Range block0 = splitRange(splitRange(s.part0, S, 0), M, 0);
  const UnitPrices u = unitPrices(c, splitRange(block0, c.opt.chunks, 0).size, M > 1);
  const double k = chunksOf(block0.size, c.opt.chunks);
  if (S == 1)  // one rank per node: exactly the ring over the M nodes
    return estimate(u, ringLongest(u, M, 1, k, true, true),
                    "hierarchical, one rank per node = ring over M nodes: see ring, piece n/(C*M*K)");
  // Per unit and lane, the heaviest rank's work: a rank owns ceil(S/size) shards on its node.
  double p1Puts = 0, perOwnerLocal = 0, owned = 0;
  for (const auto& n : c.gen.nodeRanks) {
    const double size = double(n.size()), own = std::ceil(double(S) / size);
    p1Puts = std::max(p1Puts, double(S) - std::floor(double(S) / size));
    perOwnerLocal = std::max(perOwnerLocal, own * (size - 1));
    owned = std::max(owned, own);
  }
  const PathCounts path = hierLongest(u, M, k, p1Puts * nvMsg(), perOwnerLocal * nvMsg(), perOwnerLocal * redMsg(),
                                      owned * redMsg(), owned * netMsg());
  return estimate(u, path,
                  M == 1 ? "hierarchical, one node: D + max(2K*S1, 2*S1 + R1 + F + (K-1)*max(S1, R1)), "
                           "S1 = (G-1)*t_nv, R1 = (G-1)*t_red, piece n/(C*G*K)"
                         : "hierarchical: longest path of the unit recurrence (docs), bandwidth-bound "
                           "D + S1 + R1 + F + 2(M-1)K*t_net + S1, NVLink-bound D + 2MK*S1, S1 = (G-1)*t_nv, "
                           "R1 = (G-1)*t_red, piece n/(C*p*K)");
}

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

}  // namespace mk::detail
