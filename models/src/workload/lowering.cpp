// mkernel — a training step lowered to per-GPU GEMMs, attention kernels and collectives (lowering.hpp; the
// formulas are in docs/planner.md).
#include "mk/workload/lowering.hpp"

#include <algorithm>
#include <cmath>

#include "lowering_groups.hpp"
#include "mk/error.hpp"
#include "mk/workload/model_shape.hpp"

namespace mk {

namespace {

uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
double dbl(uint64_t v) { return static_cast<double>(v); }

/// Everything one stage's lowering needs, computed once.
class StageBuilder {
 public:
  StageBuilder(const Workload& w, const ResolvedLayout& r, uint32_t stage) : w_(w), r_(r) {
    const ModelShape& m = w.model;
    out_.stage = stage;
    out_.layers = r.stageLayers.at(stage);
    out_.embedding = stage == 0;
    out_.head = stage + 1 == r.pp;
    tokens_ = uint64_t{w.training.microBatch} * w.training.seq / r.cp;  // the rank's share of each sequence
    d_ = m.headDim();
    kvLocal_ = std::max<uint64_t>(1, m.kvHeads / r.tp);
    qkvN_ = (m.heads / r.tp + 2 * kvLocal_) * d_;
    dqk_ = m.mla ? m.mla->qkNopeHeadDim + m.mla->qkRopeHeadDim : d_;
    dv_ = m.mla ? m.mla->vHeadDim : d_;
    if (m.mla) d_ = (dqk_ + dv_) / 2;  // the mean of K's and V's head dims: what context parallelism exchanges
    attnOutK_ = (m.heads / r.tp) * dv_;
    ffnLocal_ = m.ffn / r.tp;
    // Which of the stage's layers are MoE or windowed follows their index in the whole model.
    uint32_t firstLayer = 0;
    for (uint32_t s = 0; s < stage; ++s) firstLayer += r.stageLayers[s];
    for (uint32_t i = firstLayer; i < firstLayer + out_.layers; ++i) {
      moeLayers_ += isMoeLayer(m, i) ? 1 : 0;
      windowLayers_ += isWindowedLayer(m, i) ? 1 : 0;
    }
    denseLayers_ = out_.layers - moeLayers_;
    out_.moeLayers = moeLayers_;
    vocabLocal_ = paddedVocab(m, r.tp) / r.tp;
    elemBytes_ = static_cast<double>(dtypeSize(w.training.dtype));
  }

  StageLowering build() {
    addGroups();
    addLayers(Pass::Forward, false);
    addBackward();
    if (w_.training.recompute != Recompute::None) addLayers(Pass::Backward, true);
    addPipeline();
    addDataParallel();
    addStepKernels();
    return std::move(out_);
  }

 private:
  // ---- groups ---------------------------------------------------------------------------------------------

  uint32_t group(GroupSet g) {
    out_.groups.push_back(std::move(g));
    return static_cast<uint32_t>(out_.groups.size() - 1);
  }

  void addGroups() {
    detail::StageGroups g = detail::stageGroups(r_, out_.stage, detail::cpA2aRanks(w_.layout));
    tpGroups_ = group(std::move(g.tp));
    dpGroups_ = group(std::move(g.dp));
    epGroups_ = group(std::move(g.ep));
    edpGroups_ = group(std::move(g.edp));
    ppGroups_ = group(std::move(g.pp));
    if (r_.cp > 1) {
      cpGroups_ = group(std::move(g.cp));
      if (!g.cpRing.instances.empty()) cpRingGroups_ = group(std::move(g.cpRing));
    }
  }

  /// Context parallelism's exchanges around the attention of `times` layers (layout.cpCommType): the forward
  /// attention's (`forward`; a recomputed attention runs them again in the backward pass) or its backward's.
  void addContextParallel(bool forward, Pass pass, uint32_t times, const std::string& sfx) {
    // Called right after the attention: a recomputation that does not run the attention again needs no K/V.
    if (out_.compute.empty() || out_.compute.back().kind != ComputeKind::Attention) return;
    const uint64_t q = w_.model.heads / r_.tp;
    for (const detail::CpExchange& x : detail::cpExchanges(w_.layout, tokens_, q, kvLocal_, d_)) {
      if ((x.pass == Pass::Forward) != forward) continue;
      addComm(x.name + sfx, Phase::Cp, x.kind, pass, x.timing, x.count, w_.training.dtype, times * x.perLayer,
              x.ring ? cpRingGroups_ : cpGroups_);
    }
  }

  // ---- compute --------------------------------------------------------------------------------------------

  uint32_t addGemm(const std::string& name, Pass pass, uint64_t m, uint64_t n, uint64_t k, uint64_t batch,
                   uint32_t times, bool recompute) {
    if (recompute && !rerun(name)) return UINT32_MAX;
    ComputeOp op;
    op.name = name;
    op.kind = ComputeKind::Gemm;
    op.cls = KernelClass::Gemm;
    op.kernel = name;
    op.pass = pass;
    op.dtype = w_.training.dtype;
    op.fp8 = fp8Gemm(name);
    op.m = m;
    op.n = n;
    op.k = k;
    op.batch = batch;
    op.flops =
        2.0 * static_cast<double>(m) * static_cast<double>(n) * static_cast<double>(k) * static_cast<double>(batch);
    const bool wgrad = name.size() > 6 && name.compare(name.size() - 6, 6, ".wgrad") == 0;
    // FP8: one-byte operands, the output in bf16 (Transformer Engine's GEMMs). A linear layer's weight-gradient
    // GEMM under gradient-accumulation fusion adds into the fp32 main gradient: its output is read and written in
    // fp32. The router is no such layer (Megatron-LM's router calls F.linear; addGradAccum adds its gradient).
    const double in = op.fp8 ? 1.0 : elemBytes_;
    op.accumulateFp32 = wgrad && fusedGradAccum() && name != "router.wgrad";
    const double outBytes = op.accumulateFp32 ? 8.0 : elemBytes_;
    op.bytes = dbl(batch) * (in * (dbl(m) * dbl(k) + dbl(k) * dbl(n)) + outBytes * dbl(m) * dbl(n));
    op.times = times;
    op.recompute = recompute;
    out_.compute.push_back(op);
    const uint32_t idx = static_cast<uint32_t>(out_.compute.size() - 1);
    // The A operand of a forward or data-gradient GEMM (the activation, the output gradient) is cast to FP8
    // per micro-batch, after an amax for its per-tensor scale; the weight-gradient GEMM reuses both casts (the
    // input saved in FP8, the output gradient's transposed copy from the same cast), the weights are cast once per
    // step (addStepKernels).
    if (op.fp8 && !wgrad) addCast(name, pass, dbl(m) * dbl(k) * dbl(batch) / spGathered(name), times, recompute);
    return idx;
  }

  /// t where a GEMM's A operand arrives through a sequence-parallel all-gather (the column-parallel forward
  /// inputs, the row-parallel output gradients), 1 elsewhere: Transformer Engine casts the rank's sequence slice
  /// before the all-gather, so each rank casts T / t rows.
  double spGathered(const std::string& name) const {
    if (!w_.layout.sp || r_.tp == 1) return 1;
    const std::string base = name.substr(0, name.find('.'));
    const bool dgrad = name.find(".dgrad") != std::string::npos;
    return (!dgrad && isColumnInput(base)) || (dgrad && (base == "attn-out" || base == "mlp-down"))
               ? static_cast<double>(r_.tp)
               : 1;
  }

  /// training.dtype fp8: the GEMMs Transformer Engine runs in FP8 (Megatron-LM's FP8 recipe): every linear
  /// layer of attention, the MLP and the experts; the LM head and the MoE router stay in bf16.
  bool fp8Gemm(const std::string& name) const {
    if (!w_.training.fp8) return false;
    const std::string base = name.substr(0, name.find('.'));
    return base != "lm-head" && base != "router";
  }

  /// amax (per-tensor scale) then cast-fp8 of `elements` bf16 values, `times` per micro-batch (Step: per step).
  void addCast(const std::string& prefix, Pass pass, double elements, uint32_t times, bool recompute) {
    ComputeOp a;
    a.cls = KernelClass::Cast;
    a.kernel = "amax";
    a.elements = static_cast<uint64_t>(elements);
    addKernel(a, prefix + ".amax", pass, times, recompute);
    a.kernel = "cast-fp8";
    a.fp8 = true;
    addKernel(a, prefix + ".cast", pass, times, recompute);
  }

  /// Causal attention of one micro-batch on this rank's heads: QK^T and PV per (sequence, head), half of each
  /// computed under the causal mask; Q, K, V, O and the fp32 log-sum-exp read or written once (the scores never
  /// reach HBM; K and V have the rank's key-value heads).
  /// `windowed`: the layers of model.slidingWindow, whose queries see at most that many keys (causalKeys).
  void addAttention(Pass pass, uint32_t times, bool recompute, bool backward, bool windowed = false) {
    if (times == 0 || (recompute && !rerun("attention"))) return;
    // Context parallelism: a Ulysses all-to-all over a ranks leaves each rank all of a group's tokens for 1 / a of
    // its heads; a ring (p2p, all-gather) of the remaining cp / a ranks leaves it s / ring query rows against all
    // s keys, 1 / ring of the causal work with zigzag load balancing (each rank holds chunks i and 2 ring - 1 - i),
    // and reads every K/V block once.
    const uint64_t s = w_.training.seq;
    const uint64_t a = detail::cpA2aRanks(w_.layout), ring = r_.cp / a;
    const uint64_t heads = w_.model.heads / r_.tp / a, kv = std::max<uint64_t>(1, kvLocal_ / a);
    const uint64_t rowsQ = s / ring;
    const uint64_t batch = uint64_t{w_.training.microBatch} * heads;
    const uint64_t window = windowed ? w_.model.slidingWindow : 0;
    ComputeOp op;
    op.name = std::string(windowed ? "attention-swa" : "attention") + (backward    ? ".bwd"
                                                                       : recompute ? ".recompute"
                                                                                   : "");
    op.kind = ComputeKind::Attention;
    op.cls = KernelClass::Attention;
    op.kernel = backward ? "attention.bwd" : "attention";
    op.pass = pass;
    op.dtype = w_.training.dtype;
    op.m = rowsQ;
    op.n = window ? std::min(s, window) : s;  // the keys one query sees
    op.k = dqk_;
    op.batch = batch;
    op.seqs = w_.training.microBatch;
    op.seq = s;
    op.heads = heads;
    op.kvHeads = kv;
    op.headDim = dqk_;
    op.causal = true;
    // QK^T over dqk and PV over dv dimensions for the keys each query sees (s / 2 on average without a window).
    const double keysPerQuery = causalKeys(s, window) / dbl(s);
    const double fwdFlops = 2.0 * dbl(dqk_ + dv_) * dbl(rowsQ) * keysPerQuery * dbl(batch);
    const double rows = dbl(op.seqs) * dbl(rowsQ);
    const double qo = rows * dbl(heads) * dbl(dqk_ + dv_) / 2 * elemBytes_;
    const double kvBytes = dbl(op.seqs) * dbl(s) * dbl(kv) * dbl(dqk_ + dv_) / 2 * elemBytes_;
    const double lse = rows * dbl(heads) * 4;
    // FlashAttention's backward runs five of these matrix products (QK^T again, dV, dP, dQ, dK) against two
    // forward; it reads Q, K, V, O, dO and the log-sum-exp and writes dQ, dK, dV.
    op.flops = backward ? 2.5 * fwdFlops : fwdFlops;
    op.bytes = backward ? 4.0 * qo + 4.0 * kvBytes + lse : 2.0 * qo + 2.0 * kvBytes + lse;
    op.times = times;
    op.recompute = recompute;
    out_.compute.push_back(op);
  }

  /// FLOPs and HBM bytes of one launch of a non-GEMM kernel from its class, kernel and shape (docs/planner.md,
  /// "Kernel census"; the same formulas as validation/tools/kernel_bench.py). `grad`: the kernel's backward.
  /// e = the activations' element size; statistics, indices and routing weights are fp32 / int64 as the
  /// frameworks keep them.
  void kernelCost(ComputeOp& op, bool grad) const {
    const double e = elemBytes_, t = dbl(op.tokens), h = dbl(op.hidden), v = dbl(op.vocab);
    switch (op.cls) {
      case KernelClass::Norm: {
        const bool ln = op.kernel == "layernorm";
        const double affine = ln ? 2 : 1, stats = t * 4 * (ln ? 2 : 1);  // weight (and bias); rstd (and mean)
        op.flops = (grad ? 8 : 5) * t * h;
        op.bytes = grad ? 3 * e * t * h + 2 * e * affine * h + stats : 2 * e * t * h + e * affine * h + stats;
        return;
      }
      case KernelClass::Activation:
        if (op.kernel == "swiglu" || op.kernel == "geglu") {  // hidden = gate + up = 2 f
          const double f = h / 2;
          // geglu: gelu's 8 (12 backward) per gate element, and the product with up (2 more backward).
          op.flops = op.kernel == "swiglu" ? (grad ? 10 : 5) * t * f : (grad ? 14 : 9) * t * f;
          op.bytes = grad ? e * t * f + 2 * e * t * h : e * t * h + e * t * f;
        } else {
          // squared-relu: max and square (compare and two products backward); gelu: its tanh form.
          const bool sq = op.kernel == "squared-relu";
          op.flops = (grad ? (sq ? 3 : 12) : (sq ? 2 : 8)) * t * h;
          op.bytes = (grad ? 3 : 2) * e * t * h;
        }
        return;
      case KernelClass::Rotary:  // x in and out, cos and sin one row per token
        op.flops = 3 * t * dbl(op.heads) * dbl(op.headDim);
        op.bytes = 2 * e * t * dbl(op.heads) * dbl(op.headDim) + 2 * e * t * dbl(op.headDim);
        return;
      case KernelClass::Residual:
        op.flops = t * h;
        op.bytes = 3 * e * t * h;
        return;
      case KernelClass::Loss:  // logits; int64 labels, fp32 loss and log-sum-exp
        op.flops = (grad ? 3 : 4) * t * v;
        op.bytes = grad ? 2 * e * t * v + 12 * t : e * t * v + 16 * t;
        return;
      case KernelClass::Embedding:  // int64 ids; backward: a scatter-add into the rank's vocab x h gradient
        op.flops = grad ? t * h : 0;
        op.bytes = grad ? 8 * t + e * t * h + e * v * h : 8 * t + 2 * e * t * h;
        return;
      case KernelClass::Optimizer:
        if (op.kernel == "grad-accum") {  // a 16-bit gradient read, added into the fp32 main gradient
          op.flops = dbl(op.params);
          op.bytes = (e + 8) * dbl(op.params);
        } else if (op.kernel == "param-copy") {  // fp32 master read, the bf16 (model dtype) parameter written
          op.flops = dbl(op.params);
          op.bytes = (4 + e) * dbl(op.params);
        } else if (op.kernel == "zero-grad") {  // the fp32 main-gradient buffer set to zero
          op.flops = 0;
          op.bytes = 4 * dbl(op.params);
        } else {  // adam: fp32 param, grad, m, v read; param, m, v written
          op.flops = 12 * dbl(op.params);
          op.bytes = 28 * dbl(op.params);
        }
        return;
      case KernelClass::GradNorm:  // the norm reads every fp32 gradient, the clipping scale reads and writes them
        op.flops = 3 * dbl(op.params);
        op.bytes = 12 * dbl(op.params);
        return;
      case KernelClass::Cast:
        // amax reads the bf16 tensor; Transformer Engine's cast-transpose reads it and writes the fp8 copy and its
        // transpose (the layouts Hopper's FP8 GEMMs need).
        op.flops = dbl(op.elements);
        op.bytes = (op.kernel == "amax" ? 2 : 4) * dbl(op.elements);
        return;
      case KernelClass::Router: {  // logits in, fp32 weights and int64 indices of the top k out
        const double te = t * dbl(op.experts), tk = t * dbl(op.topk);
        op.flops = (grad ? 4 : 5) * te;
        op.bytes = grad ? 3 * e * te + 12 * tk : e * te + 12 * tk;
        return;
      }
      case KernelClass::Permute: {  // rows = tokens x top k; int32 row maps (and fp32 weights to unpermute)
        const double rows = t * dbl(op.topk);
        const bool un = op.kernel == "unpermute";
        op.flops = un ? 2 * rows * h : 0;
        op.bytes = un ? e * rows * h + e * t * h + 12 * rows : e * t * h + e * rows * h + 16 * rows;
        return;
      }
      case KernelClass::Gemm:
      case KernelClass::Attention: break;
    }
    throw Error(ErrorCode::Internal, "kernelCost: " + op.name + " is a GEMM or attention kernel");
  }

  /// A non-GEMM kernel from its shape (`proto`: class, kernel and shape fields set).
  uint32_t addKernel(ComputeOp op, const std::string& name, Pass pass, uint32_t times, bool recompute,
                     bool grad = false) {
    if (times == 0 || (recompute && !rerun(name))) return UINT32_MAX;
    op.name = name;
    op.kind = ComputeKind::Other;
    op.pass = pass;
    if (op.cls != KernelClass::Optimizer && op.cls != KernelClass::GradNorm) op.dtype = w_.training.dtype;
    op.times = times;
    op.recompute = recompute;
    kernelCost(op, grad);
    out_.compute.push_back(op);
    return static_cast<uint32_t>(out_.compute.size() - 1);
  }

  static ComputeOp shape(KernelClass cls, const char* kernel, uint64_t tokens, uint64_t hidden) {
    ComputeOp op;
    op.cls = cls;
    op.kernel = kernel;
    op.tokens = tokens;
    op.hidden = hidden;
    return op;
  }

  uint32_t addComm(const std::string& name, Phase phase, CommKind kind, Pass pass, CommTiming timing, uint64_t count,
                   DType dtype, uint32_t times, uint32_t groups) {
    CommOp op;
    op.name = name;
    op.phase = phase;
    op.kind = kind;
    op.pass = pass;
    op.timing = timing;
    op.count = count;
    op.dtype = dtype;
    op.times = times;
    op.groups = groups;
    out_.comm.push_back(op);
    return static_cast<uint32_t>(out_.comm.size() - 1);
  }

  void fuse(FusedKind kind, uint32_t compute, uint32_t comm) { out_.fused.push_back({kind, compute, comm}); }

  /// Whether the forward op `name` (a ".recompute" suffix ignored) runs again in the backward pass: every layer op
  /// under full recomputation; under selective, the ops of the chosen modules (Megatron-LM's --recompute-modules:
  /// core_attn the attention kernel, mlp the dense MLP with its TP collectives, moe_act the experts' activation,
  /// norms the two norms; docs/planner.md, "Recomputation").
  bool rerun(const std::string& name) const {
    const TrainingSpec& t = w_.training;
    if (t.recompute == Recompute::Full) return true;
    if (t.recompute == Recompute::None) return false;
    const std::string base = name.substr(0, name.find(".recompute"));
    const RecomputeModules& m = t.recomputeModules;
    if (base == "attention") return m.coreAttn;
    if (base == "expert-act") return m.moeAct;
    if (base == "attn-norm" || base == "mlp-norm") return m.norms;
    for (const char* op : {"mlp-up", "mlp-act", "mlp-down", "tp.ag.mlp-up", "tp.rs.mlp-down", "tp.ar.mlp-down"})
      if (base == op) return m.mlp;
    return false;
  }

  /// A tensor-parallel boundary next to GEMM `gemm`: all-gather before a column-parallel GEMM, reduce-scatter
  /// (sequence parallel) or all-reduce after a row-parallel one.
  void tpBoundary(const std::string& name, CommKind kind, Pass pass, uint32_t gemm, uint32_t times) {
    if (r_.tp == 1 || times == 0 || gemm == UINT32_MAX) return;  // UINT32_MAX: a GEMM not recomputed
    const uint64_t count = kind == CommKind::AllReduce ? tokens_ * w_.model.hidden : tokens_ * w_.model.hidden / r_.tp;
    const uint32_t c =
        addComm(name, Phase::Tp, kind, pass, CommTiming::Blocking, count, w_.training.dtype, times, tpGroups_);
    fuse(kind == CommKind::AllGather       ? FusedKind::AllGatherGemm
         : kind == CommKind::ReduceScatter ? FusedKind::GemmReduceScatter
                                           : FusedKind::GemmAllReduce,
         gemm, c);
  }

  /// The forward ops of this stage's layers (and embedding, head and loss); `recompute` marks them as a
  /// backward-pass re-run (Megatron-LM's full recomputation re-runs the transformer layers only).
  void addLayers(Pass pass, bool recompute) {
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
    tpBoundary((sp ? "tp.rs.attn-out" : "tp.ar.attn-out") + sfx, sp ? CommKind::ReduceScatter : CommKind::AllReduce,
               pass, out, L);
    addKernel(shape(KernelClass::Residual, "add", slice, h), "attn-residual" + sfx, pass, L, recompute);
    addKernel(shape(KernelClass::Norm, norm, slice, h), "mlp-norm" + sfx, pass, L, recompute);
    if (denseLayers_ > 0) {
      const uint64_t upN = (m.gated() ? 2 : 1) * ffnLocal_;
      const uint32_t up = addGemm("mlp-up" + sfx, pass, tokens_, upN, h, 1, denseLayers_, recompute);
      if (sp) tpBoundary("tp.ag.mlp-up" + sfx, CommKind::AllGather, pass, up, denseLayers_);
      addKernel(shape(KernelClass::Activation, toString(m.activation), tokens_, upN), "mlp-act" + sfx, pass,
                denseLayers_, recompute);
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

  /// The GEMMs whose input is the layer's (gathered) input, or whose input gradient is reduced over TP: the
  /// column-parallel projections. MLA's kv-down reads the same gathered input, but its input gradient is summed
  /// with q-down's (or q's) before the one reduction.
  static bool isColumnInput(const std::string& base) {
    return base == "qkv" || base == "mlp-up" || base == "q-down" || base == "q" || base == "shared-up";
  }

  /// Attention's input projections and rotary embedding: q, k and v in one GEMM, or MLA's (the down-projections
  /// to the latents replicated over TP, the up-projections and direct q split by heads; RMSNorm on each latent).
  void addProjections(Pass pass, bool recompute, const std::string& sfx) {
    const ModelShape& m = w_.model;
    const uint32_t L = out_.layers;
    const uint64_t h = m.hidden, heads = m.heads / r_.tp;
    ComputeOp rope = shape(KernelClass::Rotary, "rope", tokens_, 0);
    std::string first = "qkv";
    uint32_t firstGemm = 0;
    if (!m.mla) {
      firstGemm = addGemm("qkv" + sfx, pass, tokens_, qkvN_, h, 1, L, recompute);
      rope.heads = heads + kvLocal_;  // q and k heads of the rank, one launch
      rope.kvHeads = kvLocal_;
      rope.headDim = d_;
    } else {
      const MlaSpec& x = *m.mla;
      if (x.qLoraRank) {
        first = "q-down";
        firstGemm = addGemm("q-down" + sfx, pass, tokens_, x.qLoraRank, h, 1, L, recompute);
        addKernel(shape(KernelClass::Norm, "rmsnorm", tokens_, x.qLoraRank), "q-norm" + sfx, pass, L, recompute);
        addGemm("q-up" + sfx, pass, tokens_, heads * dqk_, x.qLoraRank, 1, L, recompute);
      } else {
        first = "q";
        firstGemm = addGemm("q" + sfx, pass, tokens_, heads * dqk_, h, 1, L, recompute);
      }
      addGemm("kv-down" + sfx, pass, tokens_, x.kvLoraRank + x.qkRopeHeadDim, h, 1, L, recompute);
      addKernel(shape(KernelClass::Norm, "rmsnorm", tokens_, x.kvLoraRank), "kv-norm" + sfx, pass, L, recompute);
      addGemm("kv-up" + sfx, pass, tokens_, heads * (x.qkNopeHeadDim + x.vHeadDim), x.kvLoraRank, 1, L, recompute);
      rope.heads = heads + 1;  // the rank's query heads and the one rope key head the heads share
      rope.kvHeads = 1;
      rope.headDim = x.qkRopeHeadDim;
    }
    if (w_.layout.sp) tpBoundary("tp.ag." + first + sfx, CommKind::AllGather, pass, firstGemm, L);
    addKernel(rope, "rope" + sfx, pass, L, recompute);
  }

  /// A MoE layer's shared experts: one MLP of sharedExperts x sharedFfn columns, split by TP like the dense MLP.
  void addSharedExperts(Pass pass, bool recompute, const std::string& sfx) {
    const ModelShape& m = w_.model;
    const double mats = m.gated() ? 3.0 : 2.0;
    const uint64_t width = static_cast<uint64_t>(layerParams(m, r_.tp).shared / (mats * dbl(m.hidden)));
    if (width == 0) return;
    const bool sp = w_.layout.sp;
    const uint64_t upN = (m.gated() ? 2 : 1) * width;
    const uint32_t up = addGemm("shared-up" + sfx, pass, tokens_, upN, m.hidden, 1, moeLayers_, recompute);
    if (sp) tpBoundary("tp.ag.shared-up" + sfx, CommKind::AllGather, pass, up, moeLayers_);
    addKernel(shape(KernelClass::Activation, toString(m.activation), tokens_, upN), "shared-act" + sfx, pass,
              moeLayers_, recompute);
    const uint32_t down = addGemm("shared-down" + sfx, pass, tokens_, m.hidden, width, 1, moeLayers_, recompute);
    tpBoundary((sp ? "tp.rs.shared-down" : "tp.ar.shared-down") + sfx,
               sp ? CommKind::ReduceScatter : CommKind::AllReduce, pass, down, moeLayers_);
  }

  /// Router, dispatch, experts, combine of the MoE layers (forward, or its recomputation), and the shared experts.
  void addMoe(Pass pass, bool recompute, const std::string& sfx) {
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

  /// Data- and weight-gradient GEMMs of every forward GEMM, the attention backward, and the collectives that
  /// mirror the forward ones (the backward of an all-gather is a reduce-scatter and the other way round).
  void addBackward() {
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
      const uint32_t dgrad = addGemm(f.name + ".dgrad", Pass::Backward, f.m, f.k, f.n, f.batch, f.times, false);
      addGemm(f.name + ".wgrad", Pass::Backward, f.k, f.n, f.m, f.batch, f.times, false);
      // Column-parallel GEMMs (qkv, mlp-up, lm-head) reduce their input gradient; row-parallel ones (attn-out,
      // mlp-down) gather their output gradient first.
      const bool column = isColumnInput(f.name) || f.name == "lm-head";
      const bool row = f.name == "attn-out" || f.name == "mlp-down" || f.name == "shared-down";
      if (column)
        tpBoundary((sp ? "tp.rs." : "tp.ar.") + f.name + ".dgrad", sp ? CommKind::ReduceScatter : CommKind::AllReduce,
                   Pass::Backward, dgrad, f.times);
      if (row && sp) tpBoundary("tp.ag." + f.name + ".dgrad", CommKind::AllGather, Pass::Backward, dgrad, f.times);
    }
    if (moeLayers_ > 0 && r_.ep > 1) {
      const CommOp* dispatch = nullptr;
      for (const CommOp& c : out_.comm)
        if (c.name == "ep.dispatch") dispatch = &c;
      const CommOp proto = *dispatch;
      addComm("ep.combine.bwd", Phase::Ep, CommKind::AllToAll, Pass::Backward, CommTiming::Blocking, proto.count,
              proto.dtype, proto.times, epGroups_);
      addComm("ep.dispatch.bwd", Phase::Ep, CommKind::AllToAll, Pass::Backward, CommTiming::Blocking, proto.count,
              proto.dtype, proto.times, epGroups_);
    }
  }

  // ---- pipeline and data parallelism ----------------------------------------------------------------------

  void addPipeline() {
    if (r_.pp == 1) return;
    // A middle stage receives and sends one activation (forward) and one gradient (backward) per micro-batch and
    // model chunk: T x h / t elements each (the sequence-parallel slice, or Megatron's scatter-gather of it).
    const uint64_t count = tokens_ * w_.model.hidden / r_.tp;
    addComm("pp.send", Phase::Pp, CommKind::SendRecv, Pass::Forward, CommTiming::Blocking, count, w_.training.dtype,
            r_.virtualStages, ppGroups_);
    addComm("pp.send.bwd", Phase::Pp, CommKind::SendRecv, Pass::Backward, CommTiming::Blocking, count,
            w_.training.dtype, r_.virtualStages, ppGroups_);
  }

  /// Gradient reduction in equal buckets of at most the layout's bucket size (the last bucket of a framework is
  /// smaller; equal buckets give one distinct collective to simulate), and ZeRO's parameter gathers.
  void bucketed(const char* prefix, double params, uint32_t groupSize, uint32_t groups) {
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

  /// ZeRO 3: every layer's parameters gathered before its forward and backward, its gradients reduce-scattered
  /// after its backward, for every micro-batch.
  void perLayer(const char* prefix, double layerParams, uint32_t layers, uint32_t groupSize, uint32_t groups) {
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

  void addDataParallel() {
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
    if (m.moe) expertPerLayer = static_cast<double>(m.moe->experts / r_.ep) * lp.expert;
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

  /// The optimizer step, the copy of the masters into the model's parameters, the zeroing of the main-gradient
  /// buffer and the gradient-norm pass, once per step over the parameters this rank's optimizer updates: all of the
  /// stage's parameters per GPU without ZeRO, its shard of them (dense over dp, experts over the expert data-parallel
  /// group) with ZeRO 1 to 3.
  void addStepKernels() {
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

  /// Mixed precision with Megatron-LM's gradient-accumulation fusion: the weight-gradient GEMMs accumulate into
  /// the fp32 main-gradient buffer themselves.
  bool fusedGradAccum() const { return elemBytes_ < 4 && w_.training.gradAccumFusion; }

  /// The per-micro-batch add of 16-bit weight gradients into the fp32 main-gradient buffer (mixed precision; the
  /// local buffer: ZeRO shards it only after the step's last micro-batch). Unfused: every parameter of the stage.
  /// Fused: the parameters no weight-gradient GEMM produces (the embedding, the norms' weights, the routers'
  /// weights, whose gradients Megatron-LM adds in its backward hook).
  void addGradAccum() {
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

  const Workload& w_;
  const ResolvedLayout& r_;
  StageLowering out_;
  uint64_t tokens_ = 0, d_ = 0, qkvN_ = 0, attnOutK_ = 0, ffnLocal_ = 0, vocabLocal_ = 0, kvLocal_ = 0;
  uint64_t dqk_ = 0, dv_ = 0;  ///< query/key and value dims per head (MLA: nope + rope and vHeadDim; d otherwise)
  uint32_t moeLayers_ = 0, denseLayers_ = 0, windowLayers_ = 0;
  double elemBytes_ = 2;
  uint32_t tpGroups_ = 0, dpGroups_ = 0, epGroups_ = 0, edpGroups_ = 0, ppGroups_ = 0, cpGroups_ = 0, cpRingGroups_ = 0;
};

}  // namespace

StepLowering lowerStep(const Workload& w, const ResolvedLayout& r) {
  if (r.stageLayers.size() != r.pp || r.tp == 0 || r.dp == 0 || r.pp == 0)
    throw Error(ErrorCode::InvalidArgument, "lowerStep: the layout is not resolved (call resolveLayout first)");
  StepLowering out;
  out.layout = r;
  out.tokensPerStep = w.training.globalBatch * w.training.seq;
  for (uint32_t s = 0; s < r.pp; ++s) {
    out.stages.push_back(StageBuilder(w, r, s).build());
    double perMb = 0;
    // Model FLOPs are the matrix products' (GEMMs and attention), as MFU counts them.
    for (const ComputeOp& op : out.stages.back().compute)
      if (!op.recompute && op.kind != ComputeKind::Other) perMb += op.flops * op.times;
    out.modelFlopsPerStep += perMb * r.microBatches * static_cast<double>(r.tp) * r.cp * r.dp;
  }
  return out;
}

const char* toString(Phase p) noexcept {
  switch (p) {
    case Phase::Tp: return "tp";
    case Phase::Ep: return "ep";
    case Phase::Pp: return "pp";
    case Phase::Dp: return "dp";
    case Phase::Cp: return "cp";
  }
  return "tp";
}

const char* toString(CommKind k) noexcept {
  switch (k) {
    case CommKind::AllReduce: return "allreduce";
    case CommKind::AllGather: return "allgather";
    case CommKind::ReduceScatter: return "reducescatter";
    case CommKind::AllToAll: return "alltoall";
    case CommKind::SendRecv: return "sendrecv";
  }
  return "allreduce";
}

const char* toString(CommTiming t) noexcept {
  switch (t) {
    case CommTiming::Blocking: return "blocking";
    case CommTiming::GradBucket: return "grad-bucket";
    case CommTiming::ParamGather: return "param-gather";
    case CommTiming::LayerPrefetch: return "layer-prefetch";
    case CommTiming::AttentionRing: return "attention-ring";
  }
  return "blocking";
}

const char* toString(FusedKind k) noexcept {
  switch (k) {
    case FusedKind::AllGatherGemm: return "allgather+gemm";
    case FusedKind::GemmReduceScatter: return "gemm+reducescatter";
    case FusedKind::GemmAllReduce: return "gemm+allreduce";
  }
  return "gemm+allreduce";
}

const char* toString(Pass p) noexcept {
  switch (p) {
    case Pass::Forward: return "forward";
    case Pass::Backward: return "backward";
    case Pass::Step: return "step";
  }
  return "forward";
}

const char* toString(ComputeKind k) noexcept {
  switch (k) {
    case ComputeKind::Gemm: return "gemm";
    case ComputeKind::Attention: return "attention";
    case ComputeKind::Other: return "other";
  }
  return "gemm";
}

const char* toString(KernelClass c) noexcept {
  switch (c) {
    case KernelClass::Gemm: return "gemm";
    case KernelClass::Attention: return "attention";
    case KernelClass::Norm: return "norm";
    case KernelClass::Activation: return "activation";
    case KernelClass::Rotary: return "rotary";
    case KernelClass::Residual: return "residual";
    case KernelClass::Loss: return "loss";
    case KernelClass::Embedding: return "embedding";
    case KernelClass::Optimizer: return "optimizer";
    case KernelClass::GradNorm: return "grad-norm";
    case KernelClass::Cast: return "cast";
    case KernelClass::Router: return "router";
    case KernelClass::Permute: return "permute";
  }
  return "gemm";
}

const char* dtypeName(const ComputeOp& op) noexcept { return op.fp8 ? "float8_e4m3" : toString(op.dtype); }

uint64_t commBytes(const CommOp& op, uint32_t groupSize) noexcept {
  const uint64_t elem = dtypeSize(op.dtype);
  switch (op.kind) {
    case CommKind::AllGather:
    case CommKind::ReduceScatter:
    case CommKind::AllToAll: return op.count * groupSize * elem;
    case CommKind::AllReduce:
    case CommKind::SendRecv: return op.count * elem;
  }
  return op.count * elem;
}

}  // namespace mk
