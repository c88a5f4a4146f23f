// mkernel — the lowering's transformer layers forward and backward and their tensor-parallel boundaries.
#include "lowering_internal.hpp"

#include <string>
#include <vector>

namespace mk::detail {

void StageBuilder::tpBoundary(const std::string& name, CommKind kind, Pass pass, uint32_t gemm, uint32_t times) {
  if (r_.tp == 1 || times == 0 || gemm == UINT32_MAX) return;  // UINT32_MAX: a GEMM not recomputed
  const uint64_t count = kind == CommKind::AllReduce ? tokens_ * w_.model.hidden : tokens_ * w_.model.hidden / r_.tp;
  const uint32_t c =
      addComm(name, Phase::Tp, kind, pass, CommTiming::Blocking, count, w_.training.dtype, times, tpGroups_);
  fuse(kind == CommKind::AllGather       ? FusedKind::AllGatherGemm
       : kind == CommKind::ReduceScatter ? FusedKind::GemmReduceScatter
                                         : FusedKind::GemmAllReduce,
       gemm, c);
}

void StageBuilder::addLayers(Pass pass, bool recompute) {
  const ModelShape& m = w_.model;
  const uint32_t L = out_.layers;
  const bool sp = w_.layout.sp;
  const std::string sfx = recompute ? ".recompute" : "";
  const uint64_t h = m.hidden;
  // Norms and residual adds see the sequence-parallel slice; replicated over tensor parallelism without it.
  const uint64_t slice = sp ? tokens_ / r_.tp : tokens_;
  const char* norm = m.gated() ? "rmsnorm" : "layernorm";
  if (out_.embedding && !recompute) {
    ComputeOp e = shape(KernelClass::Embedding, "embedding", tokens_, h);
    e.vocab = vocabLocal_;
    addKernel(e, "embedding", pass, 1, false);
  }
  addKernel(shape(KernelClass::Norm, norm, slice, h), "attn-norm" + sfx, pass, L, recompute);
  addProjections(pass, recompute, sfx);
  addAttention(pass, L - windowLayers_, recompute, false);
  addAttention(pass, windowLayers_, recompute, false, true);
  addContextParallel(true, pass, L, sfx);
  const uint32_t out = addGemm("attn-out" + sfx, pass, tokens_, h, attnOutK_, 1, L, recompute);
  tpBoundary((sp ? "tp.rs.attn-out" : "tp.ar.attn-out") + sfx, sp ? CommKind::ReduceScatter : CommKind::AllReduce, pass,
             out, L);
  addKernel(shape(KernelClass::Residual, "add", slice, h), "attn-residual" + sfx, pass, L, recompute);
  addKernel(shape(KernelClass::Norm, norm, slice, h), "mlp-norm" + sfx, pass, L, recompute);
  if (denseLayers_ > 0) {
    const uint64_t upN = (m.gated() ? 2 : 1) * ffnLocal_;
    const uint32_t up = addGemm("mlp-up" + sfx, pass, tokens_, upN, h, 1, denseLayers_, recompute);
    if (sp) tpBoundary("tp.ag.mlp-up" + sfx, CommKind::AllGather, pass, up, denseLayers_);
    addKernel(shape(KernelClass::Activation, toString(m.activation), tokens_, upN), "mlp-act" + sfx, pass, denseLayers_,
              recompute);
    const uint32_t down = addGemm("mlp-down" + sfx, pass, tokens_, h, ffnLocal_, 1, denseLayers_, recompute);
    tpBoundary((sp ? "tp.rs.mlp-down" : "tp.ar.mlp-down") + sfx, sp ? CommKind::ReduceScatter : CommKind::AllReduce,
               pass, down, denseLayers_);
  }
  if (moeLayers_ > 0) addMoe(pass, recompute, sfx);
  addKernel(shape(KernelClass::Residual, "add", slice, h), "mlp-residual" + sfx, pass, L, recompute);
  if (out_.head && !recompute) {
    addKernel(shape(KernelClass::Norm, norm, slice, h), "final-norm", pass, 1, false);
    const uint32_t head = addGemm("lm-head", pass, tokens_, vocabLocal_, h, 1, 1, false);
    if (sp) tpBoundary("tp.ag.lm-head", CommKind::AllGather, pass, head, 1);
    ComputeOp loss = shape(KernelClass::Loss, "cross-entropy", tokens_, 0);
    loss.vocab = vocabLocal_;
    addKernel(loss, "loss", pass, 1, false);
  }
}

void StageBuilder::addBackward() {
  const std::vector<ComputeOp> forward = out_.compute;  // forward ops only so far
  const bool sp = w_.layout.sp;
  for (const ComputeOp& f : forward) {
    if (f.kind == ComputeKind::Attention) {
      addAttention(Pass::Backward, f.times, false, true, f.name == "attention-swa");
      addContextParallel(false, Pass::Backward, f.times, "");
      continue;
    }
    if (f.cls == KernelClass::Cast) continue;  // the backward's casts come with its GEMMs
    if (f.kind == ComputeKind::Other) {
      // The residual's backward adds the two gradient paths; a permute's backward scatters rows back (an
      // unpermute's work) and an unpermute's gathers them (a permute's).
      ComputeOp b = f;
      if (f.cls == KernelClass::Permute) b.kernel = f.kernel == "permute" ? "unpermute" : "permute";
      addKernel(b, f.name + ".bwd", Pass::Backward, f.times, false, f.cls != KernelClass::Permute);
      continue;
    }
    const uint32_t dgrad =
        addGemm(f.name + ".dgrad", Pass::Backward, f.m, f.k, f.n, f.batch, f.times, false, f.linearLayer);
    addGemm(f.name + ".wgrad", Pass::Backward, f.k, f.n, f.m, f.batch, f.times, false, f.linearLayer);
    // Column-parallel GEMMs (qkv, mlp-up, lm-head) reduce their input gradient; row-parallel ones (attn-out,
    // mlp-down) gather their output gradient first.
    const bool column = isColumnInput(f.name) || f.name == "lm-head";
    const bool row = f.name == "attn-out" || f.name == "mlp-down" || f.name == "shared-down";
    if (column)
      tpBoundary((sp ? "tp.rs." : "tp.ar.") + f.name + ".dgrad", sp ? CommKind::ReduceScatter : CommKind::AllReduce,
                 Pass::Backward, dgrad, f.times);
    if (row && sp) tpBoundary("tp.ag." + f.name + ".dgrad", CommKind::AllGather, Pass::Backward, dgrad, f.times);
  }
  if (moeLayers_ > 0) addMoeBackward();
}

}  // namespace mk::detail
