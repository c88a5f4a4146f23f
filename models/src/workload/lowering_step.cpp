// mkernel — the lowering's pipeline sends, data-parallel gradient reduction (ZeRO's gathers) and the optimizer
// step's kernels.
#include "lowering_internal.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/workload/model_shape.hpp"

namespace mk::detail {

void StageBuilder::addPipeline() {
  if (r_.pp == 1) return;
  // A middle stage receives and sends one activation (forward) and one gradient (backward) per micro-batch and
  // model chunk: T x h / t elements each (the sequence-parallel slice, or Megatron's scatter-gather of it).
  const uint64_t count = tokens_ * w_.model.hidden / r_.tp;
  addComm("pp.send", Phase::Pp, CommKind::SendRecv, Pass::Forward, CommTiming::Blocking, count, w_.training.dtype,
          r_.virtualStages, ppGroups_);
  addComm("pp.send.bwd", Phase::Pp, CommKind::SendRecv, Pass::Backward, CommTiming::Blocking, count, w_.training.dtype,
          r_.virtualStages, ppGroups_);
}

void StageBuilder::bucketed(const char* prefix, double params, uint32_t groupSize, uint32_t groups) {
  const ParallelLayout& l = w_.layout;
  if (groupSize <= 1 || params <= 0) return;
  const DType grad = l.gradDtype;
  const uint64_t elems = static_cast<uint64_t>(std::ceil(params));
  const uint64_t n = std::max<uint64_t>(1, ceilDiv(elems * dtypeSize(grad), l.bucketBytes));
  // CommOp::times is 32 bits: more buckets would wrap into a wrong (small) gradient reduction.
  if (n > UINT32_MAX)
    throw Error(ErrorCode::InvalidArgument, std::string(prefix) + " gradients need " + std::to_string(n) +
                                                " buckets of layout.bucketMiB per step, more than 4294967295; use "
                                                "larger buckets (--bucket) or a smaller model");
  const uint64_t perBucket = ceilDiv(elems, n);
  const uint32_t times = static_cast<uint32_t>(n);
  const std::string p = prefix;
  if (l.zero == 0) {
    addComm(p + ".ar", Phase::Dp, CommKind::AllReduce, Pass::Backward, CommTiming::GradBucket, perBucket, grad, times,
            groups);
    return;
  }
  const uint64_t shard = ceilDiv(perBucket, groupSize);
  addComm(p + ".rs", Phase::Dp, CommKind::ReduceScatter, Pass::Backward, CommTiming::GradBucket, shard, grad, times,
          groups);
  addComm(p + ".ag", Phase::Dp, CommKind::AllGather, Pass::Forward, CommTiming::ParamGather, shard, w_.training.dtype,
          times, groups);
}

void StageBuilder::perLayer(const char* prefix, double layerParams, uint32_t layers, uint32_t groupSize,
                            uint32_t groups) {
  if (groupSize <= 1 || layerParams <= 0 || layers == 0) return;
  const uint64_t shard = ceilDiv(static_cast<uint64_t>(std::ceil(layerParams)), groupSize);
  const std::string p = prefix;
  const DType dt = w_.training.dtype;
  addComm(p + ".ag", Phase::Dp, CommKind::AllGather, Pass::Forward, CommTiming::LayerPrefetch, shard, dt, layers,
          groups);
  addComm(p + ".ag.bwd", Phase::Dp, CommKind::AllGather, Pass::Backward, CommTiming::LayerPrefetch, shard, dt, layers,
          groups);
  addComm(p + ".rs", Phase::Dp, CommKind::ReduceScatter, Pass::Backward, CommTiming::LayerPrefetch, shard,
          w_.layout.gradDtype, layers, groups);
}

void StageBuilder::addDataParallel() {
  const ModelShape& m = w_.model;
  const double h = static_cast<double>(m.hidden);
  const LayerParams lp = layerParams(m, r_.tp);  // model_shape.cpp counts every part
  const double attn = lp.attention, norms = lp.norms, mlp = lp.mlp;
  const double vocabRows = static_cast<double>(vocabLocal_) * h;
  const double perDenseLayer = attn + norms + mlp;
  const double perMoeLayerDense = attn + norms + lp.router + lp.shared;
  double dense = denseLayers_ * perDenseLayer + moeLayers_ * perMoeLayerDense;
  if (out_.embedding) dense += vocabRows;
  // The output projection (unless tied to an embedding on the same stage: one matrix) and the final norm. Tied
  // embeddings on different stages are two copies, as Megatron-LM keeps them.
  if (out_.head) dense += (m.tiedEmbeddings && out_.embedding ? 0 : vocabRows) + h;
  double expertPerLayer = 0;
  // Expert tensor parallelism: each rank holds 1 / etp of each of its experts.
  if (m.moe) expertPerLayer = static_cast<double>(m.moe->experts / r_.ep) * lp.expert / r_.etp;
  out_.denseParams = dense;
  out_.expertParams = expertPerLayer * moeLayers_;
  // ZeRO 3's unit of gathering: one layer (its local experts included), or the embedding and head together.
  const double unitExtra = (out_.embedding ? vocabRows : 0) + (out_.head ? vocabRows + h : 0);
  out_.gatheredParams =
      std::max({denseLayers_ ? perDenseLayer : 0.0, moeLayers_ ? perMoeLayerDense + expertPerLayer : 0.0, unitExtra});
  if (w_.training.fp8)
    out_.fp8DenseParams =
        denseLayers_ * (attn - lp.latentNorms + mlp) + moeLayers_ * (attn - lp.latentNorms + lp.shared);
  // Megatron-LM reduces (and ZeRO shards) the dense gradients over the dp x cp ranks of a TP index, the expert
  // gradients over the expert data-parallel group.
  const uint32_t dpSize = r_.dp * r_.cp, edpSize = r_.edp;
  if (w_.layout.zero == 3) {
    // Layers (and the embedding / head, gathered like one more layer) one after the other.
    const double extra = (out_.embedding ? vocabRows : 0) + (out_.head ? vocabRows + h : 0);
    // Dense and MoE layers gathered as equal units of their mean size.
    const double meanLayer = (denseLayers_ * perDenseLayer + moeLayers_ * perMoeLayerDense) / out_.layers;
    perLayer("dp.layer", meanLayer, out_.layers, dpSize, dpGroups_);
    perLayer("dp.embedding", extra, extra > 0 ? 1 : 0, dpSize, dpGroups_);
    perLayer("edp.layer", expertPerLayer, moeLayers_, edpSize, edpGroups_);
    return;
  }
  bucketed("dp", out_.denseParams, dpSize, dpGroups_);
  bucketed("edp", out_.expertParams, edpSize, edpGroups_);
}

void StageBuilder::addStepKernels() {
  const bool sharded = w_.layout.zero > 0;
  const double dense = sharded ? std::ceil(out_.denseParams / (r_.dp * r_.cp)) : out_.denseParams;
  const double expert = sharded ? std::ceil(out_.expertParams / r_.edp) : out_.expertParams;
  ComputeOp p;
  p.cls = KernelClass::Optimizer;
  p.kernel = "adam";
  p.dtype = DType::Float32;
  p.params = static_cast<uint64_t>(std::ceil(dense + expert));
  addKernel(p, "adam", Pass::Step, 1, false);
  // Mixed precision keeps fp32 master weights: after the step each updated master is copied into the model's
  // 16-bit parameter (Megatron-LM's _copy_main_params_to_model_params), and the fp32 main-gradient buffer the
  // next step accumulates into is zeroed (zero_grad_buffer): over the local buffer, which ZeRO 2 and 3 shard.
  // Training in float32 keeps no masters and no separate buffer: neither kernel runs.
  if (elemBytes_ < 4) {
    p.kernel = "param-copy";
    addKernel(p, "param-copy", Pass::Step, 1, false);
    ComputeOp z = p;
    z.kernel = "zero-grad";
    z.params =
        static_cast<uint64_t>(std::ceil(w_.layout.zero >= 2 ? dense + expert : out_.denseParams + out_.expertParams));
    addKernel(z, "zero-grad", Pass::Step, 1, false);
  }
  addGradAccum();
  p.cls = KernelClass::GradNorm;
  p.kernel = "grad-norm";
  addKernel(p, "grad-norm", Pass::Step, 1, false);
  // FP8 weights: cast once per step, not per micro-batch. Megatron-LM tells Transformer Engine which
  // micro-batch is the step's first (is_first_microbatch); TE casts the weights then and reuses the FP8 copy
  // (and its transpose, written by the same kernel) for the other micro-batches: the weights only change at
  // the optimizer step.
  const std::vector<ComputeOp> ops = out_.compute;
  for (const ComputeOp& g : ops)
    if (g.cls == KernelClass::Gemm && g.fp8 && g.pass == Pass::Forward && !g.recompute)
      addCast(g.name + ".weight", Pass::Step, dbl(g.k) * dbl(g.n) * dbl(g.batch), g.times, false);
}

void StageBuilder::addGradAccum() {
  if (elemBytes_ >= 4) return;
  const ModelShape& m = w_.model;
  const double h = dbl(m.hidden);
  double params = out_.denseParams + out_.expertParams;
  if (w_.training.gradAccumFusion) {
    const LayerParams lp = layerParams(m, r_.tp);
    params = dbl(out_.layers) * (lp.norms + lp.latentNorms) + dbl(moeLayers_) * lp.router;
    if (out_.embedding) params += dbl(vocabLocal_) * h;
    if (out_.head) params += h;
  }
  ComputeOp a;
  a.cls = KernelClass::Optimizer;
  a.kernel = "grad-accum";
  a.dtype = DType::Float32;
  a.params = static_cast<uint64_t>(std::ceil(params));
  addKernel(a, "grad-accum", Pass::Backward, 1, false);
}

}  // namespace mk::detail
