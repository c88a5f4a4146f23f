// mkernel — all-reduce, hierarchical with a dissemination reduce-scatter and all-gather as its inter-node phase:
// Bruck's rounds ("bruck") or rounds that halve what is live ("bruck-half") (docs/algorithms-allreduce.md,
// "hierarchical, bruck"); its setup and AlgorithmDef are the ring variant's (allreduce_hierarchical.cpp), which
// dispatches here when inter = "bruck" or "bruck-half". The two differ only in their BruckPlan.
//
// K plain chunks of each shard, as in the rhd variant. Per chunk, the shard's owners on the M nodes
// (one per node) run a reduce-scatter and an all-gather in J = ceil(log2 M) rounds each, for any M: the chunk
// is cut into M blocks, block b ends on node b. Round k pairs node n with n + D_k (D_k = distance(k), the blocks
// a node holds before all-gather round k: 2^k for bruck) and moves c_k = blocks(k) <= D_k blocks (bruck:
// min(2^k, M - 2^k)), so each pass moves sum c_k = M - 1 blocks per node (bandwidth-optimal) and no node idles
// or folds. Blocks are named relative to the node: relative block d of node n is block (n + d) mod M.
//  * The reduce-scatter works on a rotated copy of the chunk in scratch ("work"): relative block d of node n at
//    the offset where block (n + d) mod M starts, counted from block n, so every range of relative blocks is
//    one contiguous range and every node sends one message per round. Stage 0 of the reducer writes the node
//    partial there (the phase-1 reduction, or a copy of the input on a node of one rank) in two pieces on
//    every node (cut where the rotation wraps, or mid-chunk on node 0).
//  * reduce-scatter, rounds k = J-1 .. 0: node n sends work relative blocks [D_k, D_k + c_k) to node n + D_k
//    (whose relative blocks [0, c_k) they are) and reduces what node n - D_k sends into its own work relative
//    blocks [0, c_k); the last round's reduction (k = 0: relative block 0) leaves block n, final, in output.
//    A block sent at round k is never touched again (later rounds reduce only relative blocks below
//    c_k' <= D_k' < D_k), so the send and the reduction of one round never overlap.
//  * all-gather, rounds k = 0 .. J-1: node n sends its final relative blocks [0, c_k) of output straight into
//    the output of node n - D_k and receives relative blocks [D_k, D_k + c_k) from node n + D_k; before round k
//    it holds relative blocks [0, D_k), so everything it sends is final. A range of two or more blocks travels
//    as two messages on every node (cut where it wraps past block M-1, else at its middle block), one block as
//    one.
// Every node thus sends the same messages of the same sizes in the same order: nodes stay in step, and in
// every round each NIC receives from one partner at a time. (Without the rotation and the uniform cut, the
// nodes whose ranges wrapped sent one message more per round, fell behind the others, and a NIC received two
// rounds at once: the SimGrid replay lost 1.3x to contention at 12 and 248 nodes.)
//
// bruck only: where M < 1.5 x 2^(J-1) the two largest rounds swap (BruckPlan::swapped): round J-1's reduction does
// not reach what round J-2 sends, so the reduce-scatter starts with the larger round J-2 and the all-gather ends
// with it; and the small round J-1 runs as late as its blocks allow (BruckPlan::smallAt), between large rounds, where
// a nearly empty round no longer delays the pipeline's fill and drain.
//
// The reducer and the sender run their (chunk, stage) pairs in wavefront order (rhdWavefront), so that one
// chunk's round trips overlap the next chunks' messages. Phase 1 (mover) delivers each chunk in two parts, first
// what the first round sends; phase 3 (mover) forwards first what is final before the last all-gather round, then
// what that round brings (part()): the pipeline's fill and drain are about half a chunk each.
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

uint32_t BruckPlan::smallAt() const {
  uint32_t logR = 0;  // ceil(log2 r), r = blocks(J - 1)
  while ((1u << logR) < blocks(rounds - 1)) ++logR;
  return std::min(rounds - 1 - logR, rounds - 2);  // round 0 stays last: its reduction writes the output
}

BruckPlan bruckPlan(uint32_t nodes, InterPhase inter) {
  BruckPlan p;
  p.nodes = nodes;
  while ((uint64_t(1) << p.rounds) < nodes) ++p.rounds;
  p.held.assign(p.rounds + 1, nodes);
  // bruck: 2^k; bruck-half: what is live after each reduce-scatter round, halved (rounded up) from M down to 1.
  for (uint32_t k = p.rounds; k-- > 0;) p.held[k] = inter == InterPhase::BruckHalf ? (p.held[k + 1] + 1) / 2 : 1u << k;
  return p;
}

namespace {

/// At most two element ranges (empty ones have size 0).
struct BlockPieces {
  Range piece[2];
  uint32_t n = 0;
  uint32_t nonEmpty() const { return (n > 0 && piece[0].size > 0 ? 1u : 0u) + (n > 1 && piece[1].size > 0 ? 1u : 0u); }
};

/// Blocks [first, first + count) mod M of `chunk` as the all-gather sends them: one range for one block, else
/// two, cut where they wrap past block M-1 or, where they do not, at block first + count / 2, so that every node
/// sends the same number of messages in a round. A function of the blocks alone: sender and receiver agree.
BlockPieces agPieces(Range chunk, uint32_t M, uint32_t first, uint32_t count) {
  BlockPieces out;
  const Range lo = splitRange(chunk, M, first);
  if (count == 1) {
    out.piece[0] = lo;
    out.n = 1;
    return out;
  }
  out.n = 2;
  if (first + count <= M) {
    const uint64_t cut = splitRange(chunk, M, first + count / 2).begin;
    out.piece[0] = Range{lo.begin, cut - lo.begin};
    out.piece[1] = Range{cut, splitRange(chunk, M, first + count - 1).end() - cut};
    return out;
  }
  out.piece[0] = Range{lo.begin, chunk.end() - lo.begin};
  out.piece[1] = Range{chunk.begin, splitRange(chunk, M, first + count - M - 1).end() - chunk.begin};
  return out;
}

uint64_t shardMaxOf(const GenContext& ctx, uint32_t channel) {
  return splitRange(splitRange(Range{0, ctx.spec.count}, effectiveChannels(ctx), channel), ctx.maxLocal, 0).size;
}

/// Elements of the largest chunk of a channel, and of one of its blocks at most: ceil(chunk / M).
uint64_t bruckChunkMax(const GenContext& ctx, uint32_t channel) {
  return splitRange(Range{0, shardMaxOf(ctx, channel)}, ctx.opt.chunks, 0).size;
}
uint64_t bruckBlockMax(const GenContext& ctx, uint64_t chunkMax) {
  return (chunkMax + ctx.nNodes() - 1) / ctx.nNodes();
}

}  // namespace

uint64_t bruckStride(const GenContext& ctx, uint32_t channel) {
  // Per chunk, the rotated copy (one chunk) and room for the c_k blocks received at every reduce-scatter round
  // (M - 1 blocks in all).
  const uint64_t chunkMax = bruckChunkMax(ctx, channel);
  const uint64_t rounds =
      checkedProduct(ctx.nNodes() - 1, bruckBlockMax(ctx, chunkMax), "hierarchical bruck (nodes x block)");
  return checkedProduct(ctx.opt.chunks, chunkMax + rounds, "hierarchical bruck (chunks x chunk)");
}

namespace {

/// Where the bruck variant's pieces of one channel are: chunk t of a shard, its blocks, the node's rotated copy
/// of it and where a received reduce-scatter piece lands (after the phase-1 slots, per channel and owned shard
/// one region of bruckStride elements: per chunk the rotated copy, then per round k room for c_k blocks).
class BruckWalk {
 public:
  BruckWalk(const GenContext& ctx, const HierLayout& layout, const HierShards& shards, const BruckPlan& plan,
            uint32_t channel)
      : ctx_(ctx), shards_(shards), plan_(plan) {
    regionBase_ = layout.ringBase;
    for (uint32_t c = 0; c < channel; ++c) regionBase_ += uint64_t(layout.maxOwned) * bruckStride(ctx, c);
    regionStride_ = bruckStride(ctx, channel);
    chunkMax_ = bruckChunkMax(ctx, channel);
    blockMax_ = bruckBlockMax(ctx, chunkMax_);
    perChunk_ = chunkMax_ + uint64_t(plan.nodes - 1) * blockMax_;
    roundBlocks_.assign(plan.rounds + 1, 0);
    for (uint32_t k = 0; k < plan.rounds; ++k) roundBlocks_[k + 1] = roundBlocks_[k] + plan.blocks(k);
  }

  Range chunk(uint32_t shard, uint32_t chunkIdx) const {
    return splitRange(shards_.range(shard), ctx_.opt.chunks, chunkIdx);
  }
  /// Block `block` of chunk `chunkIdx` of `shard`.
  Range block(uint32_t shard, uint32_t chunkIdx, uint32_t block) const {
    return splitRange(chunk(shard, chunkIdx), plan_.nodes, block);
  }
  /// Offset of `element` of the chunk in `node`'s rotated copy: counted from the first element of block `node`,
  /// wrapping at the chunk's end.
  uint64_t rotated(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint64_t element) const {
    const Range c = chunk(shard, chunkIdx);
    const uint64_t origin = block(shard, chunkIdx, node).begin;
    return element >= origin ? element - origin : (c.end() - origin) + (element - c.begin);
  }
  /// Relative blocks [from, from + count) of `node` (from + count <= M) as one range of its rotated copy.
  Range relative(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint32_t from, uint32_t count) const {
    const uint64_t begin = prefix(node, shard, chunkIdx, from);
    return Range{begin, prefix(node, shard, chunkIdx, from + count) - begin};
  }
  /// Scratch offset on `node` of offset `offset` of its rotated copy of chunk `chunkIdx`.
  uint64_t workSlot(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint64_t offset) const {
    return region(node, shard) + uint64_t(chunkIdx) * perChunk_ + offset;
  }
  /// Scratch offset on `node` of offset `offset` (in its rotated copy) of what reduce-scatter round k brings.
  uint64_t rsSlot(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint32_t k, uint64_t offset) const {
    return region(node, shard) + uint64_t(chunkIdx) * perChunk_ + chunkMax_ + roundBlocks_[k] * blockMax_ + offset;
  }

 private:
  /// Elements of `node`'s relative blocks [0, d) (d <= M): where relative block d starts in its rotated copy.
  uint64_t prefix(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint32_t d) const {
    const Range c = chunk(shard, chunkIdx);
    const uint32_t M = plan_.nodes;
    auto start = [&](uint32_t b) { return b == M ? c.end() : block(shard, chunkIdx, b).begin; };
    const uint64_t origin = start(node);
    if (node + d <= M) return start(node + d) - origin;
    return (c.end() - origin) + (start(node + d - M) - c.begin);
  }
  uint64_t region(uint32_t node, uint32_t shard) const {
    return regionBase_ + uint64_t(shards_.ordinal(node, shard)) * regionStride_;
  }

  const GenContext& ctx_;
  const HierShards& shards_;
  const BruckPlan& plan_;
  uint64_t regionBase_ = 0, regionStride_ = 0, chunkMax_ = 0, blockMax_ = 0, perChunk_ = 0;
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
  /// readyAt[owned][chunk][stage]: signals to `ready` after reducer stage `stage` of the chunk (0: the partial is
  /// in the rotated copy; rho + 1: reduce-scatter round rho, in emission order, reduced).
  std::vector<std::vector<std::vector<uint64_t>>> readyAt;
  /// agThrough[owned][k][chunk]: all-gather pieces of round k that arrive through this chunk (running count).
  std::vector<std::vector<std::vector<uint64_t>>> agThrough;
  /// readyAwaited[owned]: the most `ready` signals the sender or the mover waits for.
  std::vector<uint64_t> readyAwaited;
};

/// Emits one channel of the bruck variant: per rank, phase 1 (mover), the reducer (the partial into the rotated
/// copy, each reduce-scatter round's reduction), the sender (reduce-scatter, all-gather), phase 3 (mover); then
/// every rank's completion waits.
class BruckVariant {
 public:
  BruckVariant(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part)
      : b_(b),
        ctx_(ctx),
        lanes_(b, ctx, channel),
        layout_(hierLayout(ctx)),
        plan_(bruckPlan(layout_.nodes, ctx.opt.inter)),
        shards_(ctx, layout_, channel, part),
        walk_(ctx, layout_, shards_, plan_, channel),
        scratch_(scratchBuffer(ctx)) {
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
        me.readyAwaited.assign(me.owned.size(), 0);
        countArrivals(me);
        reserveSteps(me);
        sendPhase1(me);
        runReducer(me);
        runSender(me);
        if (me.localRanks > 1) sendPhase3(me);
        consumeReady(me);
      }
    waitForCompletion();
  }

 private:
  uint32_t chunks() const { return ctx_.opt.chunks; }
  uint32_t rounds() const { return plan_.rounds; }
  uint32_t nodes() const { return plan_.nodes; }

  /// What round k of the all-gather brings `node` of chunk t: relative blocks [D_k, D_k + c_k), as node n + D_k
  /// sends them.
  BlockPieces agIncoming(uint32_t node, uint32_t shard, uint32_t t, uint32_t k) const {
    return agPieces(walk_.chunk(shard, t), nodes(), (node + plan_.distance(k)) % nodes(), plan_.blocks(k));
  }

  /// The two parts of chunk t of `shard` on `node` that phase 1 delivers and phase 3 forwards one after the
  /// other: part 0 = what the first reduce-scatter round r0 sends, relative blocks [D_r0, D_r0 + c_r0) ([h, M),
  /// h = D_(J-1), without the swap), so that the network starts after that part of phase 1; part 1 = the rest
  /// ([0, h) without the swap), final before the last all-gather round, so that only part 0 remains to forward
  /// after it. Each cut as agPieces cuts it (the same number of messages on every node). On 2 nodes part 0 is the
  /// whole chunk in one piece and part 1 is empty: there the NVLink phases, not the network, bound the op, and the
  /// parts would only add messages to them.
  BlockPieces part(uint32_t node, uint32_t shard, uint32_t t, uint32_t which) const {
    const uint32_t M = nodes(), r0 = plan_.firstRound();
    const uint32_t from = plan_.distance(r0), count = plan_.blocks(r0);
    if (M == 2) {
      BlockPieces whole;
      whole.piece[0] = walk_.chunk(shard, t);
      whole.n = which == 0 ? 1 : 0;
      return whole;
    }
    return which == 0 ? agPieces(walk_.chunk(shard, t), M, (node + from) % M, count)
                      : agPieces(walk_.chunk(shard, t), M, (node + from + count) % M, M - count);
  }

  /// Part `which` of the partial as the reducer writes it into the rotated copy: pieces that never cross block
  /// `node`'s first element, where the rotation wraps. Part 0 and, without the swap, part 1 start or end there;
  /// with the swap part 1 (relative blocks [2^(J-1), M) and [0, 2^(J-2))) is cut into its two ranges, each as
  /// agPieces cuts it; the whole chunk of 2 nodes at block `node` (node 0 in the middle: two steps everywhere).
  std::vector<Range> reducePart(uint32_t node, uint32_t shard, uint32_t t, uint32_t which) const {
    const uint32_t M = nodes();
    std::vector<Range> out;
    auto add = [&](const BlockPieces& p) {
      for (uint32_t i = 0; i < p.n; ++i) out.push_back(p.piece[i]);
    };
    const Range c = walk_.chunk(shard, t);
    if (M == 2) {
      if (which != 0) return out;
      uint64_t cut = walk_.block(shard, t, node).begin;
      if (cut == c.begin) cut = splitRange(c, 2, 1).begin;
      return {Range{cut, c.end() - cut}, Range{c.begin, cut - c.begin}};
    }
    if (which == 0 || !plan_.swapped()) {
      add(part(node, shard, t, which));
      return out;
    }
    const uint32_t J = rounds(), h = plan_.distance(J - 1);
    add(agPieces(c, M, (node + h) % M, M - h));
    add(agPieces(c, M, node, plan_.distance(J - 2)));
    return out;
  }

  void countArrivals(BruckRank& me) const {
    const uint32_t J = rounds();
    me.agThrough.assign(me.owned.size(), std::vector<std::vector<uint64_t>>(J, std::vector<uint64_t>(chunks(), 0)));
    for (std::size_t jo = 0; jo < me.owned.size(); ++jo)
      for (uint32_t k = 0; k < J; ++k) {
        uint64_t n = 0;
        for (uint32_t t = 0; t < chunks(); ++t)
          me.agThrough[jo][k][t] = n += agIncoming(me.node, me.owned[jo], t, k).nonEmpty();
      }
  }

  /// Upper bounds of each lane's steps (see the rhd variant: growing lane vectors by doubling is costly).
  void reserveSteps(const BruckRank& me) {
    const uint32_t r = me.rank;
    const uint64_t k = chunks(), own = me.owned.size(), g = me.localRanks, j = rounds();
    if (g > 1) b_.reserveSteps(r, lanes_.mover(r), 4 * k * (layout_.shards - own) + k * own * (4 * g + j));
    b_.reserveSteps(r, lanes_.reducer(r), k * own * (6 * g + 3 * j) + 1 + uint64_t(layout_.maxOwned) * j);
    b_.reserveSteps(r, lanes_.sender(r), k * own * 5 * j);
  }

  /// Phase 1, intra-node reduce-scatter (mover): per chunk, part 0 (part()) of the input to each shard's owner,
  /// then part 1, into the owner's phase-1 slot for this rank.
  void sendPhase1(const BruckRank& me) {
    const uint32_t r = me.rank, node = me.node;
    for (uint32_t t = 0; t < chunks() && me.localRanks > 1; ++t)
      for (const uint32_t which : {0u, 1u})
        for (uint32_t i = 1; i < me.localRanks; ++i) {
          const uint32_t peerIndex = (me.localIndex + i) % me.localRanks;
          const uint32_t peer = ctx_.nodeRanks[node][peerIndex];
          for (uint32_t s = peerIndex; s < shards_.count(); s += me.localRanks) {
            const BlockPieces pieces = part(node, s, t, which);
            for (uint32_t p = 0; p < pieces.n; ++p) {
              const Range u = pieces.piece[p];
              if (u.size > 0)
                b_.put(r, lanes_.mover(r), bufRef(peer, scratch_, shards_.phase1Slot(node, me.localIndex, s, u.begin)),
                       bufRef(r, ctx_.input, u.begin), u.size, flags_.phase1Arrived[me.localIndex]);
            }
          }
        }
  }

  /// The reducer, stage by stage in wavefront order: stage 0 of a chunk puts its node partial into the rotated
  /// copy (the phase-1 reduction, or a copy of the input on a node of one rank), part 0 of every owned shard
  /// (signalled: what the first round sends) before part 1; stage rho + 1 reduces what reduce-scatter round rho
  /// brought; fills me.readyAt.
  void runReducer(BruckRank& me) {
    const uint32_t r = me.rank, node = me.node, J = rounds();
    const uint32_t red = lanes_.reducer(r);
    const auto own = me.owned.size();
    me.readyAt.assign(own, std::vector<std::vector<uint64_t>>(chunks(), std::vector<uint64_t>(J + 1, 0)));
    std::vector<uint64_t> phase1Seen(me.localRanks, 0), rsSeen(own * size_t(J), 0);
    rhdWavefront(chunks(), J + 1, [&](uint32_t t, uint32_t stage) {
      if (stage == 0) {
        for (const uint32_t which : {0u, 1u})
          for (std::size_t jo = 0; jo < own; ++jo) {
            const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
            // Part 1 is signalled too: where the first round's reduction is empty, the second round sends from it.
            if (walk_.chunk(s, t).size > 0) {
              partialIntoWork(me, s, t, which, phase1Seen);
              b_.signal(r, red, r, flags_.ready[m]);
            }
            if (which == 0) me.readyAt[jo][t][0] = b_.signalsSent(r, flags_.ready[m]);
          }
        return;
      }
      for (std::size_t jo = 0; jo < own; ++jo) {
        const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
        const uint32_t rho = stage - 1, k = plan_.rsRound(rho);
        const Range in = walk_.relative(node, s, t, 0, plan_.blocks(k));
        if (in.size > 0) {
          b_.wait(r, red, flags_.rsArrived[k][m], ++rsSeen[jo * size_t(J) + k]);
          const BufRef acc = bufRef(r, scratch_, walk_.workSlot(node, s, t, in.begin));
          // The last round's block is the node's own, final: into output, where the all-gather reads it.
          const BufRef dst = k == 0 ? bufRef(r, ctx_.output, walk_.block(s, t, node).begin) : acc;
          b_.reduce(r, red, dst, acc, bufRef(r, scratch_, walk_.rsSlot(node, s, t, k, in.begin)), in.size);
          b_.signal(r, red, r, flags_.ready[m]);
        }
        me.readyAt[jo][t][stage] = b_.signalsSent(r, flags_.ready[m]);
      }
    });
  }

  /// Part `which` (part()) of the node partial of chunk t of `shard` into the rotated copy: the reduction of
  /// every local rank's contribution once phase 1 has delivered it, or a copy of the input.
  void partialIntoWork(const BruckRank& me, uint32_t shard, uint32_t t, uint32_t which,
                       std::vector<uint64_t>& phase1Seen) {
    const uint32_t r = me.rank, node = me.node, red = lanes_.reducer(r);
    const uint32_t arriving = part(node, shard, t, which).nonEmpty();
    for (uint32_t l = 0; l < me.localRanks && arriving > 0; ++l)
      if (l != me.localIndex) b_.wait(r, red, flags_.phase1Arrived[l], phase1Seen[l] += arriving);
    for (const Range u : reducePart(node, shard, t, which)) {
      if (u.size == 0) continue;
      const BufRef dst = bufRef(r, scratch_, walk_.workSlot(node, shard, t, walk_.rotated(node, shard, t, u.begin)));
      if (me.localRanks == 1) {
        b_.copy(r, red, dst, bufRef(r, ctx_.input, u.begin), u.size);
        continue;
      }
      auto operand = [&](uint32_t l) {
        return l == me.localIndex ? bufRef(r, ctx_.input, u.begin)
                                  : bufRef(r, scratch_, shards_.phase1Slot(node, l, shard, u.begin));
      };
      reduceChain(b_, r, red, dst, me.localRanks, operand, u.size);
    }
  }

  /// The sender, stage by stage in wavefront order: stages 0 .. J-1 the reduce-scatter rounds (each once the
  /// reducer has finished the rounds before), stages J .. 2J-1 the all-gather rounds (each once the own block is
  /// final and every earlier round's arrivals of the chunk are in).
  void runSender(BruckRank& me) {
    const uint32_t r = me.rank, node = me.node, J = rounds(), M = nodes();
    const uint32_t snd = lanes_.sender(r);
    const auto own = me.owned.size();
    std::vector<uint64_t> readyWaited(own, 0), agWaited(own * size_t(J), 0);
    auto waitReady = [&](std::size_t jo, uint32_t m, uint64_t need) {
      if (need <= readyWaited[jo]) return;
      b_.wait(r, snd, flags_.ready[m], need);
      readyWaited[jo] = need;
      me.readyAwaited[jo] = std::max(me.readyAwaited[jo], need);
    };
    rhdWavefront(chunks(), 2 * J, [&](uint32_t t, uint32_t stage) {
      for (std::size_t jo = 0; jo < own; ++jo) {
        const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
        if (stage < J) {
          const uint32_t k = plan_.rsRound(stage), dst = (node + plan_.distance(k)) % M;
          const Range out = walk_.relative(node, s, t, plan_.distance(k), plan_.blocks(k));
          if (out.size == 0) continue;
          waitReady(jo, m, me.readyAt[jo][t][stage]);
          b_.put(r, snd, bufRef(shards_.owner(dst, s), scratch_, walk_.rsSlot(dst, s, t, k, 0)),
                 bufRef(r, scratch_, walk_.workSlot(node, s, t, out.begin)), out.size,
                 flags_.rsArrived[k][shards_.ordinal(dst, s)]);
          continue;
        }
        const uint32_t q = stage - J, k = plan_.agRound(q), dst = (node + M - plan_.distance(k)) % M;
        const BlockPieces out = agPieces(walk_.chunk(s, t), M, node, plan_.blocks(k));
        if (out.nonEmpty() == 0) continue;
        waitReady(jo, m, me.readyAt[jo][t][J]);
        for (uint32_t earlier = 0; earlier < q; ++earlier) {
          const uint32_t before = plan_.agRound(earlier);
          const size_t i = jo * size_t(J) + before;
          const uint64_t need = me.agThrough[jo][before][t];
          if (need <= agWaited[i]) continue;
          b_.wait(r, snd, flags_.agArrived[before][m], need);
          agWaited[i] = need;
        }
        for (uint32_t p = 0; p < out.n; ++p) {
          const Range u = out.piece[p];
          if (u.size == 0) continue;
          b_.put(r, snd, bufRef(shards_.owner(dst, s), ctx_.output, u.begin), bufRef(r, ctx_.output, u.begin), u.size,
                 flags_.agArrived[k][shards_.ordinal(dst, s)]);
        }
      }
    });
  }

  /// Phase 3, intra-node all-gather (mover), per chunk t: part 1 (part()) of each owned shard to the node's other
  /// ranks once final (the own block reduced, the all-gather arrivals of every round but the last), then part 0,
  /// which the last all-gather round brings.
  void sendPhase3(BruckRank& me) {
    const uint32_t r = me.rank, node = me.node, J = rounds(), mover = lanes_.mover(r);
    const auto own = me.owned.size();
    std::vector<uint64_t> readySeen(own, 0), agDone(own * size_t(J), 0);
    auto waitRounds = [&](std::size_t jo, uint32_t m, uint32_t t, uint32_t except) {  // every round but `except`
      for (uint32_t k = 0; k < J; ++k) {
        if (k == except) continue;
        const size_t i = jo * size_t(J) + k;
        if (me.agThrough[jo][k][t] <= agDone[i]) continue;
        b_.wait(r, mover, flags_.agArrived[k][m], me.agThrough[jo][k][t]);
        agDone[i] = me.agThrough[jo][k][t];
      }
    };
    for (uint32_t t = 0; t < chunks(); ++t)
      for (const uint32_t which : {1u, 0u})
        for (std::size_t jo = 0; jo < own; ++jo) {
          const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
          if (walk_.chunk(s, t).size == 0) continue;
          if (which == 1) {
            const uint64_t need = me.readyAt[jo][t][J];
            if (need > readySeen[jo]) {
              b_.wait(r, mover, flags_.ready[m], need);
              readySeen[jo] = need;
              me.readyAwaited[jo] = std::max(me.readyAwaited[jo], need);
            }
          }
          waitRounds(jo, m, t, which == 1 ? plan_.firstRound() : J);
          const BlockPieces pieces = part(node, s, t, which);
          for (uint32_t i = 1; i < me.localRanks; ++i) {
            const uint32_t peer = ctx_.nodeRanks[node][(me.localIndex + i) % me.localRanks];
            for (uint32_t p = 0; p < pieces.n; ++p)
              if (pieces.piece[p].size > 0)
                b_.put(r, mover, bufRef(peer, ctx_.output, pieces.piece[p].begin),
                       bufRef(r, ctx_.output, pieces.piece[p].begin), pieces.piece[p].size, flags_.phase3Arrived);
          }
        }
  }

  /// The reducer's own wait for `ready` signals nobody else awaited (where the pieces that would have are empty:
  /// tiny chunks), so that every flag is consumed.
  void consumeReady(const BruckRank& me) {
    for (std::size_t jo = 0; jo < me.owned.size(); ++jo) {
      const uint32_t m = shards_.ordinal(me.node, me.owned[jo]);
      const uint64_t sent = b_.signalsSent(me.rank, flags_.ready[m]);
      if (sent > me.readyAwaited[jo]) b_.wait(me.rank, lanes_.reducer(me.rank), flags_.ready[m], sent);
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
  const uint16_t scratch_;
  BruckFlags flags_;
};

}  // namespace

void emitHierarchicalBruck(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  BruckVariant(b, ctx, channel, part).emit();
}

}  // namespace mk::detail
