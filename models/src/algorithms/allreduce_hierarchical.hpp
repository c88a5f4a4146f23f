// mkernel — internal: what the two variants of the hierarchical all-reduce share (the inter-node phase as a
// ring in allreduce_hierarchical.cpp, as recursive halving/doubling in allreduce_hierarchical_rhd.cpp): the
// scratch layout, the choice of variant, and the per-node loads their closed forms read.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <vector>

#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {

/// Scratch layout of the hierarchical all-reduce (see allreduce_hierarchical.cpp).
struct HierLayout {
  uint32_t shards = 0;    ///< S
  uint32_t nodes = 0;     ///< M
  uint32_t maxOwned = 0;  ///< shards owned by a rank of the smallest node: ceil(S / smallest node)
  uint64_t slot = 0;      ///< elements of one slot (all channels)
  uint64_t ringBase = 0;  ///< scratch offset of the ring-receive slot
  uint64_t scratchCount = 0;
};

/// Elements of one slot used by channels before `channel`.
uint64_t hierChannelBase(const GenContext& ctx, uint32_t maxOwned, uint32_t channel);

/// The inter-node phase is recursive halving/doubling (generate() resolved "auto" before any emitter runs).
bool useRhd(const GenContext& ctx);
/// The inter-node phase is a dissemination reduce-scatter + all-gather, bruck or bruck-half (and there are several
/// nodes).
bool useBruck(const GenContext& ctx);

/// The rounds of the dissemination inter-node phases (bruck, bruck-half) over M nodes. All-gather round k (k
/// ascending) pairs node n with n + distance(k) and moves blocks(k) blocks: before it a node holds its relative
/// blocks [0, held[k]), after it [0, held[k + 1]); the distance is what the node holds (the blocks it receives
/// start where its own end), and blocks(k) <= held[k] (it sends only what it holds). The reduce-scatter runs the
/// rounds backwards. Any such sequence from held[0] = 1 to held[J] = M moves M - 1 blocks per pass.
///  * bruck: held[k] = 2^k, so round k moves min(2^k, M - 2^k) blocks;
///  * bruck-half: held[k] = ceil(M / 2^(J-k)), so every reduce-scatter round moves half (rounded down) of the
///    blocks still live, the first floor(M / 2), as recursive halving does on a power of two (where the two
///    plans are the same, and at M = 3).
struct BruckPlan {
  uint32_t nodes = 0;          ///< M
  uint32_t rounds = 0;         ///< J = ceil(log2 M)
  std::vector<uint32_t> held;  ///< J + 1 entries: relative blocks held before all-gather round k; held[J] = M
  uint32_t distance(uint32_t k) const { return held[k]; }
  uint32_t blocks(uint32_t k) const { return held[k + 1] - held[k]; }
  /// Messages of an all-gather round on every node: two for a range of two or more blocks (agPieces).
  uint32_t agMessages(uint32_t k) const { return blocks(k) >= 2 ? 2 : 1; }
  /// The two largest rounds swap places where they are independent (bruck only: bruck-half's round J-1 always
  /// moves at least as many blocks as round J-2): round J-1 moves M - 2^(J-1) blocks, round J-2 2^(J-2); where
  /// the first are fewer (M below 1.5 x 2^(J-1)) round J-1's reduction does not reach what round J-2 sends, so
  /// the reduce-scatter can start with the larger one (and the all-gather end with it), and the pipeline's fill
  /// and drain (phases 1 and 3 around the first and last round) stay about half a chunk.
  bool swapped() const { return rounds >= 2 && blocks(rounds - 1) < distance(rounds - 2); }
  /// Where they swap, the small round J-1 (r = M - 2^(J-1) blocks) runs as late as it may: its reduction writes
  /// relative blocks [0, r), which only rounds k with 2^k < r send, so it goes just before the first of those
  /// (reduce-scatter position J - 1 - ceil(log2 r), at least 1, and before round 0, whose reduction writes the
  /// output), between large rounds instead of at the pipeline's start; the all-gather runs the reverse order
  /// (round J-1 once [0, r) is held).
  uint32_t smallAt() const;
  /// Reduce-scatter round rho (in emission order): J - 1 - rho, but for the swap (round J-2 first, J-1 at
  /// smallAt(), the others descending).
  uint32_t rsRound(uint32_t rho) const {
    if (!swapped()) return rounds - 1 - rho;
    const uint32_t p = smallAt();
    return rho < p ? rounds - 2 - rho : rho == p ? rounds - 1 : rounds - 1 - rho;
  }
  /// All-gather round q (in emission order): the reduce-scatter's order reversed.
  uint32_t agRound(uint32_t q) const { return rsRound(rounds - 1 - q); }
  /// The round the reduce-scatter starts with and the all-gather ends with.
  uint32_t firstRound() const { return rsRound(0); }
};

/// The plan of `nodes` nodes for `inter` (Bruck or BruckHalf; allreduce_hierarchical_bruck.cpp).
BruckPlan bruckPlan(uint32_t nodes, InterPhase inter);

/// Elements of one owned shard's Bruck region on `channel`: per chunk its rotated copy and the reduce-scatter
/// receive regions (allreduce_hierarchical_bruck.cpp).
uint64_t bruckStride(const GenContext& ctx, uint32_t channel);
/// Emit one channel of the bruck variant (allreduce_hierarchical_bruck.cpp).
void emitHierarchicalBruck(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part);
/// The bruck variant's closed form (allreduce_hierarchical_bruck_cost.cpp).
CostEstimate costHierarchicalBruck(const CostContext& c, const ClosedFormShape& s);

/// Recursive halving/doubling over the M nodes of a rail: the first M2 (largest power of two <= M) take part;
/// extra node M2 + i folds into host node i before and receives the result after.
struct RhdPlan {
  uint32_t pow2 = 1;   ///< M2
  uint32_t extra = 0;  ///< E = M - M2
  uint32_t steps = 0;  ///< J = log2(M2): exchanges per pass
  /// Partner distance of reduce-scatter step j (all-gather walks the same distances backwards).
  uint32_t distance(uint32_t j) const { return pow2 >> (j + 1); }
};

/// The order in which one lane of the rhd variant runs `stages` stages of each of `chunks` chunks: wavefront
/// by wavefront (d = chunk + stage), older chunks first within one, so that while a chunk waits for its
/// partner's half (latency, reduction) the lane works on the next chunks instead of idling. Every stage sees
/// the chunks in order, so per-flag running counts stay exact. Calls visit(chunk, stage).
void rhdWavefront(uint32_t chunks, uint32_t stages, const std::function<void(uint32_t, uint32_t)>& visit);

/// The RHD plan of `nodes` nodes.
RhdPlan rhdPlan(uint32_t nodes);

/// Elements of one owned shard's RHD receive region on `channel`: the fold slot (one shard, only with extra
/// nodes) and, per chunk and step j, room for the half received at step j (at most ceil(chunk / 2^(j+1))).
uint64_t rhdStride(const GenContext& ctx, uint32_t channel);

/// The scratch layout of `ctx`'s schedule.
HierLayout hierLayout(const GenContext& ctx);

/// The shards of one channel's part and who owns them, as both variants lay them out: shard s (of S =
/// maxLocal) is owned on node n by its rank of local index s % size(n), as that rank's ordinal-th shard
/// (ordinal s / size(n)); in the owner's phase-1 slots (one per source local index) the shard sits at the
/// same offset, channel after channel, one shard-sized region per ordinal.
class HierShards {
 public:
  HierShards(const GenContext& ctx, const HierLayout& layout, uint32_t channel, Range part);
  /// S.
  uint32_t count() const noexcept { return layout_.shards; }
  /// Element range of shard `shard` in [0, count).
  Range range(uint32_t shard) const { return splitRange(part_, layout_.shards, shard); }
  /// The rank of `node` that owns `shard`.
  uint32_t owner(uint32_t node, uint32_t shard) const { return ctx_.nodeRanks[node][shard % ctx_.nodeSize(node)]; }
  /// Which of its owner's shards `shard` is on `node`.
  uint32_t ordinal(uint32_t node, uint32_t shard) const { return shard / ctx_.nodeSize(node); }
  /// The shards the rank of local index `localIndex` on `node` owns, ascending.
  std::vector<uint32_t> ownedBy(uint32_t node, uint32_t localIndex) const;
  /// Offset of element `element` of `shard` inside one slot of its owner on `node`.
  uint64_t inSlot(uint32_t node, uint32_t shard, uint64_t element) const {
    return channelBase_ + uint64_t(ordinal(node, shard)) * stride_ + (element - range(shard).begin);
  }
  /// Scratch offset of `element` of `shard` in its owner's phase-1 slot for the rank of local index
  /// `sourceLocal`.
  uint64_t phase1Slot(uint32_t node, uint32_t sourceLocal, uint32_t shard, uint64_t element) const {
    return uint64_t(sourceLocal) * layout_.slot + inSlot(node, shard, element);
  }
  /// Elements of the largest shard (shard 0): the stride between an owner's shard regions.
  uint64_t stride() const noexcept { return stride_; }

 private:
  const GenContext& ctx_;
  const HierLayout& layout_;
  Range part_;
  uint64_t channelBase_ = 0;
  uint64_t stride_ = 0;
};

/// Phase 1 of the chunked variants (rhd, bruck) on the mover of the rank of local index `localIndex` on `node`:
/// chunk t of the input to each shard's owner (chunk, then shard), one piece per chunk, into the owner's
/// phase-1 slot for this rank; flag phase1Arrived[localIndex] on arrival.
void emitChunkedPhase1(ScheduleBuilder& b, const GenContext& ctx, ChannelLanes& lanes, const HierShards& shards,
                       uint32_t node, uint32_t localIndex, const std::vector<uint32_t>& phase1Arrived);

/// The reducer's phase-1 reduction of `chunk` of the owned `shard` in the chunked variants: wait for the piece
/// of every other local rank (`seen`: per local index, pieces awaited so far), then output = the reduction of
/// all local contributions.
void emitChunkedPhase1Reduce(ScheduleBuilder& b, const GenContext& ctx, ChannelLanes& lanes, const HierShards& shards,
                             uint32_t node, uint32_t localIndex, uint32_t shard, Range chunk,
                             const std::vector<uint32_t>& phase1Arrived, std::vector<uint64_t>& seen);

/// Emit one channel of the rhd variant (allreduce_hierarchical_rhd.cpp).
void emitHierarchicalRhd(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part);

/// What the busiest rank of one node does per phase-1/3 round and ring position (see hierLongest).
struct HierNodeLoad {
  double p1Puts = 0;    ///< messages per phase-1 round and piece (shards owned by the node's other ranks)
  double perOwner = 0;  ///< phase-1 reductions and phase-3 messages per round and piece (owned shards x (G-1))
  double owned = 0;     ///< units per ring position (owned shards)
  bool phases = false;  ///< the node has several ranks (phases 1 and 3 exist)
};

/// The busiest rank's loads of each of the first `nodes` nodes: a rank owns ceil(S/size) shards and sends the
/// rest in phase 1.
std::vector<HierNodeLoad> hierNodeLoads(const CostContext& c, uint32_t nodes);

/// The rhd variant's longest path (allreduce_hierarchical_rhd.cpp).
PathCounts rhdLongest(const UnitPrices& u, uint32_t K, uint64_t chunkMax, const std::vector<HierNodeLoad>& nodes);

}  // namespace mk::detail
