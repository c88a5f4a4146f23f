// mkernel — per-GPU memory of a training step (memory.hpp).
#include "mk/workload/memory.hpp"

#include <algorithm>

#include "mk/workload/model_shape.hpp"

namespace mk {

namespace {

double dbl(uint64_t v) { return static_cast<double>(v); }

}  // namespace

LayerActivations layerActivations(const Workload& w, const ResolvedLayout& r) {
  const ModelShape& m = w.model;
  const ParallelLayout& l = w.layout;
  const TrainingSpec& tr = w.training;
  // Context parallelism: each rank holds seq / cp tokens of every activation.
  const double t = r.tp, tokens = dbl(tr.seq) / r.cp * tr.microBatch, h = dbl(m.hidden);
  // The sequence-parallel region (norms, residual stream, the GEMM inputs before their all-gather) holds tokens / t
  // rows with sequence parallelism and is replicated over tensor parallelism without it.
  const double slice = l.sp ? tokens / t : tokens;
  LayerActivations out;
  if (tr.recompute == Recompute::Full) {
    out.dense = out.moe = 2 * h * slice;  // the layer input: the bf16 residual stream, FP8 or not
    return out;
  }
  // e: bytes of a saved FP8 GEMM input (Transformer Engine keeps them in FP8 for the weight gradient).
  const double e = tr.fp8 ? 1.0 : 2.0;
  const double gated = m.gated() ? 2.0 : 1.0;
  // Attention. Sequence-parallel region per token: the norm's input (2 h), its output, the input of the qkv GEMM (or
  // of MLA's down-projections; e h) and the dropout mask after attention (h, one byte). Per head of the rank: Q, K,
  // V kept by the attention kernel (2 bytes) and its output, the attn-out GEMM's input (e): Korthikanti's
  // 2 s b h (Q, K) + 2 s b h (V) + 2 s b h with heads x head dims in place of h; the scores (5 a s^2 b) are never
  // stored by a FlashAttention-style kernel, which keeps O(s) per layer with or without a sliding window.
  const double a = dbl(m.heads / r.tp), g = dbl(std::max<uint64_t>(1, m.kvHeads / r.tp));
  double dqk = dbl(m.headDim()), dv = dqk, kv = g, latents = 0;
  if (m.mla) {
    // MLA materialises per-head keys (the nope part from the kv latent, the shared rope head broadcast) and values;
    // its latents are computed on every token by the down-projections replicated over TP: each latent's norm
    // input (2 bytes) and output, the up-projection's input (e).
    dqk = dbl(m.mla->qkNopeHeadDim + m.mla->qkRopeHeadDim);
    dv = dbl(m.mla->vHeadDim);
    kv = a;
    latents = (2 + e) * dbl(m.mla->qLoraRank + m.mla->kvLoraRank);
  }
  const double attention = slice * (3 + e) * h + tokens * (2 * (a * dqk + kv * dqk + kv * dv) + e * a * dv + latents);
  // A dense MLP. Sequence-parallel region: the norm's input, the mlp-up input (e h), the dropout mask (h). Per
  // column of the rank: the activation's input (2 bytes, gate and up when gated) and output, the mlp-down input
  // (e). Korthikanti's 19 s b h (ffn 4 h, not gated) with the model's ffn.
  const double f = dbl(m.ffn / r.tp);
  const double mlpActivation = tokens * (2 * gated * f + e * f);
  out.dense = attention + slice * (3 + e) * h + mlpActivation;
  // Selective recomputation (Korthikanti et al., Table 2, per module; docs/planner.md, "Recomputation"): norms
  // drops the two norm outputs, mlp the dense MLP's activation input and output, moe_act the experts' activation
  // output; core_attn nothing (the scores it would drop are never stored).
  const RecomputeModules& rm = tr.recomputeModules;
  const bool selective = tr.recompute == Recompute::Selective;
  if (selective && rm.norms) out.dense -= 2 * e * h * slice;
  if (selective && rm.mlp) out.dense -= mlpActivation;
  if (!m.moe) return out;

  // A MoE layer. Sequence-parallel region: the norm's input, its output (the router's bf16 input, which the shared
  // experts read too; FP8 adds their up GEMM's FP8 copy), the dropout mask.
  const MoeSpec& moe = *m.moe;
  const LayerParams lp = layerParams(m, r.tp);
  const double shared = lp.shared / ((m.gated() ? 3.0 : 2.0) * h);  // the shared experts' columns on this rank
  const double normOut = (2 + (tr.fp8 && shared > 0 ? 1.0 : 0.0)) * h;
  double moeBytes = attention + slice * (3 * h + normOut) + tokens * (2 * gated * shared + e * shared);
  // Each tensor-parallel rank routes its sequence slice (the lowering's rule): the router's fp32 softmax over the
  // experts per token; the rows this rank's experts receive (the busiest rank's: routedLoad() x the balanced
  // share, gathered over the expert tensor-parallel group) keep the expert-up input (e h), the activation's input
  // (2 bytes) and output (e) at f_e / etp columns; the rank's own topK rows returned by the combine are kept by
  // the unpermute that weighs them with the routing probabilities (2 h, for the probabilities' gradient).
  const double routed = tokens / t;
  const double rows = routed * moe.topK * r.etp * moe.routedLoad();
  const double fe = dbl((moe.ffn ? moe.ffn : m.ffn) / r.etp);
  moeBytes += routed * 4 * moe.experts + rows * (e * h + 2 * gated * fe + e * fe) + routed * moe.topK * 2 * h;
  if (selective && rm.norms) moeBytes -= (e * h + normOut) * slice;
  if (selective && rm.moeAct) moeBytes -= rows * e * fe;
  out.moe = moeBytes;
  return out;
}

MemoryEstimate estimateMemory(const Workload& w, const StepLowering& step) {
  const ResolvedLayout& r = step.layout;
  const ParallelLayout& l = w.layout;
  const LayerActivations perLayer = layerActivations(w, r);
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
    e.activations = (perLayer.dense * (st.layers - st.moeLayers) + perLayer.moe * st.moeLayers) * e.inFlight;
    if (first || e.total() > best.total()) best = e;
    first = false;
  }
  return best;
}

}  // namespace mk
