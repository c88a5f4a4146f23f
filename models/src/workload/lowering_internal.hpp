// mkernel — the lowering's StageBuilder, shared by its translation units (internal: lowering.cpp,
// lowering_kernels.cpp, lowering_attention.cpp, lowering_layers.cpp, lowering_moe.cpp, lowering_step.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/workload/lowering.hpp"

namespace mk::detail {

inline uint64_t ceilDiv(uint64_t a, uint64_t b) { return (a + b - 1) / b; }
inline double dbl(uint64_t v) { return static_cast<double>(v); }

/// Everything one stage's lowering needs, computed once; one method per part of the step, each file one part.
class StageBuilder {
 public:
  /// The stage's shape: its layers (dense, MoE, windowed), the rank's tokens and head and column counts.
  StageBuilder(const Workload& w, const ResolvedLayout& r, uint32_t stage);
  /// Every op of one micro-batch of the stage, then the step's.
  StageLowering build();

 private:
  // ---- groups, collectives, recomputation (lowering.cpp) ----------------------------------------------------------

  /// Append a group set; returns its index (CommOp::groups).
  uint32_t group(GroupSet g);

  /// The stage's tp, dp, ep, edp, pp (and cp) group sets (lowering_groups.cpp).
  void addGroups();

  /// Append a collective; returns its index.
  uint32_t addComm(const std::string& name, Phase phase, CommKind kind, Pass pass, CommTiming timing, uint64_t count,
                   DType dtype, uint32_t times, uint32_t groups);

  /// Whether the forward op `name` (a ".recompute" suffix ignored) runs again in the backward pass: every layer op
  /// under full recomputation; under selective, the ops of the chosen modules (Megatron-LM's --recompute-modules:
  /// core_attn the attention kernel, mlp the dense MLP with its TP collectives, moe_act the experts' activation,
  /// norms the two norms; docs/planner.md, "Recomputation").
  bool rerun(const std::string& name) const;

  void fuse(FusedKind kind, uint32_t compute, uint32_t comm) { out_.fused.push_back({kind, compute, comm}); }

  // ---- GEMMs and other kernels, their FLOPs and bytes (lowering_kernels.cpp) --------------------------------------

  /// A GEMM (ComputeOp::linearLayer = `linearLayer`); returns its index, UINT32_MAX for a recomputation that does
  /// not re-run it.
  uint32_t addGemm(const std::string& name, Pass pass, uint64_t m, uint64_t n, uint64_t k, uint64_t batch,
                   uint32_t times, bool recompute, bool linearLayer = true);

  /// t where a GEMM's A operand arrives through a sequence-parallel all-gather (the column-parallel forward
  /// inputs, the row-parallel output gradients), 1 elsewhere: Transformer Engine casts the rank's sequence slice
  /// before the all-gather, so each rank casts T / t rows.
  double spGathered(const std::string& name) const;

  /// training.dtype fp8: the GEMMs Transformer Engine runs in FP8 (Megatron-LM's FP8 recipe): every linear
  /// layer of attention, the MLP and the experts; the LM head and the MoE router stay in bf16.
  bool fp8Gemm(const std::string& name) const;

  /// amax (per-tensor scale) then cast-fp8 of `elements` bf16 values, `times` per micro-batch (Step: per step).
  void addCast(const std::string& prefix, Pass pass, double elements, uint32_t times, bool recompute);

  /// FLOPs and HBM bytes of one launch of a non-GEMM kernel from its class, kernel and shape (docs/planner.md,
  /// "Kernel census"; the same formulas as validation/tools/kernel_bench.py). `grad`: the kernel's backward.
  /// e = the activations' element size; statistics, indices and routing weights are fp32 / int64 as the
  /// frameworks keep them.
  void kernelCost(ComputeOp& op, bool grad) const;

  /// A non-GEMM kernel from its shape (`proto`: class, kernel and shape fields set).
  uint32_t addKernel(ComputeOp op, const std::string& name, Pass pass, uint32_t times, bool recompute,
                     bool grad = false);

  /// A kernel prototype of class `cls` over `tokens` x `hidden` values.
  static ComputeOp shape(KernelClass cls, const char* kernel, uint64_t tokens, uint64_t hidden);

  // ---- attention and context parallelism (lowering_attention.cpp) -------------------------------------------------

  /// Context parallelism's exchanges around the attention of `times` layers (layout.cpCommType): the forward
  /// attention's (`forward`; a recomputed attention runs them again in the backward pass) or its backward's.
  void addContextParallel(bool forward, Pass pass, uint32_t times, const std::string& sfx);

  /// The fused variant's ring-attention block of the K/V ring `ringComm` and the attention kernels before it.
  void addRingBlock(bool forward, Pass pass, uint32_t times, uint32_t ringComm);

  /// The fused variant's moe-ffn block of one pass: `compute` and `comm` the ops it replaces (layout.ep > 1).
  void addMoeBlock(Pass pass, bool mirror, std::vector<uint32_t> compute, std::vector<uint32_t> comm);

  /// Causal attention of one micro-batch on this rank's heads: QK^T and PV per (sequence, head), half of each
  /// computed under the causal mask; Q, K, V, O and the fp32 log-sum-exp read or written once (the scores never
  /// reach HBM; K and V have the rank's key-value heads).
  /// `windowed`: the layers of model.slidingWindow, whose queries see at most that many keys (causalKeys).
  void addAttention(Pass pass, uint32_t times, bool recompute, bool backward, bool windowed = false);

  /// The GEMMs whose input is the layer's (gathered) input, or whose input gradient is reduced over TP: the
  /// column-parallel projections. MLA's kv-down reads the same gathered input, but its input gradient is summed
  /// with q-down's (or q's) before the one reduction.
  static bool isColumnInput(const std::string& base);

  /// Attention's input projections and rotary embedding: q, k and v in one GEMM, or MLA's (the down-projections
  /// to the latents replicated over TP, the up-projections and direct q split by heads; RMSNorm on each latent).
  void addProjections(Pass pass, bool recompute, const std::string& sfx);

  // ---- the layers forward and backward, tensor-parallel boundaries (lowering_layers.cpp) --------------------------

  /// A tensor-parallel boundary next to GEMM `gemm`: all-gather before a column-parallel GEMM, reduce-scatter
  /// (sequence parallel) or all-reduce after a row-parallel one.
  void tpBoundary(const std::string& name, CommKind kind, Pass pass, uint32_t gemm, uint32_t times);

  /// The forward ops of this stage's layers (and embedding, head and loss); `recompute` marks them as a
  /// backward-pass re-run (Megatron-LM's full recomputation re-runs the transformer layers only).
  void addLayers(Pass pass, bool recompute);

  /// Data- and weight-gradient GEMMs of every forward GEMM, the attention backward, and the collectives that
  /// mirror the forward ones (the backward of an all-gather is a reduce-scatter and the other way round).
  void addBackward();

  // ---- mixture of experts (lowering_moe.cpp) ----------------------------------------------------------------------

  /// A MoE layer's shared experts: one MLP of sharedExperts x sharedFfn columns, split by TP like the dense MLP.
  void addSharedExperts(Pass pass, bool recompute, const std::string& sfx);

  /// Router, dispatch, experts, combine of the MoE layers (forward, or its recomputation), and the shared experts.
  void addMoe(Pass pass, bool recompute, const std::string& sfx);

  /// The MoE layers' backward exchanges: each forward one mirrored (an all-to-all by an all-to-all, expert tensor
  /// parallelism's all-gather by a reduce-scatter and the other way round).
  void addMoeBackward();

  // ---- pipeline, data parallelism and the optimizer step (lowering_step.cpp) --------------------------------------

  /// The pipeline sends and receives of the stage boundary.
  void addPipeline();

  /// Gradient reduction in equal buckets of at most the layout's bucket size (the last bucket of a framework is
  /// smaller; equal buckets give one distinct collective to simulate), and ZeRO's parameter gathers.
  void bucketed(const char* prefix, double params, uint32_t groupSize, uint32_t groups);

  /// ZeRO 3: every layer's parameters gathered before its forward and backward, its gradients reduce-scattered
  /// after its backward, for every micro-batch.
  void perLayer(const char* prefix, double layerParams, uint32_t layers, uint32_t groupSize, uint32_t groups);

  /// The stage's dense and expert parameter counts and their gradient reduction (and ZeRO gathers).
  void addDataParallel();

  /// The optimizer step, the copy of the masters into the model's parameters, the zeroing of the main-gradient
  /// buffer and the gradient-norm pass, once per step over the parameters this rank's optimizer updates: all of the
  /// stage's parameters per GPU without ZeRO, its shard of them (dense over dp, experts over the expert data-parallel
  /// group) with ZeRO 1 to 3.
  void addStepKernels();

  /// The per-micro-batch add of 16-bit weight gradients into the fp32 main-gradient buffer (mixed precision; the
  /// local buffer: ZeRO shards it only after the step's last micro-batch). Unfused: every parameter of the stage.
  /// Fused: the parameters no weight-gradient GEMM produces (the embedding, the norms' weights, the routers'
  /// weights, whose gradients Megatron-LM adds in its backward hook).
  void addGradAccum();

  /// Mixed precision with Megatron-LM's gradient-accumulation fusion: the weight-gradient GEMMs accumulate into
  /// the fp32 main-gradient buffer themselves.
  bool fusedGradAccum() const { return elemBytes_ < 4 && w_.training.gradAccumFusion; }

  const Workload& w_;
  const ResolvedLayout& r_;
  StageLowering out_;
  uint64_t tokens_ = 0, d_ = 0, qkvN_ = 0, attnOutK_ = 0, ffnLocal_ = 0, vocabLocal_ = 0, kvLocal_ = 0;
  uint64_t dqk_ = 0, dv_ = 0;  ///< query/key and value dims per head (MLA: nope + rope and vHeadDim; d otherwise)
  uint32_t moeLayers_ = 0, denseLayers_ = 0, windowLayers_ = 0;
  double elemBytes_ = 2;
  uint32_t tpGroups_ = 0, dpGroups_ = 0, epGroups_ = 0, edpGroups_ = 0, ppGroups_ = 0, cpGroups_ = 0, cpRingGroups_ = 0;
  uint32_t etpGroups_ = 0;          ///< expert tensor parallelism (layout.etp > 1)
  uint32_t cpRingRanksGroups_ = 0;  ///< every rank of one K/V ring (p2p, a2a+p2p)
};

}  // namespace mk::detail
