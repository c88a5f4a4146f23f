// mkernel — per-GPU memory of a training step (memory.hpp).
#include "mk/workload/memory.hpp"

#include <algorithm>

namespace mk {

MemoryEstimate estimateMemory(const Workload& w, const StepLowering& step) {
  const ResolvedLayout& r = step.layout;
  const ParallelLayout& l = w.layout;
  // Context parallelism: each rank holds seq / cp tokens of every activation.
  const double s = static_cast<double>(w.training.seq) / static_cast<double>(r.cp);
  const double b = static_cast<double>(w.training.microBatch);
  const double h = static_cast<double>(w.model.hidden);
  const double t = static_cast<double>(r.tp);
  double perLayer = 0;  // bytes of one layer's activations for one micro-batch (16-bit activations)
  if (w.training.recompute == Recompute::Full) {
    perLayer = 2 * s * b * h / (l.sp ? t : 1.0);  // the layer input: the bf16 residual stream, FP8 or not
  } else if (w.training.fp8) {
    // Transformer Engine saves the inputs of its FP8 GEMMs for the weight gradient in FP8: one byte instead of
    // two for the qkv and mlp-up inputs (2 s b h each, replicated without sequence parallelism), the attn-out
    // input (2 s b h / t) and the mlp-down input (8 s b h / t): 10 + 24 / t becomes 8 + 19 / t.
    perLayer = l.sp ? 27 * s * b * h / t : s * b * h * (8 + 19 / t);
  } else {
    perLayer = l.sp ? 34 * s * b * h / t : s * b * h * (10 + 24 / t);
  }
  // Selective recomputation: the activations of the chosen modules are not kept (Korthikanti et al., Table 2, per
  // module; docs/planner.md, "Recomputation"), per s b h: norms their two outputs, the qkv and mlp-up inputs (2 e,
  // replicated over tp without sequence parallelism); mlp the activation's input and output, 8 + 4 e over t, on
  // dense layers; moe_act the activation's output, 4 e / t, on MoE layers; core_attn nothing (the attention scores
  // Korthikanti's selective recomputation drops are never stored by a FlashAttention-style kernel). e = 2 bytes,
  // 1 with FP8 (the GEMM inputs kept in FP8).
  double denseSaved = 0, moeSaved = 0;
  if (w.training.recompute == Recompute::Selective) {
    const RecomputeModules& rm = w.training.recomputeModules;
    const double e = w.training.fp8 ? 1.0 : 2.0, sbh = s * b * h;
    const double norms = rm.norms ? 2 * e * sbh / (l.sp ? t : 1.0) : 0;
    denseSaved = norms + (rm.mlp ? (8 + 4 * e) * sbh / t : 0);
    moeSaved = norms + (rm.moeAct ? 4 * e * sbh / t : 0);
  }
  const double m = r.microBatches, p = r.pp, v = r.virtualStages;
  // 1F1B: stage s runs p - s forward passes before its first backward and holds their activations; the
  // interleaved schedule holds (1 + (p - 1) / (p v)) times more on the first stage (Narayanan et al., SC'21);
  // GPipe holds every micro-batch.
  auto inFlightOf = [&](double stage) {
    if (l.schedule == PipelineSchedule::GPipe) return m;
    const double base = std::min(m, p - stage);
    return l.schedule == PipelineSchedule::Interleaved ? base * (1 + (p - 1) / (p * v)) : base;
  };

  // ZeRO shards the dense state over the dp x cp ranks (Megatron's DP x CP group), the experts' over edp.
  const double dp = static_cast<double>(r.dp) * r.cp, edp = static_cast<double>(r.edp);
  const double wBytes = static_cast<double>(dtypeSize(w.training.dtype));
  const double gBytes = static_cast<double>(dtypeSize(l.gradDtype));
  MemoryEstimate best;
  bool first = true;
  for (const StageLowering& st : step.stages) {
    MemoryEstimate e;
    e.stage = st.stage;
    const double dense = st.denseParams, expert = st.expertParams;
    const double all = dense + expert;
    e.weights = l.zero == 3 ? wBytes * (dense / dp + expert / edp) : wBytes * all;
    // FP8: the one-byte copy of every FP8 GEMM's weight that Transformer Engine keeps for the step (sharded like
    // the weights under ZeRO 3).
    if (w.training.fp8) {
      const double fp8Dense = st.fp8DenseParams;
      e.weights += l.zero == 3 ? fp8Dense / dp + expert / edp : fp8Dense + expert;
    }
    e.gradients = l.zero >= 2 ? gBytes * (dense / dp + expert / edp) : gBytes * all;
    e.optimizer = l.zero >= 1 ? 12 * (dense / dp + expert / edp) : 12 * all;
    // ZeRO 3 (FSDP): the unit being computed and the next one prefetched are held whole, and in the backward pass
    // one unit's whole gradient until its reduce-scatter.
    if (l.zero == 3) {
      e.weights += 2 * wBytes * st.gatheredParams;
      e.gradients += gBytes * st.gatheredParams;
    }
    e.inFlight = inFlightOf(st.stage);
    e.activations =
        ((perLayer - denseSaved) * (st.layers - st.moeLayers) + (perLayer - moeSaved) * st.moeLayers) * e.inFlight;
    if (first || e.total() > best.total()) best = e;
    first = false;
  }
  return best;
}

}  // namespace mk
