// gemm-rs: C = A B with k split over the ranks (row-parallel linear), reduce-scattered over m. Every rank computes
// its partial of every tile; a tile owned by a peer goes to that peer's "recv" slot as soon as it is computed
// (Put with signal over NVLink, ProxyPut across nodes), and each owner reduces its tiles as the partials arrive.
// Also the first half of gemm-ar (fused_gemm_ar.cpp adds the all-gather). Formulas: docs/fused-operators.md.
#include <cmath>
#include <limits>

#include "fused_common.hpp"
#include "mk/error.hpp"

namespace mk::detail {

namespace {

/// Rank r's own tiles: where tile `t` sits in its "c" (gemm-rs: its own rows; gemm-ar: the whole C).
uint64_t ownOffset(const FusedContext& ctx, uint32_t r, const FusedTile& t, bool allReduce) {
  return (allReduce ? t.row : t.row - ctx.shards[r].rowBegin) * ctx.spec.n;
}

/// Where the partial of rank r's tile `t` from its peer at distance d (1..p-1) lands in r's "recv".
uint64_t recvOffset(const FusedContext& ctx, uint32_t r, uint32_t d, const FusedTile& t) {
  const FusedShard& sh = ctx.shards[r];
  return (uint64_t{d} - 1) * sh.rows * ctx.spec.n + (t.row - sh.rowBegin) * ctx.spec.n;
}

/// One reduction of owner r: tile t plus the partial from distance d; d = 0 adds the peers' sum to the own tile
/// (own-last).
struct Reduction {
  uint32_t d = 0, t = 0;
  bool waitOwn = false;   ///< the own partial (in "c") must be computed first
  uint32_t alsoWait = 0;  ///< a second peer's partial it needs (own-last's first sum), 0 = none
  bool finishes = false;  ///< the tile is complete after it (gemm-ar signals it)
};

/// The reductions of owner r's tiles in the order the partials arrive (arrivals[r]): c = own, then c += each
/// peer's partial (own-first shard by shard, interleaved round by round); own-last sums the peers' partials in
/// the first arriving peer's slot and adds the own tile last.
std::vector<Reduction> reductions(const FusedContext& ctx, uint32_t r) {
  std::vector<Reduction> out;
  const auto n = static_cast<uint32_t>(ctx.tiles[r].size());
  const std::vector<uint32_t>& peers = ctx.arrivals[r];
  const uint32_t first = peers.front(), last = peers.back();
  auto add = [&](uint32_t d, uint32_t t) { out.push_back(Reduction{d, t, d == first, 0, d == last}); };
  if (ctx.opt.order == TileOrder::Interleaved) {
    for (uint32_t t = 0; t < n; ++t)
      for (uint32_t d : peers) add(d, t);
  } else if (ctx.opt.order == TileOrder::OwnFirst) {
    for (uint32_t d : peers)
      for (uint32_t t = 0; t < n; ++t) add(d, t);
  } else {
    for (std::size_t i = 1; i < peers.size(); ++i)
      for (uint32_t t = 0; t < n; ++t) out.push_back(Reduction{peers[i], t, false, i == 1 ? first : 0, false});
    for (uint32_t t = 0; t < n; ++t) out.push_back(Reduction{0, t, true, peers.size() == 1 ? first : 0, true});
  }
  return out;
}

}  // namespace

std::vector<std::pair<FusedLane, uint32_t>> reduceScatterLanes(uint32_t nvlinkPeers, uint32_t networkPeers,
                                                               bool allReduce) {
  // The send lanes move a shard per peer (and gemm-ar a second one: the finished tiles); the reduce lane
  // reduces one per peer.
  auto lanes = sendLanes(nvlinkPeers, networkPeers, allReduce ? 2 : 1);
  lanes.emplace_back(FusedLane::Reduce, nvlinkPeers + networkPeers);
  return lanes;
}

std::vector<SendItem> sendItems(const FusedContext& ctx, uint32_t r, bool near, bool allReduce) {
  std::vector<SendItem> items;
  uint32_t gathered = 0;
  const auto ownTiles = static_cast<uint32_t>(ctx.tiles[r].size());
  for (const auto& [d, t] : ctx.walk(ctx.tilesByDistance(r, true), ctx.visits[r])) {
    if (d == 0 || ctx.sameNode(r, ctx.ahead(r, d)) != near) continue;
    // One round behind: tile t - 2 was reduced while round t - 1's partials were sent.
    if (allReduce && ctx.opt.order == TileOrder::Interleaved)
      for (; gathered + 2 <= t && gathered < ownTiles; ++gathered) items.push_back(SendItem{0, gathered, true});
    items.push_back(SendItem{d, t, false});
  }
  if (allReduce && !items.empty())
    for (; gathered < ownTiles; ++gathered) items.push_back(SendItem{0, gathered, true});
  return items;
}

void emitReduceScatter(ScheduleBuilder& b, const FusedContext& ctx, bool allReduce) {
  const uint32_t p = ctx.p;
  const FusedSpec& sp = ctx.spec;
  const uint64_t n = sp.n;
  std::vector<uint64_t> aCount(p), bCount(p), cCount(p), recvCount(p);
  for (uint32_t r = 0; r < p; ++r) {
    const FusedShard& sh = ctx.shards[r];
    aCount[r] = sp.m * sh.kLen;
    bCount[r] = sh.kLen * n;
    cCount[r] = (allReduce ? sp.m : sh.rows) * n;
    recvCount[r] = checkedProduct(p - 1, sh.rows * n, "the recv buffer (ranks - 1 slots of a shard)");
  }
  const uint16_t a = b.addBuffer("a", sp.dtype, BufferKind::Input, aCount);
  const uint16_t bb = b.addBuffer("b", sp.dtype, BufferKind::Input, bCount);
  const uint16_t c = b.addBuffer("c", sp.dtype, BufferKind::Output, cCount);
  const FusedLanes lanes(b, ctx);
  const uint32_t computeLanes = ctx.opt.computeLanes;
  auto gemm = [&](uint32_t r, uint32_t lane, const FusedTile& t, BufRef dst) {
    b.gemm(r, lanes(r, FusedLane::Compute, lane), tileShape(ctx, r, t.rows), dst,
           bufRef(r, a, t.row * ctx.shards[r].kLen), bufRef(r, bb, 0), gemmFlags(ctx));
  };
  if (p == 1) {  // nothing to reduce: the GEMM straight into the output
    for (std::size_t i = 0; i < ctx.tiles[0].size(); ++i)
      gemm(0, static_cast<uint32_t>(i % computeLanes), ctx.tiles[0][i],
           bufRef(0, c, ownOffset(ctx, 0, ctx.tiles[0][i], false)));
    return;
  }
  const uint16_t partial = b.addBuffer("partial", sp.dtype, BufferKind::Scratch, sp.m * n);
  const uint16_t recv = b.addBuffer("recv", sp.dtype, BufferKind::Scratch, recvCount);
  // [lane]: own compute lane -> own send and reduce lanes, one increment per tile in the lane's order.
  const std::vector<uint32_t> done = b.newFlags(computeLanes);
  const std::vector<uint32_t> arrive = b.newFlags(p - 1);  // [d - 1]: partials from the peer at distance d
  GatherPart gather;
  if (allReduce) gather = declareGather(b, ctx, c);

  for (uint32_t r = 0; r < p; ++r) {
    // Compute: a tile of every shard (its partial), in the option's walk, the compute lanes taking the items in
    // turn; lane[d][t] and index[d][t] say which lane computed it and its place there.
    const std::vector<std::size_t> tilesAt = ctx.tilesByDistance(r, true);
    std::vector<std::vector<uint32_t>> lane(p);
    std::vector<std::vector<uint64_t>> index(p);
    for (uint32_t d = 0; d < p; ++d) {
      lane[d].resize(tilesAt[d]);
      index[d].resize(tilesAt[d]);
    }
    std::vector<uint64_t> perLane(computeLanes, 0);
    uint64_t turn = 0;
    for (const auto& [d, t] : ctx.walk(tilesAt, ctx.visits[r])) {
      const FusedTile& tile = ctx.tiles[ctx.ahead(r, d)][t];
      const auto l = static_cast<uint32_t>(turn++ % computeLanes);
      gemm(r, l, tile, d == 0 ? bufRef(r, c, ownOffset(ctx, r, tile, allReduce)) : bufRef(r, partial, tile.row * n));
      b.signal(r, lanes(r, FusedLane::Compute, l), r, done[l]);
      lane[d][t] = l;
      index[d][t] = perLane[l]++;
    }
    // Send: each peer's partial tiles to it in the same order, each as soon as it is computed (and gemm-ar's
    // finished tiles to every peer).
    for (const bool near : {true, false}) {
      for (const SendItem& item : sendItems(ctx, r, near, allReduce)) {
        const uint32_t sender = lanes(r, near ? FusedLane::SendNvlink : FusedLane::SendNetwork);
        if (item.gather) {
          emitGatherTile(b, ctx, gather, r, sender, near, item.t);
          continue;
        }
        const uint32_t owner = ctx.ahead(r, item.d);
        const FusedTile& tile = ctx.tiles[owner][item.t];
        b.wait(r, sender, done[lane[item.d][item.t]], index[item.d][item.t] + 1);
        b.put(r, sender, bufRef(owner, recv, recvOffset(ctx, owner, item.d, tile)), bufRef(r, partial, tile.row * n),
              uint64_t{tile.rows} * n, arrive[item.d - 1]);
      }
    }
    // Reduce: own tiles, one reduction per peer's partial (each rounded to the dtype), as the partials arrive.
    const uint32_t reduce = lanes(r, FusedLane::Reduce);
    const auto& own = ctx.tiles[r];
    const uint32_t sum = ctx.arrivals[r].front();  // own-last: the peers' partials are summed in this slot
    for (const Reduction& x : reductions(ctx, r)) {
      const FusedTile& tile = own[x.t];
      if (x.alsoWait) b.wait(r, reduce, arrive[x.alsoWait - 1], x.t + 1);
      if (x.d) b.wait(r, reduce, arrive[x.d - 1], x.t + 1);
      if (x.waitOwn) b.wait(r, reduce, done[lane[0][x.t]], index[0][x.t] + 1);
      const BufRef dst = x.d && ctx.opt.order == TileOrder::OwnLast ? bufRef(r, recv, recvOffset(ctx, r, sum, tile))
                                                                    : bufRef(r, c, ownOffset(ctx, r, tile, allReduce));
      const BufRef add = bufRef(r, recv, recvOffset(ctx, r, x.d ? x.d : sum, tile));
      b.reduce(r, reduce, dst, dst, add, uint64_t{tile.rows} * n);
      if (x.finishes && allReduce) b.signal(r, reduce, r, gather.reduced);
    }
  }
  if (allReduce) emitGatherWaits(b, ctx, lanes, gather);
}

FusedEstimate costReduceScatter(const FusedContext& ctx, const Profile& profile, bool allReduce) {
  const uint32_t p = ctx.p;
  const uint64_t n = ctx.spec.n;
  const double t0 = profile.dispatchUs;
  const double flag = profile.localFlagUs;  // a Signal to the signalling rank's own flag
  const FusedPrices px{ctx, profile};
  FusedTally tally;
  // comp[r][d][t]: when rank r's partial of tile t of shard (r + d) is computed; its compute lane never waits.
  std::vector<TileTimes> comp(p);
  for (uint32_t r = 0; r < p; ++r) {
    const std::vector<std::size_t> tilesAt = ctx.tilesByDistance(r, true);
    comp[r] = tileTimes(tilesAt);
    std::vector<ServingLane> lanes(ctx.opt.computeLanes, ServingLane(t0));
    uint64_t turn = 0;
    for (const auto& [d, t] : ctx.walk(tilesAt, ctx.visits[r])) {
      const auto l = static_cast<uint32_t>(turn++ % lanes.size());
      comp[r][d][t] = lanes[l].serve(t0, px.gemmUs(r, l, ctx.tiles[ctx.ahead(r, d)][t].rows));
    }
    for (const ServingLane& lane : lanes) tally.lane(FusedLane::Compute, lane, false);
  }
  if (p == 1) return tally.finish(ctx, profile, 0);

  // The other lanes wait on each other across ranks (gemm-ar's gathers on the reductions, the reductions on the
  // partials): serve every lane's items in order as their inputs become known, until all are served.
  constexpr double kUnknown = std::numeric_limits<double>::quiet_NaN();
  std::vector<TileTimes> arrive(p);             // [r][d][t]: partial of r's tile t from distance d visible to r
  std::vector<std::vector<double>> reduced(p);  // [r][t]: r's finished tile t visible to its send lanes
  for (uint32_t r = 0; r < p; ++r) {
    arrive[r] = TileTimes(p, std::vector<double>(ctx.tiles[r].size(), kUnknown));
    reduced[r].assign(ctx.tiles[r].size(), kUnknown);
  }
  struct Cursor {
    uint32_t r;
    bool near;  // send lanes: the link
    ServingLane lane;
    std::vector<SendItem> sends;
    std::vector<Reduction> reductions;
    std::size_t next = 0;
  };
  std::vector<Cursor> cursors;
  for (uint32_t r = 0; r < p; ++r) {
    for (const bool near : {true, false})
      cursors.push_back(Cursor{r, near, ServingLane(t0), sendItems(ctx, r, near, allReduce), {}, 0});
    cursors.push_back(Cursor{r, false, ServingLane(t0), {}, reductions(ctx, r), 0});
  }
  // A send lane's item: returns false when its input is not known yet.
  auto send = [&](Cursor& k, const SendItem& item) {
    if (item.gather) {
      if (std::isnan(reduced[k.r][item.t])) return false;
      tally.endUs = std::max(tally.endUs, serveGatherTile(k.lane, ctx, px, k.r, k.near, item.t, reduced[k.r][item.t]));
      return true;
    }
    const uint32_t owner = ctx.ahead(k.r, item.d);
    const FusedLane purpose = k.near ? FusedLane::SendNvlink : FusedLane::SendNetwork;
    const uint64_t elems = uint64_t{ctx.tiles[owner][item.t].rows} * n;
    const double us = px.putUs(k.r, owner, purpose, elems, false);
    arrive[owner][item.d][item.t] =
        k.lane.serve(comp[k.r][item.d][item.t] + flag, us) + px.putVisibleUs(k.r, owner, purpose, elems, false);
    return true;
  };
  auto reduce = [&](Cursor& k, const Reduction& x) {
    double ready = x.waitOwn ? comp[k.r][0][x.t] + flag : t0;
    for (const uint32_t d : {x.d, x.alsoWait}) {
      if (d == 0) continue;
      if (std::isnan(arrive[k.r][d][x.t])) return false;
      ready = std::max(ready, arrive[k.r][d][x.t]);
    }
    const double end = k.lane.serve(ready, px.reduceUs(k.r, uint64_t{ctx.tiles[k.r][x.t].rows} * n));
    if (x.finishes) reduced[k.r][x.t] = end + flag;
    return true;
  };
  for (bool progress = true; progress;) {
    progress = false;
    for (Cursor& k : cursors) {
      const std::size_t total = k.sends.size() + k.reductions.size();
      while (k.next < total && (k.sends.empty() ? reduce(k, k.reductions[k.next]) : send(k, k.sends[k.next]))) {
        ++k.next;
        progress = true;
      }
    }
  }
  for (const Cursor& k : cursors) {
    if (k.next < k.sends.size() + k.reductions.size())
      throw Error(ErrorCode::Internal, std::string(toString(ctx.spec.op)) + " closed form: rank " +
                                           std::to_string(k.r) + "'s lanes wait on each other (a generator bug)");
    if (!k.sends.empty())
      tally.lane(k.near ? FusedLane::SendNvlink : FusedLane::SendNetwork, k.lane, !k.near);
    else if (!k.reductions.empty())
      tally.lane(FusedLane::Reduce, k.lane, false);
  }
  // Puts into the peers' "c" (gemm-ar) touch their user buffers: the op pays peerUserUs once (rule 1).
  return tally.finish(ctx, profile, allReduce && profile.peerUserUs > 0 ? profile.peerUserUs : 0.0);
}

FusedDef fusedGemmReduceScatter() {
  return FusedDef{
      FusedOp::GemmReduceScatter,
      "C = A B, k split over ranks, reduce-scattered over m: each tile pushed to its owner as computed",
      [](ScheduleBuilder& b, const FusedContext& ctx) { emitReduceScatter(b, ctx, false); },
      [](const FusedContext& ctx, const Profile& profile) { return costReduceScatter(ctx, profile, false); },
      [](uint32_t nvlinkPeers, uint32_t networkPeers) { return reduceScatterLanes(nvlinkPeers, networkPeers, false); },
      /*peersTouchUser=*/false};  // partials land in the owner's scratch
}

}  // namespace mk::detail
