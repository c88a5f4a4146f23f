// mkernel — internal: what the fused operators' generators share (fused_gemm_rs.cpp, fused_ag_gemm.cpp,
// fused_gemm_ar.cpp): the placement and tiling of one request, the lanes of a rank and their CTA split, and the
// vocabulary of their closed forms (docs/fused-operators.md).
//
// Conventions of the family:
//  * Tiles are blocks of whole rows of C: a Gemm step of `rows x width` and, where it moves, one contiguous
//    message per peer (row-major rows of a block are contiguous, so a tile never needs a strided transfer).
//    Each shard (the rows one rank owns or holds) is cut into tiles of tileRows rows, the last one shorter.
//  * Distances: rank r's peer at distance d is (r + d) % p for what it sends, (r - d) % p for what it
//    receives; every flag that counts arrivals is indexed by that distance, so a flag is fed by one lane of one
//    rank in program order and a threshold t + 1 means "tiles 0..t of that sender have landed".
//  * Peers are visited in ring order (distance 1, 2, ...), except that the peers on other nodes take those
//    places rail first: node n + 1's rank of the same local index, then the next local indices, then node
//    n + 2, ... So at every step the senders of a node reach different ranks of different nodes: no NIC or
//    NVLink port receives two flows at once (ring order alone sends every rank of node 0 to node 1's first rank
//    together). Receivers take what they wait for in the order it arrives (arrivalOrder).
//  * The compute lane walks (distance, tile) items in the option's order (TileOrder): shard by shard (own-first
//    or own-last, peers in visiting order) or round by round (interleaved: tile t of its own shard, then of
//    every peer's in visiting order); send lanes walk the same items, each taking those of its link.
//  * Lanes of a rank (created in this order when they have work): compute; send over NVLink; send over the
//    network; reduce. Network lanes get one CTA each (the host proxy moves their bytes); the other communication
//    lanes share the rest of the split by the number of shards they handle, at least one each. gemm-ar's
//    all-gather puts ride on the send lanes, one round behind the partials (sendItems): two lanes on one link
//    would each get half of it for the whole op (timeline rule 2).
#pragma once

#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <utility>
#include <vector>

#include "builder.hpp"
#include "common.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/cost/step_cost.hpp"

namespace mk::detail {

/// One tile: rows [row, row + rows) of the whole C (global row index).
struct FusedTile {
  uint64_t row = 0;
  uint32_t rows = 0;
};

/// What a lane of a fused schedule is for (the order lanes are created in).
enum class FusedLane : uint8_t { Compute, SendNvlink, SendNetwork, Reduce };

/// One lane of a rank's plan and its CTAs.
struct FusedLanePlan {
  FusedLane purpose = FusedLane::Compute;
  uint32_t ctas = 1;
  uint32_t index = 0;  ///< which compute lane (0 .. computeLanes - 1); 0 for the others
};

/// Placement, shards, tiles and lanes of one request, derived once; shared by emit and the closed form.
struct FusedContext {
  FusedSpec spec;
  FusedOptions opt;
  GenContext gen;                                 ///< placement (nodes, local indices)
  uint32_t p = 0;                                 ///< ranks
  std::vector<FusedShard> shards;                 ///< fusedShards(spec, p)
  std::vector<std::vector<FusedTile>> tiles;      ///< per shard rank: its tiles, top to bottom
  std::vector<std::vector<FusedLanePlan>> lanes;  ///< per rank: its lanes in creation order, with CTAs
  std::vector<std::vector<uint32_t>> visits;      ///< per rank: distances 1..p-1 in the order it visits its peers
  std::vector<std::vector<uint32_t>> arrivals;    ///< per rank: distances 1..p-1 by when their sender visits it

  /// Rank at distance d after r (what r sends to) and before r (what r receives from).
  uint32_t ahead(uint32_t r, uint32_t d) const noexcept { return (r + d) % p; }
  uint32_t behind(uint32_t r, uint32_t d) const noexcept { return (r + p - d) % p; }
  bool sameNode(uint32_t a, uint32_t b) const noexcept { return gen.sameNode(a, b); }
  /// The (distance, tile index) items in the option's order, `tilesAt[d]` tiles at distance d (0: none), the
  /// peers' distances taken in the order `peers` lists them (visits[r] or arrivals[r]).
  std::vector<std::pair<uint32_t, uint32_t>> walk(const std::vector<std::size_t>& tilesAt,
                                                  const std::vector<uint32_t>& peers) const;
  /// Tile counts by distance of the shards rank r computes on: ahead (gemm-rs, gemm-ar: owners) or behind
  /// (ag-gemm: holders).
  std::vector<std::size_t> tilesByDistance(uint32_t r, bool ahead) const;
  /// The columns of B and C of rank r's Gemm steps, its depth k, and the leading dimension of its B.
  uint64_t gemmCols(uint32_t r) const noexcept;
  uint64_t gemmDepth(uint32_t r) const noexcept;
  uint32_t ldb(uint32_t r) const noexcept;
  /// The CTAs of rank r's lane for `purpose` (compute: compute lane `index`; 0 when it has none).
  uint32_t ctasOf(uint32_t r, FusedLane purpose, uint32_t index = 0) const noexcept;
  /// Lane::ctas summed over rank r's lanes.
  uint32_t rankCtas(uint32_t r) const noexcept;
  /// Lanes of `purpose` class on rank r using `resource` (the share of timeline rule 2).
  uint32_t shareOf(uint32_t r, StepResource resource) const noexcept;
};

/// Placement facts of `nodeOf` in the collectives' form (node ids, local indices, node sizes).
GenContext placementOf(const std::vector<uint32_t>& nodeOf);
/// The most communication lanes any rank of the placement has for `op` (0 on one rank).
uint32_t mostCommLanes(FusedOp op, const GenContext& placement);

/// Check `opt` (every field concrete), tile the shards, and plan every rank's lanes and their split. Throws
/// Error(InvalidArgument) naming the field for an open or impossible option.
FusedContext makeFusedContext(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt);

/// "send over NVLink", "reduce", ...: how messages name a lane.
const char* describe(FusedLane purpose) noexcept;

// ---- emitting -----------------------------------------------------------------------------------------------

/// Creates each rank's lanes in plan order (so lane index = plan index) and hands out their indices.
class FusedLanes {
 public:
  FusedLanes(ScheduleBuilder& b, const FusedContext& ctx);
  /// Lane index of `purpose` on rank r (compute: compute lane `index`); Error(Internal) when the plan has none.
  uint32_t operator()(uint32_t r, FusedLane purpose, uint32_t index = 0) const;
  /// The lane that sends from r to `peer`: SendNvlink inside a node, SendNetwork across nodes.
  uint32_t to(uint32_t r, uint32_t peer) const;

 private:
  const FusedContext& ctx_;
  std::vector<std::vector<std::pair<FusedLanePlan, uint32_t>>> index_;  ///< per rank: (plan entry, lane index)
};

/// Set every lane's Lane::ctas from the context's plan (after the builder finished the schedule).
void applyLaneCtas(Schedule& s, const FusedContext& ctx);

/// The Gemm shape of a tile of `rows` rows on rank r.
GemmShape tileShape(const FusedContext& ctx, uint32_t r, uint32_t rows);
/// kStepBColMajor when B is column-major.
uint8_t gemmFlags(const FusedContext& ctx) noexcept;

// ---- closed forms: the pipeline's recurrence, item by item ---------------------------------------------------

/// A lane serving items in order: an item starts when it is ready (its Waits pass) and the previous one ended,
/// and ends its price later (timeline rules 1 and 3: end(k) = max(end(k-1), ready(k)) + price(k)).
class ServingLane {
 public:
  explicit ServingLane(double startUs) : free_(startUs) {}
  /// Serve one item; returns when it ends.
  double serve(double readyUs, double priceUs) {
    free_ = std::max(free_, readyUs) + priceUs;
    busy_ += priceUs;
    return free_;
  }
  double freeUs() const noexcept { return free_; }
  double busyUs() const noexcept { return busy_; }

 private:
  double free_;
  double busy_ = 0;
};

/// Per (distance, tile) times of one rank, indexed [d][t].
using TileTimes = std::vector<std::vector<double>>;
/// Room for the tiles at every distance.
TileTimes tileTimes(const std::vector<std::size_t>& tilesAt);

/// Prices of one rank's steps under the timeline's rules (StepCosts' helpers: rules 2, 2b and 3).
struct FusedPrices {
  const FusedContext& ctx;
  const Profile& profile;
  /// Lane time of a Gemm step of a tile of `rows` rows on rank r's compute lane `lane`.
  double gemmUs(uint32_t r, uint32_t lane, uint32_t rows) const;
  /// Lane time of a Put (or ProxyPut across nodes) of `elems` elements from r to `peer` on lane `purpose`;
  /// `intoUser`: it lands in the peer's user buffer.
  double putUs(uint32_t r, uint32_t peer, FusedLane purpose, uint64_t elems, bool intoUser) const;
  /// When a put of `elems` elements on lane `purpose` is visible after its step ends (Put: the rest of its
  /// alpha; ProxyPut: its landing, proxyLandsAfterUs).
  double putVisibleUs(uint32_t r, uint32_t peer, FusedLane purpose, uint64_t elems, bool intoUser) const;
  /// A Put's or ProxyPut's issue and bytes (a ProxyPut's lane time before the in-flight rule, proxyLaneUs).
  double putBusyUs(uint32_t r, uint32_t peer, FusedLane purpose, uint64_t elems, bool intoUser) const;
  /// Lane time of a local Reduce of `elems` elements on r's reduce lane.
  double reduceUs(uint32_t r, uint64_t elems) const;
};

/// Busy times and ends the closed forms collect, turned into a FusedEstimate by finish().
struct FusedTally {
  double endUs = 0;  ///< latest end of any lane
  double tensorUs = 0, nvlinkUs = 0, networkUs = 0, memoryUs = 0;
  void lane(FusedLane purpose, const ServingLane& l, bool network);
  /// The estimate: t0 + the pipeline, plus `extraUs` once at the end (peerUserUs).
  FusedEstimate finish(const FusedContext& ctx, const Profile& profile, double extraUs) const;
};

// ---- the family -------------------------------------------------------------------------------------------------

/// One fused operator: how to emit it, its closed form, and which communication lanes a rank needs.
struct FusedDef {
  FusedOp op;
  const char* summary;
  void (*emit)(ScheduleBuilder& b, const FusedContext& ctx);
  FusedEstimate (*cost)(const FusedContext& ctx, const Profile& profile);
  /// Communication lanes of a rank with `nvlinkPeers` same-node and `networkPeers` other-node peers, in creation
  /// order, each with its weight in the split (ignored for network lanes, which get one CTA).
  std::vector<std::pair<FusedLane, uint32_t>> (*commLanes)(uint32_t nvlinkPeers, uint32_t networkPeers);
  bool peersTouchUser;  ///< its puts land in peers' user buffers (the op pays peerUserUs)
};

const FusedDef& fusedDef(FusedOp op);
FusedDef fusedGemmReduceScatter();
FusedDef fusedAllGatherGemm();
FusedDef fusedGemmAllReduce();

/// The send lanes of a rank with `nvlinkPeers` and `networkPeers`: one per link that has peers, weighted by
/// `perPeer` x its peers (the shards it moves).
std::vector<std::pair<FusedLane, uint32_t>> sendLanes(uint32_t nvlinkPeers, uint32_t networkPeers, uint32_t perPeer);

/// gemm-rs and gemm-ar share the reduce-scatter (fused_gemm_rs.cpp); gemm-ar adds the all-gather of each finished
/// tile (fused_gemm_ar.cpp), on the same send lanes.
/// One item of a send lane: the partial of tile t of the shard at distance d, or (gather) rank r's own finished
/// tile t to every peer of the lane's link.
struct SendItem {
  uint32_t d = 0, t = 0;
  bool gather = false;
};
/// Rank r's send lane over NVLink (`near`) or the network: the partials in the compute walk's order and, with
/// `allReduce`, the gather of own tile t before the first partial of round t + 2 (interleaved order) or after the
/// last partial (shard by shard: no tile is finished before the last shard's partials arrive).
std::vector<SendItem> sendItems(const FusedContext& ctx, uint32_t r, bool near, bool allReduce);
/// Peers of r in visiting order over NVLink (`near`) or the network.
std::vector<uint32_t> peersByLink(const FusedContext& ctx, uint32_t r, bool near);

/// gemm-ar's all-gather (fused_gemm_ar.cpp).
struct GatherPart {
  uint16_t c = 0;                  ///< the "c" buffer (all of C on every rank)
  uint32_t reduced = 0;            ///< own flag: the reduce lane signals each finished tile
  std::vector<uint32_t> gathered;  ///< [d - 1]: finished tiles from the owner at distance d behind
};
GatherPart declareGather(ScheduleBuilder& b, const FusedContext& ctx, uint16_t c);
/// Rank r's finished tile t put into the same rows of the "c" of every peer over `near` links, on `lane`.
void emitGatherTile(ScheduleBuilder& b, const FusedContext& ctx, const GatherPart& g, uint32_t r, uint32_t lane,
                    bool near, uint32_t t);
/// Last on every rank's reduce lane: wait for every owner's finished tiles.
void emitGatherWaits(ScheduleBuilder& b, const FusedContext& ctx, const FusedLanes& lanes, const GatherPart& g);
/// Serve the gather of rank r's tile t, ready at `readyUs`, on `lane`; returns when its last copy is visible.
double serveGatherTile(ServingLane& lane, const FusedContext& ctx, const FusedPrices& px, uint32_t r, bool near,
                       uint32_t t, double readyUs);

/// Emit the reduce-scatter and, with `allReduce`, the all-gather (then "c" holds all m rows on every rank).
void emitReduceScatter(ScheduleBuilder& b, const FusedContext& ctx, bool allReduce);
/// Its closed form: the lanes evaluated item by item as their inputs become known.
FusedEstimate costReduceScatter(const FusedContext& ctx, const Profile& profile, bool allReduce);
/// The communication lanes of gemm-rs (`allReduce` false) and gemm-ar (see FusedDef::commLanes).
std::vector<std::pair<FusedLane, uint32_t>> reduceScatterLanes(uint32_t nvlinkPeers, uint32_t networkPeers,
                                                               bool allReduce);

}  // namespace mk::detail
