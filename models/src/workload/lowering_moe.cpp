// mkernel — the lowering's mixture-of-experts layers: router, permutation, expert-parallel exchanges, experts and
// shared experts (docs/planner.md, "Expert parallelism").
#include "lowering_internal.hpp"

#include <cmath>
#include <string>

#include "mk/workload/model_shape.hpp"

namespace mk::detail {

void StageBuilder::addSharedExperts(Pass pass, bool recompute, const std::string& sfx) {
  const ModelShape& m = w_.model;
  const double mats = m.gated() ? 3.0 : 2.0;
  const uint64_t width = static_cast<uint64_t>(layerParams(m, r_.tp).shared / (mats * dbl(m.hidden)));
  if (width == 0) return;
  const bool sp = w_.layout.sp;
  const uint64_t upN = (m.gated() ? 2 : 1) * width;
  const uint32_t up = addGemm("shared-up" + sfx, pass, tokens_, upN, m.hidden, 1, moeLayers_, recompute);
  if (sp) tpBoundary("tp.ag.shared-up" + sfx, CommKind::AllGather, pass, up, moeLayers_);
  addKernel(shape(KernelClass::Activation, toString(m.activation), tokens_, upN), "shared-act" + sfx, pass, moeLayers_,
            recompute);
  const uint32_t down = addGemm("shared-down" + sfx, pass, tokens_, m.hidden, width, 1, moeLayers_, recompute);
  tpBoundary((sp ? "tp.rs.shared-down" : "tp.ar.shared-down") + sfx, sp ? CommKind::ReduceScatter : CommKind::AllReduce,
             pass, down, moeLayers_);
}

void StageBuilder::addMoe(Pass pass, bool recompute, const std::string& sfx) {
  const ModelShape& m = w_.model;
  const MoeSpec& moe = *m.moe;
  addSharedExperts(pass, recompute, sfx);
  const uint64_t local = tokens_ / r_.tp;  // each tensor-parallel rank routes its sequence slice
  const uint64_t fe = moe.ffn ? moe.ffn : m.ffn;
  const uint64_t expertsHere = moe.experts / r_.ep;
  // The busiest rank sets the layer's time: its experts' rows and the blocks it receives are routedLoad() x the
  // balanced share; tokens over a capacity are dropped and cost nothing (docs/planner.md, "Expert parallelism").
  const double load = moe.routedLoad();
  const uint64_t rows = static_cast<uint64_t>(std::ceil(dbl(local * moe.topK * r_.ep) / moe.experts * load));
  addGemm("router" + sfx, pass, local, moe.experts, m.hidden, 1, moeLayers_, recompute);
  ComputeOp topk = shape(KernelClass::Router, "topk-softmax", local, 0);
  topk.experts = moe.experts;
  topk.topk = moe.topK;
  addKernel(topk, "router-topk" + sfx, pass, moeLayers_, recompute);
  ComputeOp perm = shape(KernelClass::Permute, "permute", local, m.hidden);
  perm.topk = moe.topK;
  perm.experts = moe.experts;
  addKernel(perm, "permute" + sfx, pass, moeLayers_, recompute);
  const uint64_t block = static_cast<uint64_t>(std::ceil(dbl(local * moe.topK * m.hidden) / r_.ep * load));
  if (r_.ep > 1 && (!recompute || rerun("ep.dispatch")))
    addComm("ep.dispatch" + sfx, Phase::Ep, CommKind::AllToAll, pass, CommTiming::Blocking, block, w_.training.dtype,
            moeLayers_, epGroups_);
  const uint64_t upN = (m.gated() ? 2 : 1) * fe;
  addGemm("expert-up" + sfx, pass, rows, upN, m.hidden, expertsHere, moeLayers_, recompute);
  // One launch over the rows of every local expert.
  addKernel(shape(KernelClass::Activation, toString(m.activation), rows * expertsHere, upN), "expert-act" + sfx, pass,
            moeLayers_, recompute);
  addGemm("expert-down" + sfx, pass, rows, m.hidden, fe, expertsHere, moeLayers_, recompute);
  if (r_.ep > 1 && (!recompute || rerun("ep.combine")))
    addComm("ep.combine" + sfx, Phase::Ep, CommKind::AllToAll, pass, CommTiming::Blocking, block, w_.training.dtype,
            moeLayers_, epGroups_);
  perm.kernel = "unpermute";
  addKernel(perm, "unpermute" + sfx, pass, moeLayers_, recompute);
}

}  // namespace mk::detail
