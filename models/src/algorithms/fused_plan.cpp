// mkernel — what a fused op leaves open, decided as the engine would: the CTAs, the tile height, and the order
// and the split with the lowest closed form; and the unfused baseline the planner compares with (fused.hpp).
#include <algorithm>
#include <tuple>

#include "fused_common.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/cost/step_cost.hpp"
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
  // More compute lanes only help where a tile has fewer 128 x 128 output tiles than the kernel has CTAs (then
  // each lane's share has work); elsewhere they only slow each tile down, so they are not tried.
  std::vector<uint32_t> computeLanes = {opt.computeLanes};
  if (opt.computeLanes == 0) {
    plan.lanesByModel = true;
    uint64_t narrowest = ~uint64_t{0};
    for (const FusedShard& sh : fusedShards(spec, nRanks))
      narrowest = std::min(narrowest, spec.op == FusedOp::AllGatherGemm ? sh.cols : spec.n);
    const uint64_t rows = std::min<uint64_t>(opt.tileRows, spec.m / nRanks);
    computeLanes = gemmTiles128(rows, narrowest) < opt.ctas ? std::vector<uint32_t>{1, 2, 4} : std::vector<uint32_t>{1};
  }
  // The lowest closed form over (order, lanes, split). Ties keep the earlier order, then fewer compute lanes,
  // then fewer communication CTAs. Long split ranges are searched on a grid of every kGrid-th split first, then
  // around the best point of the grid: the time against the split falls while communication bounds the op and
  // rises once compute does, with steps of at most a few CTAs (the lanes' shares are whole CTAs).
  constexpr uint32_t kGrid = 4;
  bool have = false;
  auto consider = [&](const FusedOptions& o) {
    const FusedEstimate e = fusedClosedForm(spec, o, topo, nRanks, profile);
    const bool better =
        !have || e.totalUs < plan.estimate.totalUs ||
        (e.totalUs == plan.estimate.totalUs && std::tie(o.order, o.computeLanes, o.commCtas) <
                                                   std::tie(plan.opt.order, plan.opt.computeLanes, plan.opt.commCtas));
    if (better) {
      plan.opt = o;
      plan.estimate = e;
      have = true;
    }
    return e.totalUs;
  };
  for (const TileOrder order : orders)
    for (const uint32_t lanes : computeLanes) {
      auto at = [&](uint32_t comm) {
        FusedOptions o = opt;
        o.order = order;
        o.computeLanes = lanes;
        o.commCtas = comm;
        return consider(o);
      };
      // A lane count the compute CTAs cannot hold is skipped; one lane is always tried, so a split that does not
      // fit is reported by generate()'s rules.
      std::vector<uint32_t> fit;
      for (const uint32_t comm : splits)
        if (!plan.lanesByModel || lanes == 1 || (comm < opt.ctas ? opt.ctas - comm : opt.ctas) >= lanes)
          fit.push_back(comm);
      if (fit.size() <= 8 * kGrid) {
        for (const uint32_t comm : fit) at(comm);
        continue;
      }
      std::size_t best = 0;
      double bestUs = 0;
      for (std::size_t i = 0; i < fit.size(); i += kGrid) {
        const double us = at(fit[i]);
        if (i == 0 || us < bestUs) {
          best = i;
          bestUs = us;
        }
      }
      const std::size_t from = best >= kGrid ? best - kGrid + 1 : 0;
      for (std::size_t i = from; i < std::min(fit.size(), best + kGrid); ++i)
        if (i % kGrid != 0) at(fit[i]);
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
