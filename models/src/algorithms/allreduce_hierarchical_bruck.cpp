// mkernel — all-reduce, hierarchical with Bruck's dissemination reduce-scatter and all-gather as its
// inter-node phase (docs/algorithms-allreduce.md, "hierarchical, bruck"); its setup and AlgorithmDef are the
// ring variant's (allreduce_hierarchical.cpp), which dispatches here when inter = "bruck".
//
// Phases 1 and 3 as in the rhd variant (K plain chunks of each shard). Per chunk, the shard's owners on the M
// nodes (one per node) run a reduce-scatter and an all-gather in J = ceil(log2 M) rounds each, for any M: the
// chunk is cut into M blocks, block b ends on node b. Round k pairs node n with n + 2^k and moves
// c_k = min(2^k, M - 2^k) blocks, so each pass moves sum c_k = M - 1 blocks per node (bandwidth-optimal) and no
// node idles or folds. Blocks are named relative to the node: relative block d of node n is block (n + d) mod M.
//  * reduce-scatter, rounds k = J-1 .. 0: node n sends its partials of relative blocks [2^k, 2^k + c_k) to node
//    n + 2^k (whose relative blocks [0, c_k) they are) and reduces what node n - 2^k sends into its own
//    relative blocks [0, c_k). A block sent at round k is never touched again (later rounds reduce only
//    relative blocks below c_k' <= 2^k' < 2^k), so the send and the reduction of one round never overlap.
//    After round 0 node n holds block n reduced over every node.
//  * all-gather, rounds k = 0 .. J-1: node n sends its final relative blocks [0, c_k) straight into the output
//    of node n - 2^k and receives relative blocks [2^k, 2^k + c_k) from node n + 2^k; before round k it holds
//    relative blocks [0, 2^k), so everything it sends is final.
// Blocks that wrap past block M-1 travel as two messages (two pieces), so a node pays one extra message on
// the rounds where its range wraps. The node partial lives in output before the exchanges: phase 1 leaves it
// there, and on a node of one rank the reducer copies its input there first (a block's partial is then read
// and written in one place whichever round reduces it first).
//
// Flags per owned shard (ordinal m): one per reduce-scatter round and one per all-gather round (each fed by
// one partner, chunks in order: running counts are exact), and the reducer's self-signal `ready` (partial
// complete, then each round reduced). Every round's receive range has its own scratch region, because the
// partner of a later round may send before this rank's reduction of an earlier round has read its region.
#include <algorithm>
#include <string>
#include <vector>

#include "allreduce_hierarchical.hpp"

namespace mk::detail {

namespace {

/// Bruck's rounds over M nodes: round k pairs node n with n + 2^k and moves min(2^k, M - 2^k) blocks.
struct BruckPlan {
  uint32_t nodes = 0;   ///< M
  uint32_t rounds = 0;  ///< J = ceil(log2 M)
  uint32_t distance(uint32_t k) const { return 1u << k; }
  uint32_t blocks(uint32_t k) const { return std::min(1u << k, nodes - (1u << k)); }
  /// Reduce-scatter round rho (in emission order) is round J - 1 - rho.
  uint32_t rsRound(uint32_t rho) const { return rounds - 1 - rho; }
};

BruckPlan bruckPlan(uint32_t nodes) {
  BruckPlan p;
  p.nodes = nodes;
  while ((uint64_t(1) << p.rounds) < nodes) ++p.rounds;
  return p;
}

/// Blocks [first, first + count) mod M of `chunk` as at most two element ranges (the second where they wrap).
struct BlockPieces {
  Range piece[2];
  uint32_t n = 0;
  uint32_t nonEmpty() const { return (n > 0 && piece[0].size > 0 ? 1u : 0u) + (n > 1 && piece[1].size > 0 ? 1u : 0u); }
};

BlockPieces blockPieces(Range chunk, uint32_t M, uint32_t first, uint32_t count) {
  BlockPieces out;
  const Range lo = splitRange(chunk, M, first);
  if (first + count <= M) {
    const Range hi = splitRange(chunk, M, first + count - 1);
    out.piece[0] = Range{lo.begin, hi.end() - lo.begin};
    out.n = 1;
    return out;
  }
  out.piece[0] = Range{lo.begin, chunk.end() - lo.begin};
  const Range hi = splitRange(chunk, M, first + count - M - 1);
  out.piece[1] = Range{chunk.begin, hi.end() - chunk.begin};
  out.n = 2;
  return out;
}

/// Elements one block of a chunk can hold at most: ceil(largest chunk / M).
uint64_t bruckBlockMax(const GenContext& ctx, uint64_t shardMax) {
  const uint64_t chunkMax = splitRange(Range{0, shardMax}, ctx.opt.chunks, 0).size;
  return (chunkMax + ctx.nNodes() - 1) / ctx.nNodes();
}

uint64_t shardMaxOf(const GenContext& ctx, uint32_t channel) {
  return splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), channel), ctx.maxLocal, 0).size;
}

}  // namespace

uint64_t bruckStride(const GenContext& ctx, uint32_t channel) {
  // Per chunk, room for the c_k blocks received at every reduce-scatter round: M - 1 blocks in all.
  const uint64_t blockMax = bruckBlockMax(ctx, shardMaxOf(ctx, channel));
  return checkedProduct(checkedProduct(ctx.opt.chunks, ctx.nNodes() - 1, "hierarchical bruck (chunks x nodes)"),
                        blockMax, "hierarchical bruck (blocks x block)");
}

namespace {

/// Where the bruck variant's pieces of one channel are: chunk t of a shard, its blocks, and where a received
/// reduce-scatter piece lands in the owner's scratch (after the phase-1 slots, per channel and owned shard one
/// region of bruckStride elements: per chunk and round k, room for c_k blocks, filled from the first received
/// block on, wrapping once).
class BruckWalk {
 public:
  BruckWalk(const GenContext& ctx, const HierLayout& layout, const HierShards& shards, const BruckPlan& plan,
            uint32_t channel)
      : ctx_(ctx), shards_(shards), plan_(plan) {
    regionBase_ = layout.ringBase;
    for (uint32_t c = 0; c < channel; ++c) regionBase_ += uint64_t(layout.maxOwned) * bruckStride(ctx, c);
    regionStride_ = bruckStride(ctx, channel);
    blockMax_ = bruckBlockMax(ctx, shards.stride());
    roundBlocks_.assign(plan.rounds + 1, 0);
    for (uint32_t k = 0; k < plan.rounds; ++k) roundBlocks_[k + 1] = roundBlocks_[k] + plan.blocks(k);
  }

  Range chunk(uint32_t shard, uint32_t chunkIdx) const {
    return splitRange(shards_.range(shard), ctx_.opt.chunks, chunkIdx);
  }
  /// Relative blocks [from, from + count) of `node` in chunk `chunkIdx` of `shard`.
  BlockPieces relative(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint32_t from, uint32_t count) const {
    return blockPieces(chunk(shard, chunkIdx), plan_.nodes, (node + from) % plan_.nodes, count);
  }
  /// Scratch offset on `node` of `element` of its relative blocks [0, c_k) received at reduce-scatter round k.
  uint64_t rsSlot(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint32_t k, uint64_t element) const {
    const Range c = chunk(shard, chunkIdx);
    const uint64_t first = splitRange(c, plan_.nodes, node).begin;
    const uint64_t within = element >= first ? element - first : (c.end() - first) + (element - c.begin);
    return regionBase_ + uint64_t(shards_.ordinal(node, shard)) * regionStride_ +
           (uint64_t(chunkIdx) * (plan_.nodes - 1) + roundBlocks_[k]) * blockMax_ + within;
  }

 private:
  const GenContext& ctx_;
  const HierShards& shards_;
  const BruckPlan& plan_;
  uint64_t regionBase_ = 0, regionStride_ = 0, blockMax_ = 0;
  std::vector<uint64_t> roundBlocks_;  ///< per round k: blocks received at rounds before k (of one chunk)
};

struct BruckFlags {
  std::vector<uint32_t> phase1Arrived;           ///< per source local index
  std::vector<uint32_t> ready;                   ///< per ordinal: the reducer's self-signal
  std::vector<std::vector<uint32_t>> rsArrived;  ///< [round k][ordinal]: reduce-scatter arrivals
  std::vector<std::vector<uint32_t>> agArrived;  ///< [round k][ordinal]: all-gather arrivals
  uint32_t phase3Arrived = 0;
};

struct BruckRank {
  uint32_t node = 0, localIndex = 0, rank = 0;
  uint32_t localRanks = 0;
  std::vector<uint32_t> owned;
  /// readyAt[owned][chunk][k]: signals to `ready` after stage k of the chunk (k = 0: the partial is in output;
  /// k = rho + 1: reduce-scatter round rho, in emission order, reduced).
  std::vector<std::vector<std::vector<uint64_t>>> readyAt;
};

/// Emits one channel of the bruck variant: per rank, phase 1 (mover), the reducer (phase-1 reductions or the
/// copy of the input, each reduce-scatter round's reduction), the sender (reduce-scatter, all-gather), phase 3
/// (mover); then every rank's completion waits.
class BruckVariant {
 public:
  BruckVariant(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part)
      : b_(b),
        ctx_(ctx),
        lanes_(b, ctx, channel),
        layout_(hierLayout(ctx)),
        plan_(bruckPlan(layout_.nodes)),
        shards_(ctx, layout_, channel, part),
        walk_(ctx, layout_, shards_, plan_, channel) {
    const uint32_t maxOwned = layout_.maxOwned;
    flags_.phase1Arrived = b.newFlags(layout_.shards > 1 ? layout_.shards : 0);
    flags_.ready = b.newFlags(maxOwned);
    for (uint32_t k = 0; k < plan_.rounds; ++k) {
      flags_.rsArrived.push_back(b.newFlags(maxOwned));
      flags_.agArrived.push_back(b.newFlags(maxOwned));
    }
    flags_.phase3Arrived = layout_.shards > 1 ? b.newFlag() : 0;
  }

  void emit() {
    for (uint32_t node = 0; node < layout_.nodes; ++node)
      for (uint32_t localIndex = 0; localIndex < ctx_.nodeSize(node); ++localIndex) {
        BruckRank me;
        me.node = node;
        me.localIndex = localIndex;
        me.rank = ctx_.nodeRanks[node][localIndex];
        me.localRanks = ctx_.nodeSize(node);
        me.owned = shards_.ownedBy(node, localIndex);
        reserveSteps(me);
        emitChunkedPhase1(b_, ctx_, lanes_, shards_, node, localIndex, flags_.phase1Arrived);
        runReducer(me);
        runSender(me);
        if (me.localRanks > 1) sendPhase3(me);
      }
    waitForCompletion();
  }

 private:
  uint32_t chunks() const { return ctx_.opt.chunks; }
  uint32_t rounds() const { return plan_.rounds; }
  uint32_t nodes() const { return plan_.nodes; }

  /// Upper bounds of each lane's steps (see the rhd variant: growing lane vectors by doubling is costly).
  void reserveSteps(const BruckRank& me) {
    const uint32_t r = me.rank;
    const uint64_t k = chunks(), own = me.owned.size(), g = me.localRanks, j = rounds();
    if (g > 1) {
      b_.reserveSteps(r, lanes_.mover(r), k * (layout_.shards - own + own * (g - 1)) + k * own * (g + 1 + j));
    }
    b_.reserveSteps(r, lanes_.reducer(r), k * own * (2 * g + 2 + 4 * j) + 1 + uint64_t(layout_.maxOwned) * j);
    b_.reserveSteps(r, lanes_.sender(r), k * own * (7 * j + 1));
  }

  /// The reducer, per chunk: the node partial into output (phase-1 reduction, or a copy of the input on a node
  /// of one rank), then each reduce-scatter round's received blocks reduced into it; fills me.readyAt.
  void runReducer(BruckRank& me) {
    const uint32_t r = me.rank, node = me.node, J = rounds();
    const auto own = me.owned.size();
    me.readyAt.assign(own, std::vector<std::vector<uint64_t>>(chunks(), std::vector<uint64_t>(J + 1, 0)));
    std::vector<uint64_t> phase1Seen(me.localRanks, 0), rsSeen(own * size_t(J), 0);
    for (uint32_t t = 0; t < chunks(); ++t) {
      for (std::size_t jo = 0; jo < own; ++jo) {
        const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
        const Range c = walk_.chunk(s, t);
        if (c.size > 0) {
          if (me.localRanks > 1)
            emitChunkedPhase1Reduce(b_, ctx_, lanes_, shards_, node, me.localIndex, s, c, flags_.phase1Arrived,
                                    phase1Seen);
          else
            b_.copy(r, lanes_.reducer(r), bufRef(r, ctx_.output, c.begin), bufRef(r, ctx_.input, c.begin), c.size);
          b_.signal(r, lanes_.reducer(r), r, flags_.ready[m]);
        }
        me.readyAt[jo][t][0] = b_.signalsSent(r, flags_.ready[m]);
      }
      for (uint32_t rho = 0; rho < J; ++rho)
        for (std::size_t jo = 0; jo < own; ++jo) {
          const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s), k = plan_.rsRound(rho);
          const BlockPieces in = walk_.relative(node, s, t, 0, plan_.blocks(k));
          if (in.nonEmpty() > 0) {
            const uint32_t red = lanes_.reducer(r);
            b_.wait(r, red, flags_.rsArrived[k][m], rsSeen[jo * size_t(J) + k] += in.nonEmpty());
            for (uint32_t p = 0; p < in.n; ++p) {
              const Range u = in.piece[p];
              if (u.size == 0) continue;
              const BufRef acc = bufRef(r, ctx_.output, u.begin);
              b_.reduce(r, red, acc, acc, bufRef(r, scratchBuffer(ctx_), walk_.rsSlot(node, s, t, k, u.begin)), u.size);
            }
            b_.signal(r, red, r, flags_.ready[m]);
          }
          me.readyAt[jo][t][rho + 1] = b_.signalsSent(r, flags_.ready[m]);
        }
    }
  }

  /// The sender, per chunk: the reduce-scatter rounds (each once the reducer has finished the rounds before),
  /// then the all-gather rounds (the first once the last reduction is done, each later one once every earlier
  /// round's arrivals are in).
  void runSender(const BruckRank& me) {
    const uint32_t r = me.rank, node = me.node, J = rounds(), M = nodes();
    const uint32_t snd = lanes_.sender(r);
    const auto own = me.owned.size();
    std::vector<uint64_t> readyWaited(own, 0), agSeen(own * size_t(J), 0), agWaited(own * size_t(J), 0);
    auto waitReady = [&](std::size_t jo, uint32_t m, uint64_t need) {
      if (need <= readyWaited[jo]) return;
      b_.wait(r, snd, flags_.ready[m], need);
      readyWaited[jo] = need;
    };
    for (uint32_t t = 0; t < chunks(); ++t) {
      for (uint32_t rho = 0; rho < J; ++rho) {
        const uint32_t k = plan_.rsRound(rho), dst = (node + plan_.distance(k)) % M;
        for (std::size_t jo = 0; jo < own; ++jo) {
          const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
          const BlockPieces out = walk_.relative(node, s, t, plan_.distance(k), plan_.blocks(k));
          if (out.nonEmpty() == 0) continue;
          waitReady(jo, m, me.readyAt[jo][t][rho]);
          for (uint32_t p = 0; p < out.n; ++p) {
            const Range u = out.piece[p];
            if (u.size == 0) continue;
            b_.put(r, snd, bufRef(shards_.owner(dst, s), scratchBuffer(ctx_), walk_.rsSlot(dst, s, t, k, u.begin)),
                   bufRef(r, ctx_.output, u.begin), u.size, flags_.rsArrived[k][shards_.ordinal(dst, s)]);
          }
        }
      }
      for (uint32_t k = 0; k < J; ++k) {
        const uint32_t dst = (node + M - plan_.distance(k)) % M;
        for (std::size_t jo = 0; jo < own; ++jo) {
          const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
          // What arrives at this round: relative blocks [2^k, 2^k + c_k) from node + 2^k.
          agSeen[jo * size_t(J) + k] += walk_.relative(node, s, t, plan_.distance(k), plan_.blocks(k)).nonEmpty();
          const BlockPieces out = walk_.relative(node, s, t, 0, plan_.blocks(k));
          if (out.nonEmpty() == 0) continue;
          waitReady(jo, m, me.readyAt[jo][t][J]);
          for (uint32_t before = 0; before < k; ++before) {
            const size_t i = jo * size_t(J) + before;
            if (agSeen[i] <= agWaited[i]) continue;
            b_.wait(r, snd, flags_.agArrived[before][m], agSeen[i]);
            agWaited[i] = agSeen[i];
          }
          for (uint32_t p = 0; p < out.n; ++p) {
            const Range u = out.piece[p];
            if (u.size == 0) continue;
            b_.put(r, snd, bufRef(shards_.owner(dst, s), ctx_.output, u.begin), bufRef(r, ctx_.output, u.begin), u.size,
                   flags_.agArrived[k][shards_.ordinal(dst, s)]);
          }
        }
      }
    }
  }

  /// Phase 3, intra-node all-gather (mover): chunk t of each owned shard to the node's other ranks once final
  /// (the last reduction and every all-gather arrival of the chunk).
  void sendPhase3(const BruckRank& me) {
    const uint32_t r = me.rank, node = me.node, J = rounds();
    const auto own = me.owned.size();
    std::vector<uint64_t> readySeen(own, 0), agCount(own * size_t(J), 0), agDone(own * size_t(J), 0);
    for (uint32_t t = 0; t < chunks(); ++t)
      for (std::size_t jo = 0; jo < own; ++jo) {
        const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
        const Range c = walk_.chunk(s, t);
        if (c.size == 0) continue;
        const uint32_t mover = lanes_.mover(r);
        const uint64_t need = me.readyAt[jo][t][J];
        if (need > readySeen[jo]) {
          b_.wait(r, mover, flags_.ready[m], need);
          readySeen[jo] = need;
        }
        for (uint32_t k = 0; k < J; ++k) {
          const size_t i = jo * size_t(J) + k;
          agCount[i] += walk_.relative(node, s, t, plan_.distance(k), plan_.blocks(k)).nonEmpty();
          if (agCount[i] > agDone[i]) {
            b_.wait(r, mover, flags_.agArrived[k][m], agCount[i]);
            agDone[i] = agCount[i];
          }
        }
        for (uint32_t i = 1; i < me.localRanks; ++i) {
          const uint32_t peer = ctx_.nodeRanks[node][(me.localIndex + i) % me.localRanks];
          b_.put(r, mover, bufRef(peer, ctx_.output, c.begin), bufRef(r, ctx_.output, c.begin), c.size,
                 flags_.phase3Arrived);
        }
      }
  }

  /// Completion: non-owned shards arrive in phase 3; a node of one rank ends with its own last arrivals.
  void waitForCompletion() {
    for (uint32_t r = 0; r < ctx_.nRanks; ++r) {
      if (layout_.shards > 1) waitForAll(b_, lanes_, r, flags_.phase3Arrived);
      if (ctx_.nodeSize(ctx_.nodeOf[r]) == 1)
        for (uint32_t m = 0; m < layout_.maxOwned; ++m)
          for (uint32_t k = 0; k < rounds(); ++k) waitForAll(b_, lanes_, r, flags_.agArrived[k][m]);
    }
  }

  ScheduleBuilder& b_;
  const GenContext& ctx_;
  ChannelLanes lanes_;
  const HierLayout layout_;
  const BruckPlan plan_;
  const HierShards shards_;
  const BruckWalk walk_;
  BruckFlags flags_;
};

/// Wrapped messages of `node`'s relative blocks [from, from + count): 2 where they wrap past block M-1.
double piecesOf(uint32_t node, uint32_t from, uint32_t count, uint32_t M) {
  return (node + from) % M + count > M ? 2 : 1;
}

/// The bruck variant's longest path: a max-plus recurrence over the K chunks and the 2J rounds of each, one
/// representative per node (its busiest rank's loads) fed by its partners' representatives, in the order the
/// lanes run their steps (reducer: partial then each reduce-scatter round; sender: reduce-scatter rounds then
/// all-gather rounds; mover: every phase-1 round, then phase 3 chunk by chunk). A round's message of c_k
/// blocks costs c_k * ceil(chunk / M) / chunk units and one alpha per piece (two where the node's range
/// wraps): exact when the chunk divides by M and nodes are equal, an upper bound otherwise.
PathCounts bruckLongest(const UnitPrices& u, uint32_t K, uint64_t chunkMax, const std::vector<HierNodeLoad>& nodes) {
  const Longest longest(&u);
  const auto M = static_cast<uint32_t>(nodes.size());
  const BruckPlan plan = bruckPlan(M);
  const uint32_t J = plan.rounds;
  const double blockUnits = double((chunkMax + M - 1) / M) / double(chunkMax);
  const PathCounts zero, put = nvGroup(1, 1), red1 = redGroup(1, 1), land = netLands();
  struct State {
    PathCounts red, snd, mu, ready, finalReady, arrivals;
  };
  std::vector<State> st(M);
  std::vector<PathCounts> rs(M);
  std::vector<std::vector<PathCounts>> ag(J, std::vector<PathCounts>(M));
  std::vector<std::vector<PathCounts>> rounds(M, std::vector<PathCounts>(K));
  for (uint32_t n = 0; n < M; ++n) {
    for (uint32_t t = 0; t < K; ++t) rounds[n][t] = (t ? rounds[n][t - 1] : zero) + nodes[n].p1Puts * put;
    st[n].mu = rounds[n][K - 1];
  }
  for (uint32_t t = 0; t < K; ++t) {
    for (uint32_t n = 0; n < M; ++n) {  // the partial in output: phase-1 group t, or the copy of the input
      State& s = st[n];
      s.red = nodes[n].phases ? longest(s.red, rounds[n][t]) + nodes[n].perOwner * red1
                              : s.red + nodes[n].owned * copyMsg();
      s.ready = s.red + flagHop();
    }
    for (uint32_t rho = 0; rho < J; ++rho) {
      const uint32_t k = plan.rsRound(rho), d = plan.distance(k), c = plan.blocks(k);
      for (uint32_t n = 0; n < M; ++n)
        rs[n] = st[n].snd =
            longest(st[n].snd, st[n].ready) + nodes[n].owned * netGroup(piecesOf(n, d, c, M), c * blockUnits);
      for (uint32_t n = 0; n < M; ++n) {
        State& s = st[n];
        s.red = longest(s.red, rs[(n + M - d) % M] + land) +
                nodes[n].owned * redGroup(piecesOf(n, 0, c, M), c * blockUnits);
        s.ready = s.red + flagHop();
      }
    }
    for (uint32_t k = 0; k < J; ++k) {
      const uint32_t c = plan.blocks(k);
      for (uint32_t n = 0; n < M; ++n) {
        PathCounts need = k == 0 ? st[n].ready : zero;
        for (uint32_t before = 0; before < k; ++before)
          need = longest(need, ag[before][(n + plan.distance(before)) % M] + land);
        ag[k][n] = longest(st[n].snd, need) + nodes[n].owned * netGroup(piecesOf(n, 0, c, M), c * blockUnits);
      }
      for (uint32_t n = 0; n < M; ++n) st[n].snd = ag[k][n];
    }
    for (uint32_t n = 0; n < M; ++n) {
      State& s = st[n];
      s.finalReady = s.ready;
      for (uint32_t k = 0; k < J; ++k) s.finalReady = longest(s.finalReady, ag[k][(n + plan.distance(k)) % M] + land);
      if (nodes[n].phases)
        s.mu = longest(s.mu, s.finalReady) + nodes[n].perOwner * put;
      else
        s.arrivals = longest(s.arrivals, s.finalReady);
    }
  }
  PathCounts total = zero;
  for (uint32_t n = 0; n < M; ++n) {
    const State& s = st[n];
    const PathCounts end = longest({s.red, s.snd, nodes[n].phases ? s.mu : s.arrivals});
    total = n ? longest(total, end) : end;
  }
  return total;
}

}  // namespace

void emitHierarchicalBruck(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  BruckVariant(b, ctx, channel, part).emit();
}

CostEstimate costHierarchicalBruck(const CostContext& c, const ClosedFormShape& s) {
  const Range shard0 = splitRange(s.part0, s.gMax, 0);
  const uint64_t chunkMax = splitRange(shard0, c.opt.chunks, 0).size;
  const UnitPrices u = unitPrices(c, chunkMax, true);
  const BruckPlan plan = bruckPlan(s.nodes);
  return estimate(u, bruckLongest(u, c.opt.chunks, chunkMax, hierNodeLoads(c, s.nodes)),
                  "hierarchical, bruck: longest path of the chunk/round recurrence (docs); per chunk J = " +
                      std::to_string(plan.rounds) +
                      " reduce-scatter and J all-gather rounds, round k moving min(2^k, M-2^k) blocks of "
                      "ceil(chunk/M), a wrapped range as two messages; S1 = (G-1)*t_nv(chunk), unit = chunk "
                      "n/(C*G*K)");
}

}  // namespace mk::detail
