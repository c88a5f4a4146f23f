// gemm-rs: C = A B with k split over the ranks (row-parallel linear), reduce-scattered over m. Every rank computes
// its partial of every tile; a tile owned by a peer goes to that peer's "recv" slot as soon as it is computed
// (Put with signal over NVLink, ProxyPut across nodes), and each owner reduces its tiles as the partials arrive.
// Also the first half of gemm-ar (fused_gemm_ar.cpp). Formulas: docs/fused-operators.md.
#include "fused_common.hpp"

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

/// The reductions of owner r's tiles as (distance of the partial, tile) items, in the order the partials arrive
/// (arrivals[r]): own-first shard by shard (the first arriving peer's partial for every tile, then the second's,
/// ...), interleaved round by round; own-last sums the peers' partials into the first arriving peer's slot and
/// adds its own tile last (distance 0).
std::vector<std::pair<uint32_t, uint32_t>> reductions(const FusedContext& ctx, uint32_t r) {
  std::vector<std::pair<uint32_t, uint32_t>> items;
  const auto n = static_cast<uint32_t>(ctx.tiles[r].size());
  const std::vector<uint32_t>& peers = ctx.arrivals[r];
  if (ctx.opt.order == TileOrder::Interleaved) {
    for (uint32_t t = 0; t < n; ++t)
      for (uint32_t d : peers) items.emplace_back(d, t);
    return items;
  }
  for (std::size_t i = ctx.opt.order == TileOrder::OwnLast ? 1 : 0; i < peers.size(); ++i)
    for (uint32_t t = 0; t < n; ++t) items.emplace_back(peers[i], t);
  if (ctx.opt.order == TileOrder::OwnLast)
    for (uint32_t t = 0; t < n; ++t) items.emplace_back(0, t);
  return items;
}

}  // namespace

std::vector<std::pair<FusedLane, uint32_t>> reduceScatterLanes(uint32_t nvlinkPeers, uint32_t networkPeers) {
  std::vector<std::pair<FusedLane, uint32_t>> lanes;
  addLinkLanes(lanes, FusedLane::SendNvlink, FusedLane::SendNetwork, nvlinkPeers, networkPeers);
  lanes.emplace_back(FusedLane::Reduce, nvlinkPeers + networkPeers);  // one reduction per peer's partial
  return lanes;
}

ReduceScatterPart emitReduceScatter(ScheduleBuilder& b, const FusedContext& ctx, bool allReduce) {
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
  ReduceScatterPart part;
  part.a = b.addBuffer("a", sp.dtype, BufferKind::Input, aCount);
  part.b = b.addBuffer("b", sp.dtype, BufferKind::Input, bCount);
  part.c = b.addBuffer("c", sp.dtype, BufferKind::Output, cCount);
  const FusedLanes lanes(b, ctx);
  const uint8_t flags = gemmFlags(ctx);
  auto aTile = [&](uint32_t r, const FusedTile& t) { return bufRef(r, part.a, t.row * ctx.shards[r].kLen); };

  if (p == 1) {  // nothing to reduce: the GEMM straight into the output
    for (const FusedTile& t : ctx.tiles[0])
      b.gemm(0, lanes(0, FusedLane::Compute), tileShape(ctx, 0, t.rows), bufRef(0, part.c, ownOffset(ctx, 0, t, false)),
             aTile(0, t), bufRef(0, part.b, 0), flags);
    return part;
  }
  part.partial = b.addBuffer("partial", sp.dtype, BufferKind::Scratch, sp.m * n);
  part.recv = b.addBuffer("recv", sp.dtype, BufferKind::Scratch, recvCount);
  const uint32_t done = b.newFlag();                       // own compute lane -> own send and reduce lanes, per tile
  const std::vector<uint32_t> arrive = b.newFlags(p - 1);  // [d - 1]: partials from the peer at distance d
  if (allReduce) part.reduceFlagId = b.newFlag();          // own reduce lane -> own gather lanes, per finished tile

  for (uint32_t r = 0; r < p; ++r) {
    // Compute: a tile of every shard (its partial), in the option's order; index[d][t] is its place in it.
    const uint32_t compute = lanes(r, FusedLane::Compute);
    const std::vector<std::size_t> tilesAt = ctx.tilesByDistance(r, true);
    const auto items = ctx.walk(tilesAt, ctx.visits[r]);
    std::vector<std::vector<uint64_t>> index(p);
    for (uint32_t d = 0; d < p; ++d) index[d].resize(tilesAt[d]);
    uint64_t g = 0;
    for (const auto& [d, t] : items) {
      const FusedTile& tile = ctx.tiles[ctx.ahead(r, d)][t];
      const BufRef c =
          d == 0 ? bufRef(r, part.c, ownOffset(ctx, r, tile, allReduce)) : bufRef(r, part.partial, tile.row * n);
      b.gemm(r, compute, tileShape(ctx, r, tile.rows), c, aTile(r, tile), bufRef(r, part.b, 0), flags);
      b.signal(r, compute, r, done);
      index[d][t] = g++;
    }
    // Send: each peer's partial tiles to it in the same order, each as soon as it is computed.
    for (const auto& [d, t] : items) {
      if (d == 0) continue;
      const uint32_t owner = ctx.ahead(r, d);
      const FusedTile& tile = ctx.tiles[owner][t];
      const uint32_t lane = lanes.to(r, owner, FusedLane::SendNvlink);
      b.wait(r, lane, done, index[d][t] + 1);
      b.put(r, lane, bufRef(owner, part.recv, recvOffset(ctx, owner, d, tile)), bufRef(r, part.partial, tile.row * n),
            uint64_t{tile.rows} * n, arrive[d - 1]);
    }
    // Reduce: own tiles, one reduction per peer's partial (each rounded to the dtype), as the partials arrive.
    const uint32_t reduce = lanes(r, FusedLane::Reduce);
    const auto& own = ctx.tiles[r];
    auto cTile = [&](uint32_t t) { return bufRef(r, part.c, ownOffset(ctx, r, own[t], allReduce)); };
    auto recvTile = [&](uint32_t d, uint32_t t) { return bufRef(r, part.recv, recvOffset(ctx, r, d, own[t])); };
    auto finished = [&] {
      if (allReduce) b.signal(r, reduce, r, part.reduceFlagId);
    };
    const uint32_t first = ctx.arrivals[r].front(), second = p > 2 ? ctx.arrivals[r][1] : 0;
    const uint32_t lastPeer = ctx.arrivals[r].back();
    for (const auto& [d, t] : reductions(ctx, r)) {
      const uint64_t count = uint64_t{own[t].rows} * n;
      if (ctx.opt.order != TileOrder::OwnLast) {
        // c = own, then c += each peer's partial in the order they arrive.
        if (d == first) b.wait(r, reduce, done, index[0][t] + 1);
        b.wait(r, reduce, arrive[d - 1], t + 1);
        b.reduce(r, reduce, cTile(t), cTile(t), recvTile(d, t), count);
        if (d == lastPeer) finished();
      } else if (d > 0) {
        // The peers' partials summed in the first arriving peer's slot as they arrive.
        if (d == second) b.wait(r, reduce, arrive[first - 1], t + 1);
        b.wait(r, reduce, arrive[d - 1], t + 1);
        b.reduce(r, reduce, recvTile(first, t), recvTile(first, t), recvTile(d, t), count);
      } else {
        // The own tile last: c = own + the peers' sum.
        if (p == 2) b.wait(r, reduce, arrive[first - 1], t + 1);
        b.wait(r, reduce, done, index[0][t] + 1);
        b.reduce(r, reduce, cTile(t), cTile(t), recvTile(first, t), count);
        finished();
      }
    }
  }
  return part;
}

std::vector<std::vector<double>> costReduceScatter(const FusedContext& ctx, const FusedPrices& px, FusedTally& tally) {
  const uint32_t p = ctx.p;
  const uint64_t n = ctx.spec.n;
  const double t0 = px.profile.dispatchUs;
  const double flag = px.profile.localFlagUs;  // a Signal to the signalling rank's own flag
  // comp[r][d][t]: when rank r's partial of tile t of shard (r + d) is computed.
  std::vector<TileTimes> comp(p);
  for (uint32_t r = 0; r < p; ++r) {
    const std::vector<std::size_t> tilesAt = ctx.tilesByDistance(r, true);
    comp[r] = tileTimes(tilesAt);
    ServingLane lane(t0);
    for (const auto& [d, t] : ctx.walk(tilesAt, ctx.visits[r]))
      comp[r][d][t] = lane.serve(t0, px.gemmUs(r, ctx.tiles[ctx.ahead(r, d)][t].rows));
    tally.lane(FusedLane::Compute, lane, false);
  }
  std::vector<std::vector<double>> reduced(p);
  if (p == 1) return reduced;
  // arrive[r][d][t]: when the partial of rank r's tile t from the peer at distance d is visible to r.
  std::vector<TileTimes> arrive(p);
  for (uint32_t r = 0; r < p; ++r) arrive[r] = tileTimes(std::vector<std::size_t>(p, ctx.tiles[r].size()));
  for (uint32_t r = 0; r < p; ++r) {
    ServingLane nvlink(t0), network(t0);
    for (const auto& [d, t] : ctx.walk(ctx.tilesByDistance(r, true), ctx.visits[r])) {
      if (d == 0) continue;
      const uint32_t owner = ctx.ahead(r, d);
      const bool near = ctx.sameNode(r, owner);
      const double us = px.putUs(r, owner, near ? FusedLane::SendNvlink : FusedLane::SendNetwork,
                                 uint64_t{ctx.tiles[owner][t].rows} * n, false);
      const double end = (near ? nvlink : network).serve(comp[r][d][t] + flag, us);
      arrive[owner][d][t] = end + px.putVisibleUs(r, owner, false);
    }
    tally.lane(FusedLane::SendNvlink, nvlink, false);
    tally.lane(FusedLane::SendNetwork, network, true);
  }
  // The owner's reductions, as emitReduceScatter orders them; `reduced` is when each finished tile is visible.
  for (uint32_t r = 0; r < p; ++r) {
    const auto& own = ctx.tiles[r];
    reduced[r].assign(own.size(), 0.0);
    ServingLane lane(t0);
    const uint32_t first = ctx.arrivals[r].front(), second = p > 2 ? ctx.arrivals[r][1] : 0;
    for (const auto& [d, t] : reductions(ctx, r)) {
      const double us = px.reduceUs(r, uint64_t{own[t].rows} * n);
      const double ownReady = comp[r][0][t] + flag;
      double ready;
      bool last;
      if (ctx.opt.order != TileOrder::OwnLast) {
        ready = d == first ? std::max(arrive[r][d][t], ownReady) : arrive[r][d][t];
        last = d == ctx.arrivals[r].back();
      } else if (d > 0) {
        ready = d == second ? std::max(arrive[r][first][t], arrive[r][d][t]) : arrive[r][d][t];
        last = false;
      } else {
        ready = p == 2 ? std::max(arrive[r][first][t], ownReady) : ownReady;
        last = true;
      }
      const double end = lane.serve(ready, us);
      if (last) reduced[r][t] = end + flag;
    }
    tally.lane(FusedLane::Reduce, lane, false);
  }
  return reduced;
}

FusedDef fusedGemmReduceScatter() {
  return FusedDef{FusedOp::GemmReduceScatter,
                  "C = A B, k split over ranks, reduce-scattered over m: each tile pushed to its owner as computed",
                  [](ScheduleBuilder& b, const FusedContext& ctx) { emitReduceScatter(b, ctx, false); },
                  [](const FusedContext& ctx, const Profile& profile) {
                    FusedTally tally;
                    costReduceScatter(ctx, FusedPrices{ctx, profile}, tally);
                    return tally.finish(ctx, profile, 0);
                  },
                  reduceScatterLanes,
                  /*peersTouchUser=*/false};  // partials land in the owner's scratch
}

}  // namespace mk::detail
