// mkernel — the lowering's mixture-of-experts layers: router, permutation, expert-parallel exchanges, experts and
// shared experts (docs/planner.md, "Expert parallelism").
#include "lowering_internal.hpp"

#include <cmath>
#include <string>
#include <vector>

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
  // Expert tensor parallelism splits each expert's columns over etp ranks (up and gate column-parallel, down
  // row-parallel): the rank's expert GEMMs see fe / etp.
  const uint64_t fe = (moe.ffn ? moe.ffn : m.ffn) / r_.etp;
  const uint64_t expertsHere = moe.experts / r_.ep;
  // The busiest rank sets the layer's time: its experts' rows and the blocks it receives are routedLoad() x the
  // balanced share; tokens over a capacity are dropped and cost nothing (docs/planner.md, "Expert parallelism").
  // An expert's rows come from the etp x ep ranks whose tokens reach its expert tensor-parallel group.
  const double load = moe.routedLoad();
  const uint64_t rows = static_cast<uint64_t>(std::ceil(dbl(local * moe.topK * r_.ep * r_.etp) / moe.experts * load));
  // Megatron-LM's router calls F.linear, not one of its linear layers (no gradient-accumulation fusion).
  addGemm("router" + sfx, pass, local, moe.experts, m.hidden, 1, moeLayers_, recompute, /*linearLayer=*/false);
  ComputeOp topk = shape(KernelClass::Router, "topk-softmax", local, 0);
  topk.experts = moe.experts;
  topk.topk = moe.topK;
  addKernel(topk, "router-topk" + sfx, pass, moeLayers_, recompute);
  ComputeOp perm = shape(KernelClass::Permute, "permute", local, m.hidden);
  perm.topk = moe.topK;
  perm.experts = moe.experts;
  const uint32_t permute = addKernel(perm, "permute" + sfx, pass, moeLayers_, recompute);
  const uint64_t block = static_cast<uint64_t>(std::ceil(dbl(local * moe.topK * m.hidden) / r_.ep * load));
  uint32_t dispatch = UINT32_MAX, combine = UINT32_MAX;
  if (r_.ep > 1 && (!recompute || rerun("ep.dispatch")))
    dispatch = addComm("ep.dispatch" + sfx, Phase::Ep, CommKind::AllToAll, pass, CommTiming::Blocking, block,
                       w_.training.dtype, moeLayers_, epGroups_);
  // Megatron-LM's all-to-all dispatcher then all-gathers what the rank received over the expert tensor-parallel
  // group (and reduce-scatters the experts' output before the combine): every rank of the group computes its
  // columns for the group's tokens. These run on the compute stream, in the expert MLP's part of the layer.
  const uint64_t gathered = static_cast<uint64_t>(std::ceil(dbl(local * moe.topK * m.hidden) * load));
  const bool etp = r_.etp > 1 && (!recompute || rerun("etp.ag.dispatch"));
  if (etp)
    addComm("etp.ag.dispatch" + sfx, Phase::Tp, CommKind::AllGather, pass, CommTiming::Blocking, gathered,
            w_.training.dtype, moeLayers_, etpGroups_);
  const uint64_t upN = (m.gated() ? 2 : 1) * fe;
  const uint32_t up = addGemm("expert-up" + sfx, pass, rows, upN, m.hidden, expertsHere, moeLayers_, recompute);
  // One launch over the rows of every local expert.
  const uint32_t act = addKernel(shape(KernelClass::Activation, toString(m.activation), rows * expertsHere, upN),
                                 "expert-act" + sfx, pass, moeLayers_, recompute);
  const uint32_t down = addGemm("expert-down" + sfx, pass, rows, m.hidden, fe, expertsHere, moeLayers_, recompute);
  if (etp)
    addComm("etp.rs.combine" + sfx, Phase::Tp, CommKind::ReduceScatter, pass, CommTiming::Blocking, gathered,
            w_.training.dtype, moeLayers_, etpGroups_);
  if (r_.ep > 1 && (!recompute || rerun("ep.combine")))
    combine = addComm("ep.combine" + sfx, Phase::Ep, CommKind::AllToAll, pass, CommTiming::Blocking, block,
                      w_.training.dtype, moeLayers_, epGroups_);
  perm.kernel = "unpermute";
  const uint32_t unpermute = addKernel(perm, "unpermute" + sfx, pass, moeLayers_, recompute);
  // A recomputed forward keeps its layered kernels (its all-to-alls run again only under full recomputation).
  if (r_.ep > 1 && !recompute) addMoeBlock(pass, false, {permute, up, act, down, unpermute}, {dispatch, combine});
}

void StageBuilder::addMoeBlock(Pass pass, bool mirror, std::vector<uint32_t> compute, std::vector<uint32_t> comm) {
  const ModelShape& m = w_.model;
  const MoeSpec& moe = *m.moe;
  FusedBlock b;
  b.kind = FusedBlockKind::MoeFfn;
  b.pass = pass;
  b.mirror = mirror;
  for (uint32_t i : compute)
    if (i != UINT32_MAX) b.compute.push_back(i);
  for (uint32_t i : comm)
    if (i != UINT32_MAX) b.comm.push_back(i);
  b.times = moeLayers_;
  b.groups = epGroups_;
  b.tokens = tokens_ / r_.tp;
  b.experts = moe.experts / r_.ep;
  b.topk = moe.topK;
  b.hidden = m.hidden;
  b.ffn = (moe.ffn ? moe.ffn : m.ffn) / r_.etp;
  b.load = moe.routedLoad();
  if (r_.etp > 1)
    b.unfusable = "expert tensor parallelism (layout.etp " + std::to_string(r_.etp) +
                  ") splits each expert over ranks; moe-ffn runs whole experts";
  else if (m.activation != Activation::SwiGlu)
    b.unfusable = std::string("moe-ffn's expert FFN is SwiGLU; the model's activation is ") + toString(m.activation);
  out_.fusedBlocks.push_back(std::move(b));
}

void StageBuilder::addMoeBackward() {
  const CommOp* dispatch = nullptr;
  const CommOp* gather = nullptr;
  for (const CommOp& c : out_.comm) {
    if (c.name == "ep.dispatch") dispatch = &c;
    if (c.name == "etp.ag.dispatch") gather = &c;
  }
  // Copies: addComm grows out_.comm.
  const bool hasA2a = dispatch != nullptr, hasAg = gather != nullptr;
  const CommOp a2a = hasA2a ? *dispatch : CommOp{}, ag = hasAg ? *gather : CommOp{};
  uint32_t combine = UINT32_MAX, dispatchBack = UINT32_MAX;
  if (hasA2a)
    combine = addComm("ep.combine.bwd", Phase::Ep, CommKind::AllToAll, Pass::Backward, CommTiming::Blocking, a2a.count,
                      a2a.dtype, a2a.times, epGroups_);
  if (hasAg) {
    addComm("etp.ag.combine.bwd", Phase::Tp, CommKind::AllGather, Pass::Backward, CommTiming::Blocking, ag.count,
            ag.dtype, ag.times, etpGroups_);
    addComm("etp.rs.dispatch.bwd", Phase::Tp, CommKind::ReduceScatter, Pass::Backward, CommTiming::Blocking, ag.count,
            ag.dtype, ag.times, etpGroups_);
  }
  if (hasA2a)
    dispatchBack = addComm("ep.dispatch.bwd", Phase::Ep, CommKind::AllToAll, Pass::Backward, CommTiming::Blocking,
                           a2a.count, a2a.dtype, a2a.times, epGroups_);
  if (!hasA2a) return;
  // The backward kernels of the forward block (addBackward names them after their forward op).
  std::vector<uint32_t> compute;
  for (const char* name : {"permute.bwd", "expert-up.dgrad", "expert-up.wgrad", "expert-act.bwd", "expert-down.dgrad",
                           "expert-down.wgrad", "unpermute.bwd"})
    for (std::size_t i = 0; i < out_.compute.size(); ++i)
      if (out_.compute[i].name == name) compute.push_back(static_cast<uint32_t>(i));
  addMoeBlock(Pass::Backward, true, std::move(compute), {combine, dispatchBack});
}

}  // namespace mk::detail
