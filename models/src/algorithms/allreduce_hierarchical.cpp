// mkernel — all-reduce, hierarchical with a ring as its inter-node phase, and the setup and closed form of both
// variants (docs/algorithms-allreduce.md, "hierarchical").
//
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
#include <algorithm>
#include <cmath>
#include <limits>
#include <string>
#include <vector>

#include "allreduce_hierarchical.hpp"
#include "mk/error.hpp"

namespace mk::detail {

uint64_t hierChannelBase(const GenContext& ctx, uint32_t maxOwned, uint32_t channel) {
  uint64_t base = 0;
  for (uint32_t c = 0; c < channel; ++c)
    base += uint64_t(maxOwned) *
            splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), c), ctx.maxLocal, 0).size;
  return base;
}

bool useRhd(const GenContext& ctx) {
  if (ctx.opt.inter != "ring" && ctx.opt.inter != "rhd")
    throw Error(ErrorCode::Internal, "hierarchical: inter '" + ctx.opt.inter + "' reached the generator unresolved");
  return ctx.opt.inter == "rhd" && ctx.nNodes() > 1;
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

namespace {

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

}  // namespace

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
                b.put(r, lanes.mover(r), bufRef(peer, scratch, p1Slot(n, li, s, ps.piece[k].begin)),
                      bufRef(r, ctx.input, ps.piece[k].begin), ps.piece[k].size, p1Flag[li]);
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
                return l == li ? bufRef(r, ctx.input, u.begin) : bufRef(r, scratch, p1Slot(n, l, s, u.begin));
              };
              reduceChain(b, r, red, bufRef(r, ctx.output, u.begin), G, x, u.size);
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
          const BufRef dst = q >= L ? bufRef(r, ctx.output, u.begin) : bufRef(r, scratch, ringSlot(n, s, u.begin));
          b.reduce(r, red, dst, bufRef(r, scratch, ringSlot(n, s, u.begin)), bufRef(r, acc, u.begin), u.size);
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
            BufRef src = bufRef(r, scratch, ringSlot(n, s, u.begin));
            if (i < Kr) {
              src = bufRef(r, acc, u.begin);
              const uint64_t need = G > 1 ? groupsBefore[j][geo.groupOf[i] + 1] : 0;
              if (need > p1Waited[j]) {
                b.wait(r, lanes.sender(r), p1Ready[m], need);
                p1Waited[j] = need;
              }
            } else {
              b.wait(r, lanes.sender(r), ringReady[m], ++readyWait[j]);
            }
            b.put(r, lanes.sender(r), bufRef(owner(succNode, s), scratch, ringSlot(succNode, s, u.begin)), src, u.size,
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
            b.put(r, lanes.sender(r), bufRef(owner(succNode, s), ctx.output, u.begin), bufRef(r, ctx.output, u.begin),
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
                  b.put(r, lanes.mover(r), bufRef(peer, ctx.output, ps.piece[k].begin),
                        bufRef(r, ctx.output, ps.piece[k].begin), ps.piece[k].size, p3Flag);
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

namespace {

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

}  // namespace

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

namespace {

CostEstimate costHierarchical(const CostContext& c) {
  if (c.opt.inter == "auto") {  // the cheaper variant under this profile
    GenOptions resolved = c.opt;
    resolved.inter = resolveInter(c.spec, c.gen.nodeOf, c.opt, c.profile);
    const GenContext gen = makeContext(c.spec, c.gen.nodeOf, resolved);
    return costHierarchical(CostContext{c.spec, resolved, c.topo, gen, c.profile});
  }
  const ClosedFormShape s = shapeOf(c);
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
    return estimate(u, ringLongest(u, M, 1, chunkCount(block0.size, c.opt.chunks), true, true),
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

AlgorithmDef allReduceHierarchical() {
  return {CollOp::AllReduce, "hierarchical",
          "NVLink reduce-scatter in each node, ring all-reduce of each shard across nodes, NVLink all-gather",
          setupHierarchical, emitHierarchical, costHierarchical};
}

}  // namespace mk::detail
