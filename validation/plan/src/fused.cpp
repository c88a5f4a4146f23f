// mkernel — the fused operators' pricer (fused.hpp): the planner's GEMM + tensor-parallel collective pairs become the
// fused operators of models/src/algorithms (gemm-rs, ag-gemm, gemm-ar), priced by their own model
// (mk::sim::predictFused: the split, tile and order chosen by the closed form, then the SimGrid replay of the same
// schedule when the group spans nodes), one price per distinct operator; the fused blocks (moe-ffn, ring-attention)
// by priceFusedBlock (fused_blocks.cpp), one price per distinct block.
#include "mk/plan/fused.hpp"

#include <map>
#include <sstream>
#include <tuple>

#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/error.hpp"
#include "mk/sim/fused.hpp"

namespace mk::plan {

namespace {

FusedOp fusedOpOf(FusedKind k) {
  switch (k) {
    case FusedKind::AllGatherGemm: return FusedOp::AllGatherGemm;
    case FusedKind::GemmReduceScatter: return FusedOp::GemmReduceScatter;
    case FusedKind::GemmAllReduce: return FusedOp::GemmAllReduce;
  }
  throw Error(ErrorCode::Internal, "fused: unknown fused kind");
}

/// The whole GEMM of the fused operator from the GEMM one rank runs in the layered variant (fused.hpp's file
/// comment gives each operator's shards): row-parallel ops (gemm-rs, gemm-ar) split K over the group, the
/// column-parallel one (ag-gemm) splits N and gathers the rows of A it multiplies.
FusedSpec wholeGemm(const FusedOpRequest& rq, uint32_t ranks) {
  if (rq.gemm.batch != 1)
    throw Error(ErrorCode::Unsupported, "fused: '" + rq.gemm.name + "' runs " + std::to_string(rq.gemm.batch) +
                                            " GEMMs in one kernel; the fused operators take one");
  FusedSpec spec;
  spec.op = fusedOpOf(rq.kind);
  spec.dtype = rq.comm.dtype;
  spec.m = rq.gemm.m;
  spec.n = spec.op == FusedOp::AllGatherGemm ? rq.gemm.n * ranks : rq.gemm.n;
  spec.k = spec.op == FusedOp::AllGatherGemm ? rq.gemm.k : rq.gemm.k * ranks;
  return spec;
}

/// The fused operators' own model, one simulation per distinct operator and placement.
class ModelFusedPricer final : public FusedOpPricer {
 public:
  bool available() const override { return true; }
  std::string unavailableReason() const override { return {}; }

  FusedOpPrice priceBlock(const FusedBlockRequest& rq) override {
    const FusedBlock& b = rq.block;
    std::ostringstream key;
    key.precision(17);
    key << toString(b.kind) << '|' << b.mirror << '|' << b.tokens << '|' << b.experts << '|' << b.topk << '|'
        << b.hidden << '|' << b.ffn << '|' << b.load << '|' << b.batch << '|' << b.heads << '|' << b.kvHeads << '|'
        << b.headDim << '|' << b.seq << '|' << static_cast<int>(b.dtype) << '|' << b.unfusable << '|'
        << rq.placement.groupSize << '|' << rq.placement.groupNodes << '|' << rq.placement.choice.name << '|'
        << rq.placement.choice.node.gpus << '|' << (rq.profile ? rq.profile->network.bwGBs : 0) << '|'
        << (rq.profile ? rq.profile->nvlink.bwGBs : 0) << '|' << rq.computeUs;
    auto it = blocks_.find(key.str());
    if (it != blocks_.end()) return it->second;
    const FusedOpPrice p = priceFusedBlock(rq);
    blocks_.emplace(key.str(), p);
    return p;
  }

  FusedOpPrice price(const FusedOpRequest& rq) override {
    if (!rq.cluster || !rq.profile) throw Error(ErrorCode::Internal, "fused: a request without cluster or profile");
    if (!(rq.gemmUs > 0 && rq.gemm.flops > 0))
      throw Error(ErrorCode::Internal, "fused: '" + rq.gemm.name + "' comes without its layered GEMM price");
    const ConcurrentPlacement& pl = rq.placement;
    const uint32_t ranks = pl.groupSize;
    const FusedSpec spec = wholeGemm(rq, ranks);
    // One GEMM price rule for both variants: the operator's GEMM runs at the rate the planner's compute model
    // gives the layered GEMM (its shards are that GEMM's shape on every rank).
    const double gemmTflops = rq.gemm.flops / (rq.gemmUs * 1e6);
    const auto key = std::make_tuple(static_cast<int>(spec.op), static_cast<int>(spec.dtype), spec.m, spec.n, spec.k,
                                     ranks, pl.groupNodes, pl.choice.name, pl.choice.node.gpus,
                                     rq.profile->network.bwGBs, rq.profile->nvlink.bwGBs, gemmTflops);
    auto it = cache_.find(key);
    if (it != cache_.end()) return it->second;
    // The operator's ranks as the generator places them: instance 0 of the group on its own (the layered
    // collectives are priced on the same choice cluster). Its split needs the CTA facts a calibrated profile
    // may lack: the datasheet's, as mk-sim does.
    Profile profile = *rq.profile;
    profile.gemmTflops = gemmTflops;
    fillCtaDefaults(profile, pl.choice);
    const sim::FusedPrediction fp =
        sim::predictFused(spec, FusedOptions{}, pl.choice, ranks, profile, /*simulate=*/pl.multiNode);
    FusedOpPrice p;
    p.us = fp.totalUs;
    p.gemmUs = fp.computeUs;
    p.exposedCommUs = fp.exposedCommUs;
    std::ostringstream split;
    split << toString(spec.op) << " m " << spec.m << " n " << spec.n << " k " << spec.k << " on " << ranks
          << " ranks: " << fp.plan.opt.commCtas << " of " << fp.plan.opt.ctas << " CTAs communicate, tiles of "
          << fp.plan.opt.tileRows << " rows, " << toString(fp.plan.opt.order) << ", " << fp.plan.opt.computeLanes
          << " compute lane(s); bound by " << toString(fp.plan.estimate.bound);
    p.split = split.str();
    p.source = fp.simulatedUs ? "the fused schedule replayed by SimGrid" : "the fused schedule's closed form";
    cache_.emplace(key, p);
    return p;
  }

 private:
  std::map<std::tuple<int, int, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t, std::string, uint32_t, double, double,
                      double>,
           FusedOpPrice>
      cache_;
  std::map<std::string, FusedOpPrice> blocks_;  ///< priceBlock's, by everything the price depends on
};

}  // namespace

FusedOpPrice FusedOpPricer::priceBlock(const FusedBlockRequest& rq) {
  throw Error(ErrorCode::Unsupported, std::string(toString(rq.block.kind)) + ": this pricer prices no fused blocks");
}

std::unique_ptr<FusedOpPricer> makeFusedOpPricer() { return std::make_unique<ModelFusedPricer>(); }

}  // namespace mk::plan
