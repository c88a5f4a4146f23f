// mkernel — all-reduce, hierarchical with recursive halving/doubling (Rabenseifner) as its inter-node phase
// (docs/algorithms-allreduce.md, "hierarchical, rhd"); its setup and AlgorithmDef are the ring variant's
// (allreduce_hierarchical.cpp), which dispatches here when inter = "rhd".
//
// Phase 1 and phase 3 as in the ring variant, but on K plain chunks of each shard (one piece per group), and
// per chunk a Rabenseifner all-reduce among the shard's owners on all nodes: recursive halving (reduce-scatter:
// at step j exchange half of the current range with the node at distance M2/2^(j+1), keep the half the own bit
// selects, reduce the received half into it) then recursive doubling (all-gather: the same partners
// backwards, each sending its whole current range straight into the partner's output). A non-power-of-two M
// folds: extra node M2 + i sends each chunk of its node partial to host node i, which
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
#include <functional>
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

void rhdWavefront(uint32_t chunks, uint32_t stages, const std::function<void(uint32_t, uint32_t)>& visit) {
  for (uint32_t d = 0; d + 1 < chunks + stages; ++d)
    for (uint32_t t = d >= stages ? d - stages + 1 : 0; t < chunks && t <= d; ++t) visit(t, d - t);
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

namespace {

/// Where the rhd variant's pieces of one channel are: chunk t of a shard, the range a node keeps after each
/// reduce-scatter step and the half it sends there, and where a folded chunk and each received half land in
/// the owner's scratch (after the phase-1 slots, per channel and owned shard one RHD region of rhdStride
/// elements: the fold slot, then per step j and chunk room for ceil(chunk / 2^(j+1)) elements).
class RhdWalk {
 public:
  RhdWalk(const GenContext& ctx, const HierLayout& layout, const HierShards& shards, const RhdPlan& plan,
          uint32_t channel)
      : ctx_(ctx), shards_(shards), plan_(plan) {
    regionBase_ = layout.ringBase;
    for (uint32_t c = 0; c < channel; ++c) regionBase_ += uint64_t(layout.maxOwned) * rhdStride(ctx, c);
    regionStride_ = rhdStride(ctx, channel);
    const uint64_t chunkMax = splitRange(Range{0, shards.stride()}, ctx.opt.chunks, 0).size;
    stepOffset_.assign(plan.steps + 1, plan.extra > 0 ? shards.stride() : 0);
    stepCapacity_.assign(plan.steps, 0);
    for (uint32_t j = 0; j < plan.steps; ++j) {
      stepCapacity_[j] = (chunkMax + (uint64_t(1) << (j + 1)) - 1) >> (j + 1);
      stepOffset_[j + 1] = stepOffset_[j] + uint64_t(ctx.opt.chunks) * stepCapacity_[j];
    }
  }

  /// Chunk `chunk` of `shard`.
  Range chunk(uint32_t shard, uint32_t chunk) const { return splitRange(shards_.range(shard), ctx_.opt.chunks, chunk); }
  /// The range `node` keeps of a chunk after reduce-scatter step `step` (step -1: the whole chunk).
  Range kept(uint32_t node, uint32_t shard, uint32_t chunkIdx, int step) const {
    Range r = chunk(shard, chunkIdx);
    for (int i = 0; i <= step; ++i) r = splitRange(r, 2, (node & plan_.distance(uint32_t(i))) ? 1 : 0);
    return r;
  }
  /// The half of a chunk `node` sends at reduce-scatter step `step`.
  Range sent(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint32_t step) const {
    return splitRange(kept(node, shard, chunkIdx, int(step) - 1), 2, (node & plan_.distance(step)) ? 0 : 1);
  }
  /// Scratch offset of `element` of a chunk folded in from the extra node, on the host `node`.
  uint64_t foldSlot(uint32_t node, uint32_t shard, uint64_t element) const {
    return region(node, shard) + (element - shards_.range(shard).begin);
  }
  /// Scratch offset on `node` of `element` of the half received at step `step` of chunk `chunkIdx`, whose
  /// kept range there is `keptRange`.
  uint64_t stepSlot(uint32_t node, uint32_t shard, uint32_t chunkIdx, uint32_t step, Range keptRange,
                    uint64_t element) const {
    return region(node, shard) + stepOffset_[step] + uint64_t(chunkIdx) * stepCapacity_[step] +
           (element - keptRange.begin);
  }

 private:
  uint64_t region(uint32_t node, uint32_t shard) const {
    return regionBase_ + uint64_t(shards_.ordinal(node, shard)) * regionStride_;
  }

  const GenContext& ctx_;
  const HierShards& shards_;
  const RhdPlan& plan_;
  uint64_t regionBase_ = 0;             ///< this channel's first RHD region
  uint64_t regionStride_ = 0;           ///< one owned shard's RHD region
  std::vector<uint64_t> stepOffset_;    ///< per step (and one past the last): offset inside a region
  std::vector<uint64_t> stepCapacity_;  ///< per step: elements reserved per chunk
};

/// The flags of one channel of the rhd variant (the file comment).
struct RhdFlags {
  std::vector<uint32_t> phase1Arrived;                 ///< per source local index
  std::vector<uint32_t> ready;                         ///< per ordinal: the reducer's self-signal
  std::vector<std::vector<uint32_t>> halvingArrived;   ///< [step][ordinal]: reduce-scatter arrivals
  std::vector<std::vector<uint32_t>> doublingArrived;  ///< [step][ordinal]: all-gather arrivals
  std::vector<uint32_t> foldIn, foldBack;              ///< per ordinal (only with extra nodes)
  uint32_t phase3Arrived = 0;
};

/// One rank's role in the rhd variant.
struct RhdRank {
  uint32_t node = 0, localIndex = 0, rank = 0;
  uint32_t localRanks = 0;  ///< G: ranks on the node
  bool isExtra = false;     ///< node >= M2: folds into its host
  bool isHost = false;      ///< node < E: takes the fold of node + M2
  uint32_t foldPeer = 0;    ///< the extra node's host, or the host's extra node
  std::vector<uint32_t> owned;
  /// Where the node partial of a chunk lives before the exchanges: output after phase 1 (or the fold), the
  /// input itself on a node of one rank.
  uint16_t partial = 0;
  /// readyAt[owned][chunk][k]: signals to `ready` after stage k of the chunk (k = 0: its partial is complete;
  /// k = j + 1: step j reduced), what the sender and phase 3 wait for.
  std::vector<std::vector<std::vector<uint64_t>>> readyAt;
};

/// Emits one channel of the rhd variant: per rank, its intra-node reduce-scatter sends (phase 1, mover), its
/// reducer (phase-1 reductions, the fold, each halving step's reduction), its inter-node exchanges (sender:
/// fold in, recursive halving, recursive doubling, fold back), and its intra-node all-gather sends (phase 3,
/// mover); then every rank's completion waits.
class RhdVariant {
 public:
  RhdVariant(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part)
      : b_(b),
        ctx_(ctx),
        lanes_(b, ctx, channel),
        layout_(hierLayout(ctx)),
        plan_(rhdPlan(layout_.nodes)),
        shards_(ctx, layout_, channel, part),
        walk_(ctx, layout_, shards_, plan_, channel),
        scratch_(scratchBuffer(ctx)),
        // Every exchanged half is non-empty (the smallest chunk splits into M2 pieces): every lane exists.
        full_(splitRange(shards_.range(layout_.shards - 1), ctx.opt.chunks, ctx.opt.chunks - 1).size >= plan_.pow2) {
    const uint32_t maxOwned = layout_.maxOwned;
    flags_.phase1Arrived = b.newFlags(layout_.shards > 1 ? layout_.shards : 0);
    flags_.ready = b.newFlags(maxOwned);
    for (uint32_t j = 0; j < plan_.steps; ++j) {
      flags_.halvingArrived.push_back(b.newFlags(maxOwned));
      flags_.doublingArrived.push_back(b.newFlags(maxOwned));
    }
    flags_.foldIn = b.newFlags(plan_.extra > 0 ? maxOwned : 0);
    flags_.foldBack = b.newFlags(plan_.extra > 0 ? maxOwned : 0);
    flags_.phase3Arrived = layout_.shards > 1 ? b.newFlag() : 0;
  }

  void emit() {
    for (uint32_t node = 0; node < layout_.nodes; ++node)
      for (uint32_t localIndex = 0; localIndex < ctx_.nodeSize(node); ++localIndex) {
        RhdRank me = planRank(node, localIndex);
        if (full_) reserveSteps(me);
        sendPhase1(me);
        runReducer(me);
        Exchanges(*this, me).emit();
        if (me.localRanks > 1) sendPhase3(me);
      }
    waitForCompletion();
  }

 private:
  uint32_t chunks() const { return ctx_.opt.chunks; }  ///< K
  uint32_t steps() const { return plan_.steps; }       ///< J: exchanges per pass

  RhdRank planRank(uint32_t node, uint32_t localIndex) const {
    RhdRank me;
    me.node = node;
    me.localIndex = localIndex;
    me.rank = ctx_.nodeRanks[node][localIndex];
    me.localRanks = ctx_.nodeSize(node);
    me.isExtra = node >= plan_.pow2;
    me.isHost = node < plan_.extra;
    me.foldPeer = me.isExtra ? node - plan_.pow2 : node + plan_.pow2;  // only meaningful for extra and host nodes
    me.owned = shards_.ownedBy(node, localIndex);
    me.partial = (me.localRanks > 1 || me.isHost) ? ctx_.output : ctx_.input;
    return me;
  }

  /// Where a halving step's own operand lives: before the first step the partial as phase 1 left it (the
  /// fold, on a host, leaves it in output), afterwards what the previous step reduced into output.
  uint16_t operandAt(const RhdRank& me, uint32_t step) const {
    return step == 0 && !me.isHost ? (me.localRanks > 1 ? ctx_.output : ctx_.input) : ctx_.output;
  }

  /// Upper bounds of each lane's steps (exact up to a few skipped waits): growing 24 k lane vectors by doubling
  /// made malloc half of the generation time at 8192 ranks.
  void reserveSteps(const RhdRank& me) {
    const uint32_t r = me.rank;
    const uint64_t k = chunks(), own = me.owned.size(), g = me.localRanks, j = steps();
    if (me.localRanks > 1)
      b_.reserveSteps(r, lanes_.mover(r), 2 * k * (layout_.shards - own + own * (g - 1)) + k * own * (g + 1 + j));
    b_.reserveSteps(r, lanes_.reducer(r), k * own * (4 * (g - 1) + 3 + 3 * j) + 1 + uint64_t(layout_.maxOwned) * j);
    b_.reserveSteps(r, lanes_.sender(r), k * own * (4 * j + 3 + j));
  }

  /// The two halves of chunk t of `shard` that phase 1 delivers one after the other on `node`: first the half
  /// the owner sends at halving step 0 (so that the network starts after half a chunk of phase 1), then the
  /// half it keeps. An extra node sends its chunk whole, and splits it the same way.
  Range phase1Half(uint32_t node, uint32_t shard, uint32_t t, bool first) const {
    return first ? walk_.sent(node, shard, t, 0) : walk_.kept(node, shard, t, 0);
  }

  /// Phase 1, intra-node reduce-scatter (mover): per chunk, the first halves (phase1Half) of the input to each
  /// shard's owner, then the second halves, one piece per half, into the owner's phase-1 slot for this rank.
  void sendPhase1(const RhdRank& me) {
    if (me.localRanks < 2) return;
    const uint32_t r = me.rank, node = me.node;
    for (uint32_t t = 0; t < chunks(); ++t)
      for (const bool first : {true, false})
        for (uint32_t i = 1; i < me.localRanks; ++i) {
          const uint32_t peerIndex = (me.localIndex + i) % me.localRanks;
          const uint32_t peer = ctx_.nodeRanks[node][peerIndex];
          for (uint32_t s = peerIndex; s < shards_.count(); s += me.localRanks) {
            const Range c = phase1Half(node, s, t, first);
            if (c.size > 0)
              b_.put(r, lanes_.mover(r), bufRef(peer, scratch_, shards_.phase1Slot(node, me.localIndex, s, c.begin)),
                     bufRef(r, ctx_.input, c.begin), c.size, flags_.phase1Arrived[me.localIndex]);
          }
        }
  }

  /// The reducer, stage by stage in wavefront order (rhdWavefront): stage 0 of a chunk is its phase-1
  /// reduction (and the fold on a host), stage j + 1 the reduction of halving step j's received half; fills
  /// me.readyAt.
  void runReducer(RhdRank& me) {
    const uint32_t r = me.rank, node = me.node, localRanks = me.localRanks, J = steps();
    const auto own = me.owned.size();
    me.readyAt.assign(own, std::vector<std::vector<uint64_t>>(chunks(), std::vector<uint64_t>(J + 1, 0)));
    std::vector<uint64_t> phase1Seen(localRanks, 0), foldSeen(own, 0), halvingSeen(own * size_t(J), 0);
    rhdWavefront(chunks(), me.isExtra ? 1 : J + 1, [&](uint32_t t, uint32_t k) {
      if (k == 0) {
        // The first halves of phase 1 (what halving step 0 sends): a plain node signals the sender at once.
        const bool early = !me.isHost && !me.isExtra;
        for (std::size_t jo = 0; jo < own && localRanks > 1; ++jo) {
          const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
          const Range c = phase1Half(node, s, t, true);
          if (c.size == 0) continue;
          emitChunkedPhase1Reduce(b_, ctx_, lanes_, shards_, node, me.localIndex, s, c, flags_.phase1Arrived,
                                  phase1Seen);
          if (early) b_.signal(r, lanes_.reducer(r), r, flags_.ready[m]);
        }
        if (early)
          for (std::size_t jo = 0; jo < own; ++jo)
            me.readyAt[jo][t][0] = b_.signalsSent(r, flags_.ready[shards_.ordinal(node, me.owned[jo])]);
        for (std::size_t jo = 0; jo < own; ++jo) {
          const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
          const Range c = walk_.chunk(s, t), second = phase1Half(node, s, t, false);
          if (second.size > 0 && localRanks > 1)
            emitChunkedPhase1Reduce(b_, ctx_, lanes_, shards_, node, me.localIndex, s, second, flags_.phase1Arrived,
                                    phase1Seen);
          if (early) continue;  // the kept half needs no signal: this lane reduces into it next
          if (c.size > 0 && me.isHost) {
            const uint32_t red = lanes_.reducer(r);
            b_.wait(r, red, flags_.foldIn[m], ++foldSeen[jo]);
            b_.reduce(r, red, bufRef(r, ctx_.output, c.begin),
                      bufRef(r, localRanks > 1 ? ctx_.output : ctx_.input, c.begin),
                      bufRef(r, scratch_, walk_.foldSlot(node, s, c.begin)), c.size);
          }
          if (c.size > 0 && (localRanks > 1 || me.isHost)) b_.signal(r, lanes_.reducer(r), r, flags_.ready[m]);
          me.readyAt[jo][t][0] = b_.signalsSent(r, flags_.ready[m]);
        }
        return;
      }
      const uint32_t j = k - 1;
      for (std::size_t jo = 0; jo < own; ++jo) {
        const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
        const Range u = walk_.kept(node, s, t, int(j));
        if (u.size > 0) {
          const uint32_t red = lanes_.reducer(r);
          b_.wait(r, red, flags_.halvingArrived[j][m], ++halvingSeen[jo * size_t(J) + j]);
          b_.reduce(r, red, bufRef(r, ctx_.output, u.begin), bufRef(r, operandAt(me, j), u.begin),
                    bufRef(r, scratch_, walk_.stepSlot(node, s, t, j, u, u.begin)), u.size);
          b_.signal(r, red, r, flags_.ready[m]);
        }
        me.readyAt[jo][t][j + 1] = b_.signalsSent(r, flags_.ready[m]);
      }
    });
  }

  /// The sender's inter-node exchanges, per chunk: the fold into the host (an extra node), or recursive
  /// halving, recursive doubling and, on a host, the final chunk back to its extra node. Arrivals are counted
  /// per flag to give exact thresholds.
  class Exchanges {
   public:
    Exchanges(RhdVariant& v, const RhdRank& me)
        : v_(v),
          me_(me),
          readyWaited_(me.owned.size(), 0),
          doublingSeen_(me.owned.size() * size_t(v.steps()), 0),
          doublingWaited_(me.owned.size() * size_t(v.steps()), 0) {}

    /// Stage by stage in wavefront order (rhdWavefront): an extra node's one stage is its fold-in; otherwise
    /// stages 0 .. J-1 are the halving steps, J .. 2J-1 the doubling steps, and a host's stage 2J its fold-back.
    void emit() {
      const uint32_t J = v_.steps();
      doneAt_.assign(me_.owned.size() * size_t(J), std::vector<uint64_t>(v_.chunks(), 0));
      const uint32_t stages = me_.isExtra ? 1 : 2 * J + (me_.isHost ? 1 : 0);
      rhdWavefront(v_.chunks(), stages, [&](uint32_t t, uint32_t st) {
        if (me_.isExtra)
          foldIn(t);
        else if (st < J)
          halve(t, st);
        else if (st < 2 * J)
          doubleBack(t, st - J);
        else
          foldBack(t);
      });
    }

   private:
    uint32_t sender() { return v_.lanes_.sender(me_.rank); }

    void waitReady(std::size_t jo, uint32_t ordinal, uint64_t need) {
      if (need <= readyWaited_[jo]) return;
      v_.b_.wait(me_.rank, sender(), v_.flags_.ready[ordinal], need);
      readyWaited_[jo] = need;
    }
    /// Wait until `need` doubling arrivals of `step` (the count through this chunk: doneAt_) have landed.
    void waitDoubling(std::size_t jo, uint32_t ordinal, uint32_t step, uint64_t need) {
      const size_t k = jo * size_t(v_.steps()) + step;
      if (need <= doublingWaited_[k]) return;
      v_.b_.wait(me_.rank, sender(), v_.flags_.doublingArrived[step][ordinal], need);
      doublingWaited_[k] = need;
    }

    /// An extra node's chunk `t` of its node partial into its host's fold slot.
    void foldIn(uint32_t t) {
      const uint32_t r = me_.rank, node = me_.node, host = me_.foldPeer;
      for (std::size_t jo = 0; jo < me_.owned.size(); ++jo) {
        const uint32_t s = me_.owned[jo], m = v_.shards_.ordinal(node, s);
        const Range c = v_.walk_.chunk(s, t);
        if (c.size == 0) continue;
        waitReady(jo, m, me_.readyAt[jo][t][0]);  // the phase-1 reduction of this chunk (none on a node of one rank)
        v_.b_.put(r, sender(), bufRef(v_.shards_.owner(host, s), v_.scratch_, v_.walk_.foldSlot(host, s, c.begin)),
                  bufRef(r, me_.partial, c.begin), c.size, v_.flags_.foldIn[v_.shards_.ordinal(host, s)]);
      }
    }

    /// Recursive halving (reduce-scatter), step j of chunk t: the half not kept goes to the partner at distance
    /// M2/2^(j+1) once the reducer has finished the previous step.
    void halve(uint32_t t, uint32_t j) {
      const uint32_t r = me_.rank, node = me_.node;
      for (std::size_t jo = 0; jo < me_.owned.size(); ++jo) {
        const uint32_t s = me_.owned[jo], m = v_.shards_.ordinal(node, s);
        const Range u = v_.walk_.sent(node, s, t, j);
        if (u.size == 0) continue;
        waitReady(jo, m, me_.readyAt[jo][t][j]);
        const uint32_t partner = node ^ v_.plan_.distance(j);
        v_.b_.put(r, sender(),
                  bufRef(v_.shards_.owner(partner, s), v_.scratch_, v_.walk_.stepSlot(partner, s, t, j, u, u.begin)),
                  bufRef(r, v_.operandAt(me_, j), u.begin), u.size,
                  v_.flags_.halvingArrived[j][v_.shards_.ordinal(partner, s)]);
      }
    }

    /// Recursive doubling (all-gather), the k-th step of chunk t: the same partners backwards, each sending its
    /// whole current range straight into the partner's output, the first step's once the reducer is done,
    /// every other once the previous doubling step's half of this chunk has arrived.
    void doubleBack(uint32_t t, uint32_t k) {
      const uint32_t r = me_.rank, node = me_.node, J = v_.steps();
      const uint32_t j = J - 1 - k;
      for (std::size_t jo = 0; jo < me_.owned.size(); ++jo) {
        const uint32_t s = me_.owned[jo], m = v_.shards_.ordinal(node, s);
        // What arrives at this step: the partner's kept range, i.e. what this node sent at step j.
        const size_t i = jo * size_t(J) + j;
        if (v_.walk_.sent(node, s, t, j).size > 0) ++doublingSeen_[i];
        doneAt_[i][t] = doublingSeen_[i];
        const Range u = v_.walk_.kept(node, s, t, int(j));
        if (u.size == 0) continue;
        if (k == 0)
          waitReady(jo, m, me_.readyAt[jo][t][J]);
        else
          waitDoubling(jo, m, j + 1, doneAt_[i + 1][t]);
        const uint32_t partner = node ^ v_.plan_.distance(j);
        v_.b_.put(r, sender(), bufRef(v_.shards_.owner(partner, s), v_.ctx_.output, u.begin),
                  bufRef(r, v_.ctx_.output, u.begin), u.size,
                  v_.flags_.doublingArrived[j][v_.shards_.ordinal(partner, s)]);
      }
    }

    /// A host's final chunk `t` back to its extra node, once every doubling step's half has arrived.
    void foldBack(uint32_t t) {
      const uint32_t r = me_.rank, node = me_.node, extra = me_.foldPeer;
      for (std::size_t jo = 0; jo < me_.owned.size(); ++jo) {
        const uint32_t s = me_.owned[jo], m = v_.shards_.ordinal(node, s);
        const Range c = v_.walk_.chunk(s, t);
        if (c.size == 0) continue;
        waitReady(jo, m, me_.readyAt[jo][t][v_.steps()]);
        for (uint32_t j = 0; j < v_.steps(); ++j) waitDoubling(jo, m, j, doneAt_[jo * size_t(v_.steps()) + j][t]);
        v_.b_.put(r, sender(), bufRef(v_.shards_.owner(extra, s), v_.ctx_.output, c.begin),
                  bufRef(r, v_.ctx_.output, c.begin), c.size, v_.flags_.foldBack[v_.shards_.ordinal(extra, s)]);
      }
    }

    RhdVariant& v_;
    const RhdRank& me_;
    std::vector<uint64_t> readyWaited_;          ///< per owned shard: `ready` awaited so far
    std::vector<uint64_t> doublingSeen_;         ///< [owned][step]: doubling arrivals so far
    std::vector<uint64_t> doublingWaited_;       ///< [owned][step]: doubling arrivals awaited so far
    std::vector<std::vector<uint64_t>> doneAt_;  ///< [owned][step][chunk]: doubling arrivals through the chunk
  };

  /// Phase 3, intra-node all-gather (mover), per chunk t in two pieces, each owned shard's first piece before
  /// any second one: the half the node kept at halving step 0, once final (the own reductions and the doubling
  /// arrivals of steps J-1 .. 1), then the half the last doubling step delivers (step 0), so that only a half
  /// chunk remains to forward after the network's last message. On an extra node the chunk its host sent back,
  /// whole.
  void sendPhase3(const RhdRank& me) {
    const uint32_t r = me.rank, node = me.node, J = steps();
    const auto own = me.owned.size();
    std::vector<uint64_t> readySeen(own, 0), doublingCount(own * size_t(J), 0), doublingDone(own * size_t(J), 0),
        backCount(own, 0);
    const uint32_t mover = lanes_.mover(r);
    auto waitDoubling = [&](std::size_t jo, uint32_t m, uint32_t j) {
      const size_t k = jo * size_t(J) + j;
      if (doublingCount[k] <= doublingDone[k]) return;
      b_.wait(r, mover, flags_.doublingArrived[j][m], doublingCount[k]);
      doublingDone[k] = doublingCount[k];
    };
    for (uint32_t t = 0; t < chunks(); ++t) {
      for (std::size_t jo = 0; jo < own; ++jo) {
        const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
        const Range c = walk_.chunk(s, t);
        if (c.size == 0) continue;
        if (me.isExtra) {
          b_.wait(r, mover, flags_.foldBack[m], ++backCount[jo]);
          forward(me, c);
          continue;
        }
        const uint64_t need = me.readyAt[jo][t][J];
        if (need > readySeen[jo]) {
          b_.wait(r, mover, flags_.ready[m], need);
          readySeen[jo] = need;
        }
        for (uint32_t j = 0; j < J; ++j)
          if (walk_.sent(node, s, t, j).size > 0) ++doublingCount[jo * size_t(J) + j];
        for (uint32_t j = 1; j < J; ++j) waitDoubling(jo, m, j);
        forward(me, walk_.kept(node, s, t, 0));
      }
      for (std::size_t jo = 0; jo < own && !me.isExtra; ++jo) {
        const uint32_t s = me.owned[jo], m = shards_.ordinal(node, s);
        const Range half = walk_.sent(node, s, t, 0);
        if (half.size == 0) continue;
        waitDoubling(jo, m, 0);
        forward(me, half);
      }
    }
  }

  /// Phase 3's puts of range `c` of the output to the node's other ranks.
  void forward(const RhdRank& me, Range c) {
    if (c.size == 0) return;
    for (uint32_t i = 1; i < me.localRanks; ++i) {
      const uint32_t peer = ctx_.nodeRanks[me.node][(me.localIndex + i) % me.localRanks];
      b_.put(me.rank, lanes_.mover(me.rank), bufRef(peer, ctx_.output, c.begin), bufRef(me.rank, ctx_.output, c.begin),
             c.size, flags_.phase3Arrived);
    }
  }

  /// Completion: non-owned shards arrive in phase 3; a node of one rank ends with its own last arrivals.
  void waitForCompletion() {
    for (uint32_t r = 0; r < ctx_.nRanks; ++r) {
      const uint32_t node = ctx_.nodeOf[r];
      if (layout_.shards > 1) waitForAll(b_, lanes_, r, flags_.phase3Arrived);
      if (ctx_.nodeSize(node) == 1) {
        for (uint32_t m = 0; m < layout_.maxOwned; ++m) {
          if (node >= plan_.pow2) waitForAll(b_, lanes_, r, flags_.foldBack[m]);
          for (uint32_t j = 0; j < steps() && node < plan_.pow2; ++j)
            waitForAll(b_, lanes_, r, flags_.doublingArrived[j][m]);
        }
      }
    }
  }

  ScheduleBuilder& b_;
  const GenContext& ctx_;
  ChannelLanes lanes_;
  const HierLayout layout_;
  const RhdPlan plan_;
  const HierShards shards_;
  const RhdWalk walk_;
  const uint16_t scratch_;
  const bool full_;
  RhdFlags flags_;
};

}  // namespace

void emitHierarchicalRhd(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  RhdVariant(b, ctx, channel, part).emit();
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
  const PathCounts zero, put = nvGroup(1, 1), red1 = redGroup(1, 1), land = netLands();
  auto partner = [&](uint32_t n, uint32_t j) { return n ^ plan.distance(j); };
  // Lane clocks per node, and per node and chunk what other lanes wait for: ready[k] after reducer stage k
  // (0: the partial, j + 1: halving step j reduced), the end of sender stage s (halving j = s, doubling
  // k = s - J), the fold-in and fold-back sends, and when the chunk is final on the node.
  struct Chunk {
    std::vector<PathCounts> ready, send;
    PathCounts fold, back, finalReady;
  };
  struct Node {
    PathCounts red, snd, mu, arrivals;
    std::vector<Chunk> chunk;
  };
  std::vector<Node> st(M);
  // Phase 1 in half rounds (first halves, then second halves of chunk t): roundsA[t], roundsB[t].
  std::vector<std::vector<PathCounts>> roundsA(M, std::vector<PathCounts>(K)), rounds = roundsA;
  const PathCounts halfPut = nvGroup(1, J > 0 ? frac[0] : 1), halfRed = redGroup(1, J > 0 ? frac[0] : 1);
  for (uint32_t n = 0; n < M; ++n) {
    st[n].chunk.assign(K, Chunk{std::vector<PathCounts>(J + 1), std::vector<PathCounts>(2 * J), {}, {}, {}});
    for (uint32_t t = 0; t < K; ++t) {
      roundsA[n][t] = (t ? rounds[n][t - 1] : zero) + nodes[n].p1Puts * halfPut;
      rounds[n][t] = roundsA[n][t] + nodes[n].p1Puts * halfPut;
    }
    st[n].mu = rounds[n][K - 1];
  }
  auto reducerStage = [&](uint32_t n, uint32_t t, uint32_t k) {
    Node& s = st[n];
    Chunk& c = s.chunk[t];
    if (k == 0) {
      c.ready[0] = zero;      // a node of one rank sends its own input at once
      if (nodes[n].phases) {  // a plain node's sender starts on the first halves
        s.red = longest(s.red, roundsA[n][t]) + nodes[n].perOwner * halfRed;
        if (n < M2 && n >= plan.extra) c.ready[0] = s.red + flagHop();
        s.red = longest(s.red, rounds[n][t]) + nodes[n].perOwner * halfRed;
        if (n >= M2 || n < plan.extra) c.ready[0] = s.red + flagHop();
      }
      if (n < plan.extra) {  // a host reduces its extra node's chunk in
        s.red = longest(s.red, st[n + M2].chunk[t].fold + land) + nodes[n].owned * red1;
        c.ready[0] = s.red + flagHop();
      }
      return;
    }
    const uint32_t j = k - 1;
    s.red = longest(s.red, st[partner(n, j)].chunk[t].send[j] + land) + nodes[n].owned * redGroup(1, frac[j]);
    c.ready[k] = s.red + flagHop();
  };
  auto senderStage = [&](uint32_t n, uint32_t t, uint32_t sg) {
    Node& s = st[n];
    Chunk& c = s.chunk[t];
    if (sg < J) {
      c.send[sg] = s.snd = longest(s.snd, c.ready[sg]) + nodes[n].owned * netGroup(1, frac[sg]);
    } else if (sg < 2 * J) {
      const uint32_t k = sg - J, j = J - 1 - k;
      const PathCounts ready = k == 0 ? c.ready[J] : st[partner(n, j + 1)].chunk[t].send[sg - 1] + land;
      c.send[sg] = s.snd = longest(s.snd, ready) + nodes[n].owned * netGroup(1, frac[j]);
    } else {  // a host's fold-back, once the chunk is final here
      c.finalReady = c.ready[J];
      for (uint32_t k = 0; k < J; ++k)
        c.finalReady = longest(c.finalReady, st[partner(n, J - 1 - k)].chunk[t].send[J + k] + land);
      c.back = s.snd = longest(s.snd, c.finalReady) + nodes[n].owned * netGroup(1, 1);
    }
  };
  // Wavefront order, as the lanes run (rhdWavefront): per (chunk, stage) the extra nodes' stage 0 (their
  // partial and fold-in) first, then every node's reducer stage, then every node's sender stage.
  const uint32_t senderStages = 2 * J + (plan.extra > 0 ? 1 : 0);
  rhdWavefront(K, senderStages, [&](uint32_t t, uint32_t sg) {
    if (sg == 0)
      for (uint32_t n = M2; n < M; ++n) {
        reducerStage(n, t, 0);
        st[n].chunk[t].fold = st[n].snd = longest(st[n].snd, st[n].chunk[t].ready[0]) + nodes[n].owned * netGroup(1, 1);
      }
    if (sg <= J)
      for (uint32_t n = 0; n < M2; ++n) reducerStage(n, t, sg);
    for (uint32_t n = 0; n < M2; ++n)
      if (sg < 2 * J || n < plan.extra) senderStage(n, t, sg);
  });
  // Phase 3 per chunk: on a node of the exchanges the half kept at step 0 once final (all but the last doubling
  // arrival), then the other half (the last arrival, step 0); on an extra node the chunk sent back, whole.
  const PathCounts half = nvGroup(1, J > 0 ? frac[0] : 1);
  for (uint32_t t = 0; t < K; ++t)
    for (uint32_t n = 0; n < M; ++n) {
      Chunk& c = st[n].chunk[t];
      if (n >= M2) {
        c.finalReady = st[n - M2].chunk[t].back + land;
        st[n].arrivals = longest(st[n].arrivals, c.finalReady);
        if (nodes[n].phases) st[n].mu = longest(st[n].mu, c.finalReady) + nodes[n].perOwner * put;
        continue;
      }
      PathCounts keptFinal = c.ready[J];
      for (uint32_t k = 0; k + 1 < J; ++k)
        keptFinal = longest(keptFinal, st[partner(n, J - 1 - k)].chunk[t].send[J + k] + land);
      const PathCounts last = J > 0 ? st[partner(n, 0)].chunk[t].send[2 * J - 1] + land : zero;
      if (n >= plan.extra) c.finalReady = longest(keptFinal, last);  // (a host computed it for its fold-back)
      st[n].arrivals = longest(st[n].arrivals, c.finalReady);
      if (nodes[n].phases)
        st[n].mu = longest(longest(st[n].mu, keptFinal) + nodes[n].perOwner * half, last) + nodes[n].perOwner * half;
    }
  PathCounts total = zero;
  for (uint32_t n = 0; n < M; ++n) {
    const Node& s = st[n];
    PathCounts end = longest({s.red, s.snd, nodes[n].phases ? s.mu : s.arrivals});
    total = n ? longest(total, end) : end;
  }
  return total;
}

}  // namespace mk::detail
