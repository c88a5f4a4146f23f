// gemm-ar: gemm-rs (fused_gemm_rs.cpp) followed, tile by tile, by the all-gather of the reduced tiles: as soon as
// an owner has reduced a tile it puts it into the same rows of every peer's "c". Every rank ends with all of C,
// bit-identical (each tile is reduced once, by its owner, and copied). Formulas: docs/fused-operators.md.
#include "fused_common.hpp"

namespace mk::detail {

namespace {

/// Peers of `r` in visiting order on the same node (`near`) or on other nodes.
std::vector<uint32_t> peersByLink(const FusedContext& ctx, uint32_t r, bool near) {
  std::vector<uint32_t> peers;
  for (const uint32_t d : ctx.visits[r])
    if (ctx.sameNode(r, ctx.ahead(r, d)) == near) peers.push_back(ctx.ahead(r, d));
  return peers;
}

void emit(ScheduleBuilder& b, const FusedContext& ctx) {
  const ReduceScatterPart part = emitReduceScatter(b, ctx, true);
  const uint32_t p = ctx.p;
  if (p == 1) return;
  const uint64_t n = ctx.spec.n;
  const FusedLanes lanes(b, ctx);
  const std::vector<uint32_t> gathered = b.newFlags(p - 1);  // [d - 1]: tiles from the owner at distance d behind
  for (uint32_t r = 0; r < p; ++r) {
    for (const bool near : {true, false}) {
      const std::vector<uint32_t> peers = peersByLink(ctx, r, near);
      if (peers.empty()) continue;
      const uint32_t lane = lanes(r, near ? FusedLane::GatherNvlink : FusedLane::GatherNetwork);
      const auto& own = ctx.tiles[r];
      for (std::size_t i = 0; i < own.size(); ++i) {
        b.wait(r, lane, part.reduceFlagId, i + 1);
        for (const uint32_t q : peers)
          b.put(r, lane, bufRef(q, part.c, own[i].row * n), bufRef(r, part.c, own[i].row * n),
                uint64_t{own[i].rows} * n, gathered[(q + p - r) % p - 1]);
      }
    }
  }
  // The op ends on a rank once every owner's tiles have landed there: its reduce lane waits for them last.
  for (uint32_t q = 0; q < p; ++q)
    for (const uint32_t flag : gathered) b.waitAllSent(q, lanes(q, FusedLane::Reduce), flag);
}

FusedEstimate cost(const FusedContext& ctx, const Profile& profile) {
  FusedTally tally;
  const FusedPrices px{ctx, profile};
  const std::vector<std::vector<double>> reduced = costReduceScatter(ctx, px, tally);
  const uint32_t p = ctx.p;
  if (p == 1) return tally.finish(ctx, profile, 0);
  const uint64_t n = ctx.spec.n;
  for (uint32_t r = 0; r < p; ++r) {
    for (const bool near : {true, false}) {
      const FusedLane purpose = near ? FusedLane::GatherNvlink : FusedLane::GatherNetwork;
      const std::vector<uint32_t> peers = peersByLink(ctx, r, near);
      ServingLane lane(profile.dispatchUs);
      for (std::size_t t = 0; t < ctx.tiles[r].size(); ++t) {
        const uint64_t elems = uint64_t{ctx.tiles[r][t].rows} * n;
        for (const uint32_t q : peers) {
          const double end = lane.serve(reduced[r][t], px.putUs(r, q, purpose, elems, true));
          // The receiver's last wait (on its reduce lane) ends when the last of these lands.
          tally.endUs = std::max(tally.endUs, end + px.putVisibleUs(r, q, true));
        }
      }
      tally.lane(purpose, lane, !near);
    }
  }
  // Puts into the peers' "c" touch their user buffers: the op pays peerUserUs once.
  return tally.finish(ctx, profile, profile.peerUserUs > 0 ? profile.peerUserUs : 0.0);
}

std::vector<std::pair<FusedLane, uint32_t>> commLanes(uint32_t nvlinkPeers, uint32_t networkPeers) {
  auto lanes = reduceScatterLanes(nvlinkPeers, networkPeers);
  addLinkLanes(lanes, FusedLane::GatherNvlink, FusedLane::GatherNetwork, nvlinkPeers, networkPeers);
  return lanes;
}

}  // namespace

FusedDef fusedGemmAllReduce() {
  return FusedDef{FusedOp::GemmAllReduce,
                  "gemm-rs, then each reduced tile put into every peer's C as soon as its owner finished it",
                  emit,
                  cost,
                  commLanes,
                  /*peersTouchUser=*/true};
}

}  // namespace mk::detail
