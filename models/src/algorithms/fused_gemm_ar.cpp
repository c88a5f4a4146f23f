// gemm-ar: gemm-rs (fused_gemm_rs.cpp) and, tile by tile, the all-gather of the reduced tiles: as soon as an
// owner has reduced a tile it puts it into the same rows of every peer's "c", on the send lanes that carry the
// partials (one round behind them in the interleaved order). Every rank ends with all of C, bit-identical (each
// tile is reduced once, by its owner, and copied). Formulas: docs/fused-operators.md.
#include "fused_common.hpp"

namespace mk::detail {

std::vector<uint32_t> peersByLink(const FusedContext& ctx, uint32_t r, bool near) {
  std::vector<uint32_t> peers;
  for (const uint32_t d : ctx.visits[r])
    if (ctx.sameNode(r, ctx.ahead(r, d)) == near) peers.push_back(ctx.ahead(r, d));
  return peers;
}

GatherPart declareGather(ScheduleBuilder& b, const FusedContext& ctx, uint16_t c) {
  GatherPart g;
  g.c = c;
  g.reduced = b.newFlag();
  g.gathered = b.newFlags(ctx.p - 1);
  return g;
}

void emitGatherTile(ScheduleBuilder& b, const FusedContext& ctx, const GatherPart& g, uint32_t r, uint32_t lane,
                    bool near, uint32_t t) {
  const FusedTile& tile = ctx.tiles[r][t];
  const uint64_t at = tile.row * ctx.spec.n;
  b.wait(r, lane, g.reduced, uint64_t{t} + 1);
  for (const uint32_t q : peersByLink(ctx, r, near))
    b.put(r, lane, bufRef(q, g.c, at), bufRef(r, g.c, at), uint64_t{tile.rows} * ctx.spec.n,
          g.gathered[(q + ctx.p - r) % ctx.p - 1]);
}

void emitGatherWaits(ScheduleBuilder& b, const FusedContext& ctx, const FusedLanes& lanes, const GatherPart& g) {
  for (uint32_t q = 0; q < ctx.p; ++q)
    for (const uint32_t flag : g.gathered) b.waitAllSent(q, lanes(q, FusedLane::Reduce), flag);
}

double serveGatherTile(ServingLane& lane, const FusedContext& ctx, const FusedPrices& px, uint32_t r, bool near,
                       uint32_t t, double readyUs) {
  const uint64_t elems = uint64_t{ctx.tiles[r][t].rows} * ctx.spec.n;
  double landed = readyUs;
  for (const uint32_t q : peersByLink(ctx, r, near)) {
    const FusedLane purpose = near ? FusedLane::SendNvlink : FusedLane::SendNetwork;
    const double end = lane.serve(readyUs, px.putUs(r, q, purpose, elems, true));
    landed = std::max(landed, end + px.putVisibleUs(r, q, purpose, elems, true));  // the receiver's final wait
  }
  return landed;
}

FusedDef fusedGemmAllReduce() {
  return FusedDef{
      FusedOp::GemmAllReduce,
      "gemm-rs, then each reduced tile put into every peer's C as soon as its owner finished it",
      [](ScheduleBuilder& b, const FusedContext& ctx) { emitReduceScatter(b, ctx, true); },
      [](const FusedContext& ctx, const Profile& profile) { return costReduceScatter(ctx, profile, true); },
      [](uint32_t nvlinkPeers, uint32_t networkPeers) { return reduceScatterLanes(nvlinkPeers, networkPeers, true); },
      /*peersTouchUser=*/true};
}

}  // namespace mk::detail
