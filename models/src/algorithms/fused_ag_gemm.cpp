// ag-gemm: A sharded over m, B over n (column-parallel linear). Every rank sends its A shard to every peer tile
// by tile (nearest distance first), into the same rows of the peer's "gathered" A; the compute lane runs the GEMM
// on the tiles present, the own shard first, and waits only on the flag of the shard a tile needs.
// Formulas: docs/fused-operators.md.
#include "fused_common.hpp"

namespace mk::detail {

namespace {

/// What rank r sends, by distance: its own shard's tiles to every peer (nothing at distance 0).
std::vector<std::size_t> sendTiles(const FusedContext& ctx, uint32_t r) {
  std::vector<std::size_t> n(ctx.p, ctx.tiles[r].size());
  n[0] = 0;
  return n;
}

void emit(ScheduleBuilder& b, const FusedContext& ctx) {
  const uint32_t p = ctx.p;
  const FusedSpec& sp = ctx.spec;
  std::vector<uint64_t> aCount(p), bCount(p), cCount(p);
  for (uint32_t r = 0; r < p; ++r) {
    const FusedShard& sh = ctx.shards[r];
    aCount[r] = sh.rows * sp.k;
    bCount[r] = sp.k * sh.cols;
    cCount[r] = sp.m * sh.cols;
  }
  const uint16_t a = b.addBuffer("a", sp.dtype, BufferKind::Input, aCount);
  const uint16_t bb = b.addBuffer("b", sp.dtype, BufferKind::Input, bCount);
  const uint16_t c = b.addBuffer("c", sp.dtype, BufferKind::Output, cCount);
  const uint16_t gathered = p > 1 ? b.addBuffer("gathered", sp.dtype, BufferKind::Scratch, sp.m * sp.k) : 0;
  const FusedLanes lanes(b, ctx);
  const std::vector<uint32_t> arrive = b.newFlags(p - 1);  // [d - 1]: A tiles from the rank at distance d behind
  auto ownRows = [&](uint32_t r, const FusedTile& t) { return bufRef(r, a, (t.row - ctx.shards[r].rowBegin) * sp.k); };

  for (uint32_t r = 0; r < p; ++r) {
    // Send: the own shard's tiles to every peer, in the option's walk over the peers in visiting order.
    for (const auto& [d, t] : ctx.walk(sendTiles(ctx, r), ctx.visits[r])) {
      const uint32_t peer = ctx.ahead(r, d);
      const FusedTile& tile = ctx.tiles[r][t];
      b.put(r, lanes.to(r, peer), bufRef(peer, gathered, tile.row * sp.k), ownRows(r, tile), uint64_t{tile.rows} * sp.k,
            arrive[d - 1]);
    }
    // Compute: tile t of shard (r - d) in the option's walk, the shards as they arrive, the compute lanes taking
    // the items in turn; a peer's tile waits for exactly that tile.
    uint64_t turn = 0;
    for (const auto& [d, t] : ctx.walk(ctx.tilesByDistance(r, false), ctx.arrivals[r])) {
      const FusedTile& tile = ctx.tiles[ctx.behind(r, d)][t];
      const uint32_t compute = lanes(r, FusedLane::Compute, static_cast<uint32_t>(turn++ % ctx.opt.computeLanes));
      if (d != 0) b.wait(r, compute, arrive[d - 1], t + 1);
      const BufRef aTile = d == 0 ? ownRows(r, tile) : bufRef(r, gathered, tile.row * sp.k);
      b.gemm(r, compute, tileShape(ctx, r, tile.rows), bufRef(r, c, tile.row * ctx.shards[r].cols), aTile,
             bufRef(r, bb, 0), gemmFlags(ctx));
    }
  }
}

FusedEstimate cost(const FusedContext& ctx, const Profile& profile) {
  const uint32_t p = ctx.p;
  const double t0 = profile.dispatchUs;
  const FusedPrices px{ctx, profile};
  FusedTally tally;
  // arrive[r][d][t]: when tile t of shard (r - d) is visible to r. The shards are inputs: sends start at t0.
  std::vector<TileTimes> arrive(p);
  for (uint32_t r = 0; r < p; ++r) arrive[r] = tileTimes(ctx.tilesByDistance(r, false));
  for (uint32_t r = 0; r < p; ++r) {
    ServingLane nvlink(t0), network(t0);
    for (const auto& [d, t] : ctx.walk(sendTiles(ctx, r), ctx.visits[r])) {
      const uint32_t peer = ctx.ahead(r, d);
      const bool near = ctx.sameNode(r, peer);
      const FusedLane purpose = near ? FusedLane::SendNvlink : FusedLane::SendNetwork;
      const uint64_t elems = uint64_t{ctx.tiles[r][t].rows} * ctx.spec.k;
      const double us = px.putUs(r, peer, purpose, elems, false);
      arrive[peer][d][t] = (near ? nvlink : network).serve(t0, us) + px.putVisibleUs(r, peer, purpose, elems, false);
    }
    tally.lane(FusedLane::SendNvlink, nvlink, false);
    tally.lane(FusedLane::SendNetwork, network, true);
  }
  for (uint32_t r = 0; r < p; ++r) {
    std::vector<ServingLane> lanes(ctx.opt.computeLanes, ServingLane(t0));
    uint64_t turn = 0;
    for (const auto& [d, t] : ctx.walk(ctx.tilesByDistance(r, false), ctx.arrivals[r])) {
      const auto l = static_cast<uint32_t>(turn++ % lanes.size());
      lanes[l].serve(d == 0 ? t0 : arrive[r][d][t], px.gemmUs(r, l, ctx.tiles[ctx.behind(r, d)][t].rows));
    }
    for (const ServingLane& lane : lanes) tally.lane(FusedLane::Compute, lane, false);
  }
  return tally.finish(ctx, profile, 0);
}

std::vector<std::pair<FusedLane, uint32_t>> commLanes(uint32_t nvlinkPeers, uint32_t networkPeers) {
  return sendLanes(nvlinkPeers, networkPeers, 1);
}

}  // namespace

FusedDef fusedAllGatherGemm() {
  return FusedDef{FusedOp::AllGatherGemm,
                  "A gathered over m tile by tile while the GEMM runs on the tiles present, own shard first",
                  emit,
                  cost,
                  commLanes,
                  /*peersTouchUser=*/false};  // A tiles land in the peers' scratch
}

}  // namespace mk::detail
