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
  checkInterPhase(ctx.opt.inter);
  if (ctx.opt.inter == InterPhase::Auto)
    throw Error(ErrorCode::Internal,
                std::string("hierarchical: inter '") + toString(ctx.opt.inter) + "' reached the generator unresolved");
  return ctx.opt.inter == InterPhase::Rhd && ctx.nNodes() > 1;
}

bool useBruck(const GenContext& ctx) {
  useRhd(ctx);  // the same check that inter was resolved
  return (ctx.opt.inter == InterPhase::Bruck || ctx.opt.inter == InterPhase::BruckHalf) && ctx.nNodes() > 1;
}

HierLayout hierLayout(const GenContext& ctx) {
  HierLayout h;
  h.shards = ctx.maxLocal;
  h.nodes = ctx.nNodes();
  h.maxOwned = maxOwnedShards(ctx);
  h.slot = hierChannelBase(ctx, h.maxOwned, effectiveChannels(ctx));
  h.ringBase = checkedProduct(h.shards > 1 ? h.shards : 0, h.slot, "hierarchical (maxLocal x shard)");
  if (useRhd(ctx) || useBruck(ctx)) {
    // Phase-1 slots as for the ring, then the RHD (Bruck) regions (maxOwned per channel) instead of the ring slot.
    uint64_t regions = 0;
    for (uint32_t c = 0; c < effectiveChannels(ctx); ++c)
      regions +=
          checkedProduct(h.maxOwned, useRhd(ctx) ? rhdStride(ctx, c) : bruckStride(ctx, c), "hierarchical rhd/bruck");
    h.scratchCount = h.ringBase + regions;
    return h;
  }
  const uint64_t slots = (h.shards > 1 ? h.shards : 0) + (h.nodes > 1 ? 1 : 0);
  h.scratchCount = checkedProduct(slots, h.slot, "hierarchical (slots x shard)");
  return h;
}

HierShards::HierShards(const GenContext& ctx, const HierLayout& layout, uint32_t channel, Range part)
    : ctx_(ctx), layout_(layout), part_(part) {
  channelBase_ = hierChannelBase(ctx, layout.maxOwned, channel);
  stride_ = range(0).size;
}

std::vector<uint32_t> HierShards::ownedBy(uint32_t node, uint32_t localIndex) const {
  std::vector<uint32_t> owned;
  for (uint32_t s = localIndex; s < layout_.shards; s += ctx_.nodeSize(node)) owned.push_back(s);
  return owned;
}

void emitChunkedPhase1(ScheduleBuilder& b, const GenContext& ctx, ChannelLanes& lanes, const HierShards& shards,
                       uint32_t node, uint32_t localIndex, const std::vector<uint32_t>& phase1Arrived) {
  const uint32_t localRanks = ctx.nodeSize(node), r = ctx.nodeRanks[node][localIndex];
  const uint16_t scratch = scratchBuffer(ctx);
  for (uint32_t t = 0; t < ctx.opt.chunks && localRanks > 1; ++t)
    for (uint32_t i = 1; i < localRanks; ++i) {
      const uint32_t peerIndex = (localIndex + i) % localRanks;
      const uint32_t peer = ctx.nodeRanks[node][peerIndex];
      for (uint32_t s = peerIndex; s < shards.count(); s += localRanks) {
        const Range c = splitRange(shards.range(s), ctx.opt.chunks, t);
        if (c.size > 0)
          b.put(r, lanes.mover(r), bufRef(peer, scratch, shards.phase1Slot(node, localIndex, s, c.begin)),
                bufRef(r, ctx.input, c.begin), c.size, phase1Arrived[localIndex]);
      }
    }
}

void emitChunkedPhase1Reduce(ScheduleBuilder& b, const GenContext& ctx, ChannelLanes& lanes, const HierShards& shards,
                             uint32_t node, uint32_t localIndex, uint32_t shard, Range chunk,
                             const std::vector<uint32_t>& phase1Arrived, std::vector<uint64_t>& seen) {
  const uint32_t localRanks = ctx.nodeSize(node), r = ctx.nodeRanks[node][localIndex];
  const uint16_t scratch = scratchBuffer(ctx);
  const uint32_t red = lanes.reducer(r);
  for (uint32_t l = 0; l < localRanks; ++l)
    if (l != localIndex) b.wait(r, red, phase1Arrived[l], ++seen[l]);
  auto operand = [&](uint32_t l) {
    return l == localIndex ? bufRef(r, ctx.input, chunk.begin)
                           : bufRef(r, scratch, shards.phase1Slot(node, l, shard, chunk.begin));
  };
  reduceChain(b, r, red, bufRef(r, ctx.output, chunk.begin), localRanks, operand, chunk.size);
}

namespace {

void setupHierarchical(ScheduleBuilder& b, GenContext& ctx) {
  const HierLayout h = hierLayout(ctx);
  if (h.scratchCount > 0) ctx.scratch = b.addBuffer("scratch", ctx.spec.dtype, BufferKind::Scratch, h.scratchCount);
}

/// Positions and groups of one rank's walk through a shard (the same for every node, shard and channel).
struct HierGeometry {
  uint32_t nodes = 0;              ///< M
  uint32_t ringChunks = 0;         ///< Kr: units per block
  uint32_t positions = 0;          ///< P = M * Kr
  uint32_t ringSteps = 0;          ///< L = (M - 1) * Kr: units one reduce-scatter (or all-gather) pass sends
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
                                                std::to_string(nodes) +
                                                " nodes gives more than 2^31 ring units per shard");
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

/// Node n's walk through a shard in the ring variant (the file comment): the unit at each position, the
/// pieces of each group, and where a shard's elements land in its owner's ring-receive slot.
class RingWalk {
 public:
  RingWalk(const HierShards& shards, const HierGeometry& geo, const HierLayout& layout)
      : shards_(shards), geo_(geo), layout_(layout) {}

  /// The unit at position `position` of `node`'s walk through `shard`.
  Range unitAt(uint32_t node, uint32_t shard, uint32_t position) const {
    const uint32_t kr = geo_.ringChunks, nodes = geo_.nodes;
    const uint32_t block = (node + nodes - position / kr) % nodes;
    return splitRange(splitRange(shards_.range(shard), nodes, block), kr, kr - 1 - position % kr);
  }
  /// The pieces group `group` of `shard` is sent in on `node`: one element range, or two where the group
  /// crosses a block boundary (cut at the walk's wrap where it has one, else at the first block boundary).
  Pieces pieces(uint32_t node, uint32_t shard, uint32_t group) const {
    const auto first = static_cast<uint32_t>(geo_.groups[group].begin);
    const auto end = static_cast<uint32_t>(geo_.groups[group].end());
    Pieces out;
    if (!geo_.twoPieces[group]) {
      out.piece[0] = span(node, shard, first, end);
      out.n = 1;
      return out;
    }
    const uint32_t kr = geo_.ringChunks;
    const uint32_t wrap = (node + 1) * kr;  // the walk wraps between positions wrap-1 and wrap
    const uint32_t cut = first < wrap && wrap < end ? wrap : (first / kr + 1) * kr;
    out.piece[0] = span(node, shard, first, cut);
    out.piece[1] = span(node, shard, cut, end);
    out.n = 2;
    return out;
  }
  /// Scratch offset of `element` of `shard` in its owner's ring-receive slot on `node`.
  uint64_t ringSlot(uint32_t node, uint32_t shard, uint64_t element) const {
    return layout_.ringBase + shards_.inSlot(node, shard, element);
  }

 private:
  /// Positions [first, end) that do not wrap cover one element range.
  Range span(uint32_t node, uint32_t shard, uint32_t first, uint32_t end) const {
    const uint64_t lo = unitAt(node, shard, end - 1).begin;
    return Range{lo, unitAt(node, shard, first).end() - lo};
  }

  const HierShards& shards_;
  const HierGeometry& geo_;
  const HierLayout& layout_;
};

/// The flags of one channel of the ring variant.
struct RingFlags {
  std::vector<uint32_t> phase1Arrived;  ///< per source local index: phase-1 pieces from it (in the owner's order)
  std::vector<uint32_t> phase1Reduced;  ///< per owned shard (ordinal): the reducer's "phase-1 group reduced"
  std::vector<uint32_t> ringArrived;    ///< per ordinal: ring reduce-scatter arrivals (one predecessor)
  std::vector<uint32_t> gatherArrived;  ///< per ordinal: ring all-gather arrivals (one predecessor)
  std::vector<uint32_t> ringReduced;    ///< per ordinal: the reducer's "ring unit reduced"
  uint32_t phase3Arrived = 0;           ///< phase-3 arrivals, awaited once at their total
};

/// One rank's share of the work: the shards it owns and, per owned shard, how many of its units and groups
/// are non-empty before each position and group (what running flag counts reach there).
struct RingRank {
  uint32_t node = 0, localIndex = 0, rank = 0;
  uint32_t localRanks = 0;  ///< G: ranks on the node
  uint16_t partial = 0;     ///< where this rank's node partial lives: its input alone on its node, else output
  std::vector<uint32_t> owned;
  std::vector<std::vector<uint64_t>> unitsBefore;   ///< [owned][position]: non-empty units before it
  std::vector<std::vector<uint64_t>> groupsBefore;  ///< [owned][group]: non-empty groups before it
  std::vector<uint64_t> phase1Signals;  ///< [owned]: phase-1 groups the ring's first sends wait for (signalled)
};

/// Emits one channel of the ring variant: per rank, its intra-node reduce-scatter sends (phase 1, mover),
/// its reducer (phase-1 reductions interleaved with the ring's), its inter-node ring (sender), and its
/// intra-node all-gather sends (phase 3, mover); then every rank's completion waits.
class RingVariant {
 public:
  RingVariant(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part)
      : b_(b),
        ctx_(ctx),
        lanes_(b, ctx, channel),
        layout_(hierLayout(ctx)),
        shards_(ctx, layout_, channel, part),
        geo_(hierGeometry(layout_.shards, layout_.nodes, ctx.opt.chunks)),
        walk_(shards_, geo_, layout_),
        scratch_(layout_.scratchCount > 0 ? scratchBuffer(ctx) : 0),
        // Every unit is non-empty: all lanes exist and the step counts reserveSteps() reserves are known.
        full_(part.size >= uint64_t(layout_.shards) * geo_.positions) {
    const uint32_t shards = layout_.shards, nodes = layout_.nodes, maxOwned = layout_.maxOwned;
    flags_.phase1Arrived = b.newFlags(shards > 1 ? shards : 0);
    flags_.phase1Reduced = b.newFlags(shards > 1 ? maxOwned : 0);
    flags_.ringArrived = b.newFlags(nodes > 1 ? maxOwned : 0);
    flags_.gatherArrived = b.newFlags(nodes > 1 ? maxOwned : 0);
    flags_.ringReduced = b.newFlags(nodes > 1 ? maxOwned : 0);
    flags_.phase3Arrived = shards > 1 ? b.newFlag() : 0;
  }

  void emit() {
    for (uint32_t node = 0; node < layout_.nodes; ++node)
      for (uint32_t localIndex = 0; localIndex < ctx_.nodeSize(node); ++localIndex) {
        const RingRank me = planRank(node, localIndex);
        if (full_) reserveSteps(me);
        sendPhase1(me);
        runReducer(me);
        if (layout_.nodes > 1) runRing(me);
        if (me.localRanks > 1) sendPhase3(me);
      }
    waitForCompletion();
  }

 private:
  uint32_t chunks() const { return ctx_.opt.chunks; }  ///< K: phase-1/3 groups

  RingRank planRank(uint32_t node, uint32_t localIndex) const {
    RingRank me;
    me.node = node;
    me.localIndex = localIndex;
    me.rank = ctx_.nodeRanks[node][localIndex];
    me.localRanks = ctx_.nodeSize(node);
    me.partial = me.localRanks == 1 ? ctx_.input : ctx_.output;
    me.owned = shards_.ownedBy(node, localIndex);
    const auto own = me.owned.size();
    me.unitsBefore.assign(own, std::vector<uint64_t>(geo_.positions + 1, 0));
    me.groupsBefore.assign(own, std::vector<uint64_t>(chunks() + 1, 0));
    me.phase1Signals.assign(own, 0);
    for (std::size_t j = 0; j < own; ++j) {
      auto& units = me.unitsBefore[j];
      for (uint32_t q = 0; q < geo_.positions; ++q)
        units[q + 1] = units[q] + (walk_.unitAt(node, me.owned[j], q).size > 0);
      if (layout_.shards == 1) continue;
      auto& groups = me.groupsBefore[j];
      for (uint32_t t = 0; t < chunks(); ++t)
        groups[t + 1] = groups[t] + (units[geo_.groups[t].end()] > units[geo_.groups[t].begin]);
      if (me.localRanks == 1) continue;
      // Only the groups some send waits for are signalled, so that every flag is fully consumed.
      if (layout_.nodes == 1) {
        me.phase1Signals[j] = groups[chunks()];
      } else {
        for (uint32_t q = 0; q < geo_.ringChunks; ++q)
          if (units[q + 1] > units[q]) me.phase1Signals[j] = groups[geo_.groupOf[q] + 1];
      }
    }
    return me;
  }

  /// Reserve each lane's steps up front (exact when every unit is non-empty).
  void reserveSteps(const RingRank& me) {
    const uint32_t r = me.rank, shards = layout_.shards, groupCount = chunks(), ringSteps = geo_.ringSteps;
    const uint64_t own = me.owned.size(), localRanks = me.localRanks;
    uint64_t pieceSum = 0;
    for (uint32_t t = 0; t < groupCount && shards > 1; ++t) pieceSum += geo_.twoPieces[t] ? 2 : 1;
    if (localRanks > 1) {
      b_.reserveSteps(r, lanes_.mover(r), pieceSum * (shards - own + own * (localRanks - 1)) + 2ull * groupCount * own);
      b_.reserveSteps(r, lanes_.reducer(r),
                      (pieceSum + groupCount) * own * (localRanks - 1) + groupCount * own + 3ull * ringSteps * own + 1);
    } else {
      b_.reserveSteps(r, lanes_.reducer(r), 3ull * ringSteps * own + own);
    }
    if (layout_.nodes > 1) b_.reserveSteps(r, lanes_.sender(r), 4ull * ringSteps * own);
  }

  /// Phase 1, intra-node reduce-scatter (mover): every group of the input to each shard's owner, in the order
  /// every owner reduces (group, then shard), into the owner's slot "from local index me.localIndex".
  void sendPhase1(const RingRank& me) {
    const uint32_t localRanks = me.localRanks, r = me.rank;
    for (uint32_t t = 0; t < chunks() && localRanks > 1; ++t)
      for (uint32_t i = 1; i < localRanks; ++i) {
        const uint32_t peerIndex = (me.localIndex + i) % localRanks;
        const uint32_t peer = ctx_.nodeRanks[me.node][peerIndex];
        for (uint32_t s = peerIndex; s < layout_.shards; s += localRanks) {
          const Pieces ps = walk_.pieces(me.node, s, t);
          for (uint32_t k = 0; k < ps.n; ++k)
            if (ps.piece[k].size > 0)
              b_.put(r, lanes_.mover(r),
                     bufRef(peer, scratch_, shards_.phase1Slot(me.node, me.localIndex, s, ps.piece[k].begin)),
                     bufRef(r, ctx_.input, ps.piece[k].begin), ps.piece[k].size, flags_.phase1Arrived[me.localIndex]);
        }
      }
  }

  /// The reducer: the phase-1 groups of the owned shards in local-rank order, each reduced just before the
  /// first ring step that consumes it (the ring's first sends need the groups of positions 0..Kr-1), between
  /// the ring's reductions of the units each ring step brings in.
  void runReducer(const RingRank& me) {
    const uint32_t r = me.rank, node = me.node;
    const auto own = me.owned.size();
    Phase1Reductions phase1(*this, me);
    std::vector<uint64_t> ringSeen(own, 0);
    if (layout_.shards > 1) phase1.through(geo_.groupOf[geo_.ringChunks - 1]);
    for (uint32_t i = 0; i < geo_.ringSteps; ++i) {
      const uint32_t q = i + geo_.ringChunks;  // the position ring step i brings in
      if (layout_.shards > 1) phase1.through(geo_.groupOf[q]);
      for (std::size_t j = 0; j < own; ++j) {
        const uint32_t s = me.owned[j], m = shards_.ordinal(node, s);
        const Range u = walk_.unitAt(node, s, q);
        if (u.size == 0) continue;
        const uint32_t red = lanes_.reducer(r);
        b_.wait(r, red, flags_.ringArrived[m], ++ringSeen[j]);
        const BufRef received = bufRef(r, scratch_, walk_.ringSlot(node, s, u.begin));
        const BufRef dst = q >= geo_.ringSteps ? bufRef(r, ctx_.output, u.begin) : received;
        b_.reduce(r, red, dst, received, bufRef(r, me.partial, u.begin), u.size);
        b_.signal(r, red, r, flags_.ringReduced[m]);
      }
    }
  }

  /// The reducer's phase-1 groups, reduced in order up to a given group.
  class Phase1Reductions {
   public:
    Phase1Reductions(RingVariant& v, const RingRank& me)
        : v_(v), me_(me), arrived_(me.localRanks, 0), signalled_(me.owned.size(), 0) {}
    /// Reduce the groups up to `last` not reduced yet.
    void through(uint32_t last) {
      const uint32_t localRanks = me_.localRanks, r = me_.rank, node = me_.node;
      for (; next_ <= last && next_ < v_.chunks() && localRanks > 1; ++next_)
        for (std::size_t j = 0; j < me_.owned.size(); ++j) {
          const uint32_t s = me_.owned[j];
          const Pieces ps = v_.walk_.pieces(node, s, next_);
          const uint32_t nonEmpty = ps.nonEmpty();
          if (nonEmpty == 0) continue;
          const uint32_t red = v_.lanes_.reducer(r);
          for (uint32_t l = 0; l < localRanks; ++l)
            if (l != me_.localIndex) v_.b_.wait(r, red, v_.flags_.phase1Arrived[l], arrived_[l] += nonEmpty);
          for (uint32_t k = 0; k < ps.n; ++k) {
            const Range u = ps.piece[k];
            if (u.size == 0) continue;
            auto operand = [&](uint32_t l) {
              return l == me_.localIndex ? bufRef(r, v_.ctx_.input, u.begin)
                                         : bufRef(r, v_.scratch_, v_.shards_.phase1Slot(node, l, s, u.begin));
            };
            reduceChain(v_.b_, r, red, bufRef(r, v_.ctx_.output, u.begin), localRanks, operand, u.size);
          }
          if (signalled_[j] < me_.phase1Signals[j]) {
            v_.b_.signal(r, red, r, v_.flags_.phase1Reduced[v_.shards_.ordinal(node, s)]);
            ++signalled_[j];
          }
        }
    }

   private:
    RingVariant& v_;
    const RingRank& me_;
    std::vector<uint64_t> arrived_;    ///< per source local index: pieces awaited so far
    std::vector<uint64_t> signalled_;  ///< per owned shard: groups signalled so far
    uint32_t next_ = 0;                ///< the next group to reduce
  };

  /// The inter-node ring (sender), all hops cross-node: the reduce-scatter (send position i: the own partial
  /// at i < Kr, then what the reducer produced) and the all-gather (the own final units, then each arrival
  /// forwarded) to the owner of the same shard on the next node.
  void runRing(const RingRank& me) {
    const uint32_t r = me.rank, node = me.node, next = (node + 1) % layout_.nodes;
    const uint32_t kr = geo_.ringChunks, ringSteps = geo_.ringSteps;
    const auto own = me.owned.size();
    std::vector<uint64_t> phase1Waited(own, 0), reducedWaited(own, 0), gatherWaited(own, 0);
    for (uint32_t i = 0; i < ringSteps; ++i)
      for (std::size_t j = 0; j < own; ++j) {
        const uint32_t s = me.owned[j], m = shards_.ordinal(node, s);
        const Range u = walk_.unitAt(node, s, i);
        if (u.size == 0) continue;
        BufRef src = bufRef(r, scratch_, walk_.ringSlot(node, s, u.begin));
        if (i < kr) {
          src = bufRef(r, me.partial, u.begin);
          const uint64_t need = me.localRanks > 1 ? me.groupsBefore[j][geo_.groupOf[i] + 1] : 0;
          if (need > phase1Waited[j]) {
            b_.wait(r, lanes_.sender(r), flags_.phase1Reduced[m], need);
            phase1Waited[j] = need;
          }
        } else {
          b_.wait(r, lanes_.sender(r), flags_.ringReduced[m], ++reducedWaited[j]);
        }
        b_.put(r, lanes_.sender(r), bufRef(shards_.owner(next, s), scratch_, walk_.ringSlot(next, s, u.begin)), src,
               u.size, flags_.ringArrived[shards_.ordinal(next, s)]);
      }
    for (uint32_t i = 0; i < ringSteps; ++i)
      for (std::size_t j = 0; j < own; ++j) {
        const uint32_t s = me.owned[j], m = shards_.ordinal(node, s);
        const Range u = walk_.unitAt(node, s, i < kr ? ringSteps + i : i - kr);
        if (u.size == 0) continue;
        if (i < kr)
          b_.wait(r, lanes_.sender(r), flags_.ringReduced[m], ++reducedWaited[j]);
        else
          b_.wait(r, lanes_.sender(r), flags_.gatherArrived[m], ++gatherWaited[j]);
        b_.put(r, lanes_.sender(r), bufRef(shards_.owner(next, s), ctx_.output, u.begin),
               bufRef(r, ctx_.output, u.begin), u.size, flags_.gatherArrived[shards_.ordinal(next, s)]);
      }
  }

  /// Phase 3, intra-node all-gather (mover): each group of the owned shards to the node's other ranks once it
  /// is final (all-gather arrivals for positions < L, the own final reductions for the rest; with one node,
  /// phase 1's result).
  void sendPhase3(const RingRank& me) {
    const uint32_t r = me.rank, node = me.node, localRanks = me.localRanks;
    const uint32_t kr = geo_.ringChunks, ringSteps = geo_.ringSteps;
    const auto own = me.owned.size();
    std::vector<uint64_t> gatherSeen(own, 0), reducedSeen(own, 0), phase1Seen(own, 0);
    auto waitFor = [&](uint32_t flag, uint64_t need, uint64_t& seen) {
      if (need <= seen) return;
      b_.wait(r, lanes_.mover(r), flag, need);
      seen = need;
    };
    for (uint32_t t = 0; t < chunks(); ++t)
      for (std::size_t j = 0; j < own; ++j) {
        const uint32_t s = me.owned[j], m = shards_.ordinal(node, s);
        const Pieces ps = walk_.pieces(node, s, t);
        if (ps.nonEmpty() == 0) continue;
        const auto first = static_cast<uint32_t>(geo_.groups[t].begin);
        const auto end = static_cast<uint32_t>(geo_.groups[t].end());
        const auto& units = me.unitsBefore[j];
        if (layout_.nodes == 1) {
          waitFor(flags_.phase1Reduced[m], me.groupsBefore[j][t + 1], phase1Seen[j]);
        } else {
          if (first < ringSteps) waitFor(flags_.gatherArrived[m], units[std::min(end, ringSteps)], gatherSeen[j]);
          if (end > ringSteps) waitFor(flags_.ringReduced[m], units[end] - units[kr], reducedSeen[j]);
        }
        for (uint32_t i = 1; i < localRanks; ++i) {
          const uint32_t peer = ctx_.nodeRanks[node][(me.localIndex + i) % localRanks];
          for (uint32_t k = 0; k < ps.n; ++k)
            if (ps.piece[k].size > 0)
              b_.put(r, lanes_.mover(r), bufRef(peer, ctx_.output, ps.piece[k].begin),
                     bufRef(r, ctx_.output, ps.piece[k].begin), ps.piece[k].size, flags_.phase3Arrived);
        }
      }
  }

  /// Completion: a rank ends holding every shard. Non-owned shards arrive in phase 3; with one rank per node
  /// the last all-gather arrivals are not forwarded, so the reducer waits for them.
  void waitForCompletion() {
    for (uint32_t r = 0; r < ctx_.nRanks; ++r) {
      if (layout_.shards > 1) waitForAll(b_, lanes_, r, flags_.phase3Arrived);
      if (layout_.nodes > 1 && ctx_.nodeSize(ctx_.nodeOf[r]) == 1)
        for (uint32_t m = 0; m < layout_.maxOwned; ++m) waitForAll(b_, lanes_, r, flags_.gatherArrived[m]);
    }
  }

  ScheduleBuilder& b_;
  const GenContext& ctx_;
  ChannelLanes lanes_;
  const HierLayout layout_;
  const HierShards shards_;
  const HierGeometry geo_;
  const RingWalk walk_;
  const uint16_t scratch_;
  const bool full_;
  RingFlags flags_;
};

}  // namespace

void emitHierarchical(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  if (ctx.nRanks == 1) return emitLocalCopy(b, ctx, channel, part);
  if (useRhd(ctx)) return emitHierarchicalRhd(b, ctx, channel, part);
  if (useBruck(ctx)) return emitHierarchicalBruck(b, ctx, channel, part);
  RingVariant(b, ctx, channel, part).emit();
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
  const PathCounts zero, land = netLands();  // a ring send lands on its successor this long after its lane time
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
    for (; s.next <= last && s.next < K; ++s.next)
      s.q[s.next] = s.red = longest(s.red, s.a[s.next]) + nodes[n].perOwner * reduce[s.next];
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
      if (i >= Kr) ready = i < L + Kr ? s.rho[i - Kr] + flagHop() : st[pred(n)].x[i - Kr] + land;
      s.x[i] = s.snd = longest(s.snd, ready) + nodes[n].owned * netMsg();
    }
    if (i >= L) continue;
    for (uint32_t n = 0; n < N; ++n) {
      State& s = st[n];
      if (nodes[n].phases) phase1Through(n, geo.groupOf[i + Kr]);
      s.rho[i] = s.red = longest(s.red, st[pred(n)].x[i] + land) + nodes[n].owned * redMsg();
    }
  }
  PathCounts total = zero;
  for (uint32_t n = 0; n < N; ++n) {
    const State& s = st[n];
    PathCounts end = s.red;
    if (L > 0) end = longest({end, s.x[2 * L - 1], st[pred(n)].x[2 * L - 1] + land});
    if (nodes[n].phases) {
      PathCounts mover = s.a[K - 1];
      for (uint32_t t = 0; t < K; ++t) {
        const auto q0 = static_cast<uint32_t>(geo.groups[t].begin), q1 = static_cast<uint32_t>(geo.groups[t].end());
        PathCounts available = zero;
        if (L == 0) available = s.q[t] + flagHop();
        if (L > 0 && q0 < L) available = longest(available, st[pred(n)].x[L + std::min(q1, L) - 1] + land);
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
  if (c.opt.inter == InterPhase::Auto) {  // the cheaper variant under this profile
    GenOptions resolved = c.opt;
    resolved.inter = resolveInter(c.spec, c.gen.nodeOf, c.opt, c.profile);
    const GenContext gen = makeContext(c.spec, c.gen.nodeOf, resolved);
    return costHierarchical(CostContext{c.spec, resolved, c.topo, gen, c.profile});
  }
  const ClosedFormShape s = shapeOf(c);
  if (s.p == 1) return costLocalCopy(c, s);
  const uint32_t S = s.gMax, M = s.nodes;
  if (useBruck(c.gen)) return costHierarchicalBruck(c, s);
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
                        std::to_string(plan.pow2) + " nodes exchange in " + std::to_string(plan.steps) + " steps" +
                        (plan.extra ? ", " + std::to_string(plan.extra) + " fold in and out" : "") +
                        ", S1 = (G-1)*t_nv(chunk), unit = chunk n/(C*G*K)");
  }
  const HierGeometry geo = hierGeometry(S, M, c.opt.chunks);
  const Range unit0 = splitRange(splitRange(splitRange(s.part0, S, 0), M, 0), geo.ringChunks, 0);
  const UnitPrices u = unitPrices(c, unit0.size, M > 1);
  if (S == 1) {  // one rank per node: exactly the ring over the M nodes
    const Range block0 = splitRange(splitRange(s.part0, S, 0), M, 0);
    return estimate(u, ringLongest(u, c.gen, chunkCount(block0.size, c.opt.chunks)),
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
  return {CollOp::AllReduce,
          "hierarchical",
          "NVLink reduce-scatter in each node, ring all-reduce of each shard across nodes, NVLink all-gather",
          setupHierarchical,
          emitHierarchical,
          costHierarchical};
}

}  // namespace mk::detail
