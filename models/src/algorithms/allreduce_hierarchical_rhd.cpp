// mkernel — all-reduce, hierarchical with recursive halving/doubling (Rabenseifner) as its inter-node phase
// (docs/algorithms-allreduce.md, "hierarchical, rhd"); its setup and AlgorithmDef are the ring variant's
// (allreduce_hierarchical.cpp), which dispatches here when inter = "rhd".
#include <vector>

#include "allreduce_hierarchical.hpp"

namespace mk::detail {

RhdPlan rhdPlan(uint32_t nodes) {
  RhdPlan p;
  while (p.pow2 * 2 <= nodes) {
    p.pow2 *= 2;
    ++p.steps;
  }
  p.extra = nodes - p.pow2;
  return p;
}

uint64_t rhdStride(const GenContext& ctx, uint32_t channel) {
  const RhdPlan plan = rhdPlan(ctx.nNodes());
  const uint64_t shardMax =
      splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), channel), ctx.maxLocal, 0).size;
  const uint64_t chunkMax = splitRange(Range{0, shardMax}, ctx.opt.chunks, 0).size;
  uint64_t steps = 0;
  for (uint32_t j = 0; j < plan.steps; ++j) steps += (chunkMax + (uint64_t(1) << (j + 1)) - 1) >> (j + 1);
  return (plan.extra > 0 ? shardMax : 0) + checkedProduct(ctx.opt.chunks, steps, "hierarchical rhd (chunks x steps)");
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
              b.put(r, lanes.mover(r), bufRef(peer, scratch, p1Slot(n, li, s, c.begin)), bufRef(r, ctx.input, c.begin),
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
                return l == li ? bufRef(r, ctx.input, c.begin) : bufRef(r, scratch, p1Slot(n, l, s, c.begin));
              };
              reduceChain(b, r, red, bufRef(r, ctx.output, c.begin), G, x, c.size);
            }
            if (c.size > 0 && isHost) {
              const uint32_t red = lanes.reducer(r);
              b.wait(r, red, foldIn[m], ++foldCount[jo]);
              b.reduce(r, red, bufRef(r, ctx.output, c.begin), bufRef(r, G > 1 ? ctx.output : ctx.input, c.begin),
                       bufRef(r, scratch, foldSlot(n, s, c.begin)), c.size);
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
                b.reduce(r, red, bufRef(r, ctx.output, u.begin), bufRef(r, accAt(j), u.begin),
                         bufRef(r, scratch, stepSlot(n, s, t, j, u, u.begin)), u.size);
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
            b.put(r, lanes.sender(r), bufRef(owner(foldPeer, s), scratch, foldSlot(foldPeer, s, c.begin)),
                  bufRef(r, acc0, c.begin), c.size, foldIn[ordinal(foldPeer, s)]);
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
            b.put(r, lanes.sender(r), bufRef(owner(partner, s), scratch, stepSlot(partner, s, t, j, u, u.begin)),
                  bufRef(r, accAt(j), u.begin), u.size, rsFlag[j][ordinal(partner, s)]);
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
            b.put(r, lanes.sender(r), bufRef(owner(partner, s), ctx.output, u.begin), bufRef(r, ctx.output, u.begin),
                  u.size, agFlag[j][ordinal(partner, s)]);
          }
        }
        for (uint32_t jo = 0; jo < own && isHost; ++jo) {
          const uint32_t s = owned[jo], m = ordinal(n, s);
          const Range c = chunk(s, t);
          if (c.size == 0) continue;
          waitReady(jo, m, readyAt[jo][t][J]);
          for (uint32_t j = 0; j < J; ++j) waitAg(jo, m, j);
          b.put(r, lanes.sender(r), bufRef(owner(foldPeer, s), ctx.output, c.begin), bufRef(r, ctx.output, c.begin),
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
              b.put(r, mv, bufRef(peer, ctx.output, c.begin), bufRef(r, ctx.output, c.begin), c.size, p3Flag);
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

}  // namespace mk::detail
