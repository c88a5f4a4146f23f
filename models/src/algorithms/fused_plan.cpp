// mkernel — what a fused op leaves open, decided as the engine would: the CTAs, the tile height, and the order
// and the split with the lowest closed form; and the unfused baseline the planner compares with (fused.hpp).
#include <algorithm>

#include "fused_common.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

constexpr uint32_t kEngineTile = 128;  // rows and columns of the GEMM engine's narrower output tile

uint32_t gpuSms(const Topology& topo, const Profile& profile) { return profile.sms > 0 ? profile.sms : topo.node.sms; }

}  // namespace

uint32_t fusedDefaultTileRows(const FusedSpec& spec, uint32_t nRanks, uint32_t ctas) {
  const std::vector<FusedShard> shards = fusedShards(spec, nRanks);
  uint64_t widest = 0, tallest = 0;
  for (const FusedShard& sh : shards) {
    widest = std::max(widest, sh.cols);
    tallest = std::max(tallest, sh.rows);
  }
  const uint64_t colTiles = (widest + kEngineTile - 1) / kEngineTile;
  const uint64_t rowTiles = (std::max<uint64_t>(ctas, 1) + colTiles - 1) / colTiles;
  return static_cast<uint32_t>(std::min<uint64_t>(rowTiles * kEngineTile, tallest));
}

FusedPlan planFused(const FusedSpec& spec, FusedOptions opt, const Topology& topo, uint32_t nRanks,
                    const Profile& profile) {
  validateFusedSpec(spec, nRanks);
  FusedPlan plan;
  plan.spec = spec;
  const uint32_t sms = gpuSms(topo, profile);
  if (opt.ctas == 0) {
    if (sms <= kEngineReservedSms)
      throw Error(ErrorCode::InvalidArgument, "the GPU has " + std::to_string(sms) +
                                                  " SMs, not more than the engine's reserve of " +
                                                  std::to_string(kEngineReservedSms) + ": give ctas explicitly");
    opt.ctas = sms - kEngineReservedSms;
    plan.ctasDefault = true;
  } else if (opt.ctas > sms) {
    throw Error(ErrorCode::InvalidArgument, "ctas " + std::to_string(opt.ctas) + " exceeds the GPU's " +
                                                std::to_string(sms) +
                                                " SMs (the resident compute kernel holds one CTA per SM)");
  }
  if (opt.tileRows == 0) {
    opt.tileRows = fusedDefaultTileRows(spec, nRanks, opt.ctas);
    plan.tileDefault = true;
  }
  std::vector<TileOrder> orders = {opt.order};
  if (opt.order == TileOrder::Auto) {
    orders = {TileOrder::OwnFirst, TileOrder::OwnLast, TileOrder::Interleaved};
    plan.orderByModel = true;
  }
  // Splits to try: the given one, or every one that leaves each lane a CTA (the most communication lanes any
  // rank has, up to all but one CTA). One rank has nothing to split.
  std::vector<uint32_t> splits = {opt.commCtas};
  if (opt.commCtas == 0 && nRanks > 1) {
    plan.splitByModel = true;
    const uint32_t most = detail::mostCommLanes(spec.op, detail::placementOf(topo.layout(nRanks)));
    if (most >= opt.ctas)
      throw Error(ErrorCode::InvalidArgument, std::string(toString(spec.op)) + ": " + std::to_string(opt.ctas) +
                                                  " CTAs cannot hold the compute lane and " + std::to_string(most) +
                                                  " communication lanes of this placement: ctas must be at least " +
                                                  std::to_string(most + 1));
    splits.clear();
    for (uint32_t c = most; c < opt.ctas; ++c) splits.push_back(c);
  }
  bool have = false;
  for (const TileOrder order : orders)
    for (const uint32_t comm : splits) {
      FusedOptions o = opt;
      o.order = order;
      o.commCtas = comm;
      const FusedEstimate e = fusedClosedForm(spec, o, topo, nRanks, profile);
      // Strictly lower only: ties keep the earlier order, then fewer communication CTAs.
      if (!have || e.totalUs < plan.estimate.totalUs) {
        plan.opt = o;
        plan.estimate = e;
        have = true;
      }
    }
  return plan;
}

LayeredEstimate layeredEstimate(const FusedSpec& spec, const Topology& topo, uint32_t nRanks, const Profile& profile) {
  requirePositive("profile.gemmTflops", profile.gemmTflops, "a gemm");
  LayeredEstimate e;
  uint64_t maxRows = 0;
  for (const FusedShard& sh : fusedShards(spec, nRanks)) {
    const double flops =
        2.0 * static_cast<double>(spec.m) * static_cast<double>(sh.cols) * static_cast<double>(sh.kLen);
    e.gemmUs = std::max(e.gemmUs, flops / (profile.gemmTflops * 1e6));
    maxRows = std::max(maxRows, sh.rows);
  }
  if (nRanks == 1) return e;
  // The collective of the same bytes, as the layered program runs it after (or before) the GEMM.
  CollectiveSpec coll;
  coll.dtype = spec.dtype;
  switch (spec.op) {
    case FusedOp::GemmReduceScatter:
      coll.op = CollOp::ReduceScatter;
      coll.count = maxRows * spec.n;
      break;
    case FusedOp::AllGatherGemm:
      coll.op = CollOp::AllGather;
      coll.count = maxRows * spec.k;
      break;
    case FusedOp::GemmAllReduce:
      coll.op = CollOp::AllReduce;
      coll.count = spec.m * spec.n;
      break;
  }
  const CollectivePlan plan =
      planCollective(coll, std::nullopt, GenOptions{0, 0, InterPhase::Auto}, topo, nRanks, profile);
  e.collectiveUs = closedForm(plan.spec, plan.gen, topo, nRanks, profile).totalUs;
  e.collective = std::string(toString(plan.spec.op)) + " " + toString(plan.spec.algo);
  return e;
}

}  // namespace mk
