// mkernel — one training step lowered to what every GPU does: every kernel it runs per micro-batch and per step
// (the census: GEMMs, attention, norms, activations, ..., the optimizer) and the collectives each parallel
// dimension needs, per pipeline stage (docs/planner.md has every formula).
//
// Pure arithmetic over the workload: no topology, no prices. The planner (validation/plan) prices compute with
// its GEMM model and communication with the simulator, then adds overlap, the pipeline bubble and stragglers.
// Conventions (T = microBatch x seq tokens, t = tp, h = hidden, d = head dim, a / g = query / key-value heads):
//   * GEMM dims are per kernel as the GPU runs them: C[m x n] = A[m x k] B[k x n]; a backward pass runs for
//     every forward GEMM a data-gradient GEMM (m, k, n) and a weight-gradient GEMM (k, n, m);
//   * tensor parallelism is Megatron-LM's: QKV and MLP-up split by columns, attention-out and MLP-down by rows;
//     with sequence parallelism each of those boundaries is an all-gather or a reduce-scatter of T x h elements,
//     without it the row-parallel outputs are all-reduced;
//   * experts are not split by tensor parallelism (expert TP = 1); with tp > 1 a MoE layer works on each rank's
//     sequence slice (T / t tokens) and routing is assumed uniform over the experts;
//   * the other kernels run where Megatron-LM runs them: norms and residual adds on the sequence-parallel slice
//     (T / t tokens; T without sequence parallelism), rotary and the activation on T tokens of the rank's heads
//     and MLP columns, the loss on T x vocab / t logits, the optimizer and gradient norm once per step over the
//     parameters this rank's optimizer holds (its ZeRO shard);
//   * context parallelism (cp) splits every sequence: each rank holds T / cp tokens of every op and 1 / cp of the
//     causal attention work (zigzag), and exchanges K/V as layout.cpCommType says;
//   * ranks are ordered tp fastest, then cp, then dp, then pp (Megatron-LM's tp-cp-ep-dp-pp; lowering_groups.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/schedule/types.hpp"
#include "mk/workload/workload.hpp"

namespace mk {

/// Forward or backward pass (a recomputed forward counts as backward work), or once per optimizer step (the
/// optimizer and the gradient norm: communication never uses Step).
enum class Pass : uint8_t { Forward, Backward, Step };
/// What a compute operation is: a GEMM, the attention core (a FlashAttention-style fused kernel), or any other
/// kernel of the step (norms, activations, the loss, the optimizer, ...: ComputeOp::cls says which).
enum class ComputeKind : uint8_t { Gemm, Attention, Other };

/// The census's kernel classes (issue 32's contract; docs/planner.md, "Kernel census"): what a kernel model is
/// fitted per. Gemm and Attention are exactly ComputeKind's Gemm and Attention; every other class is Other.
enum class KernelClass : uint8_t {
  Gemm,
  Attention,
  Norm,        ///< rmsnorm / layernorm: tokens, hidden
  Activation,  ///< swiglu / geglu / gelu / squared-relu: tokens, hidden = the activation's input width per GPU
  Rotary,      ///< rope on q and k: tokens, heads (q + k heads per GPU), headDim
  Residual,    ///< add: tokens, hidden
  Loss,        ///< cross-entropy over the logits: tokens, vocab (per GPU)
  Embedding,   ///< gather (forward) / scatter-add (backward): tokens, hidden, vocab (per GPU)
  Optimizer,   ///< fused AdamW over params (elements per GPU), per step
  GradNorm,    ///< global-norm clipping over params, per step
  Cast,        ///< FP8 recipes (training.dtype fp8): cast-fp8, amax over elements
  Router,      ///< MoE topk-softmax: tokens, experts, topk
  Permute,     ///< MoE permute / unpermute: tokens, hidden, topk
};
inline constexpr int kKernelClasses = 13;

/// One compute kernel of a stage, run `times` times per micro-batch (pass Step: per optimizer step).
struct ComputeOp {
  std::string name;  ///< unique on the stage: "qkv", "qkv.dgrad", "attention.bwd", "attn-norm", "adam", ...
  ComputeKind kind = ComputeKind::Gemm;
  KernelClass cls = KernelClass::Gemm;
  std::string kernel;  ///< the contract's kernel name: the GEMM's name, "attention", "rmsnorm", "swiglu", "add", ...
  Pass pass = Pass::Forward;
  DType dtype = DType::BFloat16;  ///< what the kernel computes in (the optimizer and grad-norm: float32)
  /// FP8 GEMM (float8_e4m3 operands, `dtype` output) or a cast-fp8 kernel (float8_e4m3 output): the census's
  /// dtype is then "float8_e4m3" (dtypeName).
  bool fp8 = false;
  /// A weight-gradient GEMM under gradient-accumulation fusion: it adds into an fp32 buffer (read and written).
  bool accumulateFp32 = false;
  /// A GEMM of one of Megatron-LM's linear layers (column / row parallel, Transformer Engine's), whose weight
  /// gradient gradient-accumulation fusion adds into the fp32 main gradient; false for the MoE router, which calls
  /// F.linear (its gradient is added per micro-batch with the norms'). Set where the op is lowered, carried to its
  /// backward GEMMs.
  bool linearLayer = true;
  uint64_t m = 0, n = 0, k = 0;  ///< one GEMM instance (attention: m = n = seq, k = head dim)
  uint64_t batch = 1;            ///< instances in one kernel (experts per rank; sequences x heads for attention)
  /// The contract's shape fields of the non-GEMM classes (0 where the class has no such field); attention also
  /// fills seqs (sequences), heads, kvHeads, headDim and causal.
  uint64_t tokens = 0, hidden = 0, vocab = 0, heads = 0, kvHeads = 0, headDim = 0, seqs = 0, seq = 0, experts = 0,
           topk = 0, params = 0, elements = 0;
  bool causal = false;
  double flops = 0;        ///< of one kernel, all instances (attention: causal mask applied)
  double bytes = 0;        ///< HBM traffic of one kernel: operands read and result written once
  uint32_t times = 1;      ///< kernels per micro-batch on the stage (pass Step: per step)
  bool recompute = false;  ///< a forward op run again in the backward pass (not model FLOPs)
};

/// Which parallel dimension a communication belongs to.
enum class Phase : uint8_t { Tp, Ep, Pp, Dp, Cp };
inline constexpr int kPhases = 5;
/// The communication pattern.
enum class CommKind : uint8_t { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv };
/// When a communication runs, which decides what the step model may hide behind compute.
enum class CommTiming : uint8_t {
  Blocking,       ///< on its micro-batch's critical path (TP, EP, PP in the layered variant)
  GradBucket,     ///< a gradient bucket reduced while the last backward pass runs (per step)
  ParamGather,    ///< ZeRO 1/2: the updated parameters all-gathered after the optimizer step (per step)
  LayerPrefetch,  ///< ZeRO 3: a layer's parameters gathered (gradients scattered) next to a neighbour's compute
  /// Context parallelism's K/V ring (p2p): each step's send overlaps the attention block of the step before;
  /// what the pass's attention cannot cover is exposed.
  AttentionRing,
};

/// A set of rank groups that run the same communication at the same time (each group one instance).
struct GroupSet {
  /// "tp", "dp" (dp x cp ranks), "ep", "edp" (expert data-parallel), "pp", "etp" (expert tensor-parallel, etp > 1),
  /// "cp", "cp.ring", "cp.ring.ranks"
  std::string name;
  std::vector<std::vector<uint32_t>> instances;  ///< global ranks of each instance; all run concurrently
};

/// One communication of a stage, run `times` times per micro-batch (Blocking, LayerPrefetch) or per step.
struct CommOp {
  std::string name;  ///< "tp.ag.qkv", "tp.rs.attn-out.dgrad", "dp.rs", "pp.send", ...
  Phase phase = Phase::Tp;
  CommKind kind = CommKind::AllReduce;
  Pass pass = Pass::Forward;
  CommTiming timing = CommTiming::Blocking;
  uint64_t count = 0;  ///< in the generators' count convention (algorithms.hpp); SendRecv: elements sent
  DType dtype = DType::BFloat16;
  uint32_t times = 1;
  uint32_t groups = 0;  ///< index into StageLowering::groups
};

/// A fused operator of this project that can replace a GEMM and the collective next to it.
enum class FusedKind : uint8_t { AllGatherGemm, GemmReduceScatter, GemmAllReduce };

/// A (GEMM, collective) pair the fused variant runs as one operator.
struct FusedCandidate {
  FusedKind kind = FusedKind::GemmReduceScatter;
  uint32_t compute = 0;  ///< index into StageLowering::compute
  uint32_t comm = 0;     ///< index into StageLowering::comm
};

/// A fused operator of this project that replaces a whole group of a stage's operations in the fused variant:
/// a MoE layer's permutation, dispatch all-to-all, expert FFN and combine all-to-all (moe-ffn, mk/algorithms/moe.hpp),
/// or the attention kernel with context parallelism's K/V ring (ring-attention, mk/algorithms/attention.hpp).
enum class FusedBlockKind : uint8_t { MoeFfn, RingAttention };

/// One pass of such a group on one rank, run `times` times per micro-batch (once per layer), and the operator's
/// shape. The generators have no backward: a `mirror` block is the backward pass of the group (docs/planner.md,
/// "The fused variant" says how the planner prices it from the forward operator's schedule).
struct FusedBlock {
  FusedBlockKind kind = FusedBlockKind::MoeFfn;
  Pass pass = Pass::Forward;
  bool mirror = false;            ///< the backward of the group (a recomputed forward is not a mirror)
  std::vector<uint32_t> compute;  ///< indices into StageLowering::compute that the operator replaces
  std::vector<uint32_t> comm;     ///< indices into StageLowering::comm that the operator replaces
  uint32_t times = 1;             ///< runs per micro-batch (layers)
  uint32_t groups = 0;            ///< index into StageLowering::groups: the operator's ranks (ep, or cp's ring)
  // moe-ffn (MoeFfnSpec): tokens routed by one rank, experts per rank, top-k, hidden, the expert's intermediate size
  // (per expert-TP rank), the busiest rank's load over the balanced share (MoeSpec::routedLoad)
  uint64_t tokens = 0, experts = 0, topk = 0, hidden = 0, ffn = 0;
  double load = 1;
  // ring-attention (RingAttentionSpec): sequences, query / key-value heads of one rank, head dim, tokens per
  // sequence; the lowering's attention is causal (zigzag)
  uint64_t batch = 0, heads = 0, kvHeads = 0, headDim = 0, seq = 0;
  DType dtype = DType::BFloat16;  ///< of the attention's q, k, v (training.dtype)
  /// Why the operator cannot run the group as this layout lowers it (the group then stays layered in the fused
  /// variant); "" when it can. Shape limits are the generators' own (their validate functions), not repeated here.
  std::string unfusable;
};

/// One pipeline stage, as each of its GPUs sees it.
struct StageLowering {
  uint32_t stage = 0;
  uint32_t layers = 0;                   ///< transformer layers on the stage
  uint32_t moeLayers = 0;                ///< of which mixture-of-experts layers
  bool embedding = false, head = false;  ///< holds the token embedding / the LM head
  std::vector<ComputeOp> compute;
  std::vector<CommOp> comm;
  std::vector<GroupSet> groups;
  std::vector<FusedCandidate> fused;
  std::vector<FusedBlock> fusedBlocks;
  double denseParams = 0;   ///< parameters per GPU reduced over the data-parallel group
  double expertParams = 0;  ///< parameters per GPU reduced over the expert data-parallel group
  /// training.dtype fp8: the dense parameters per GPU whose GEMMs run in FP8 (attention and MLP projections;
  /// not the embedding, the LM head, norms or the router) and so have an FP8 copy; every expert parameter does.
  double fp8DenseParams = 0;
  /// The parameters per GPU of the largest unit ZeRO 3 gathers at once: one layer (with its local experts), or the
  /// embedding and head of the stage.
  double gatheredParams = 0;
};

/// The whole step.
struct StepLowering {
  ResolvedLayout layout;
  std::vector<StageLowering> stages;  ///< one per pipeline stage
  uint64_t tokensPerStep = 0;         ///< globalBatch x seq
  double modelFlopsPerStep = 0;       ///< over all GPUs, forward + backward, recomputation not counted
};

/// Ranks of context parallelism's K/V ring (p2p: cp; a2a+p2p: cp / cpA2aSize; 1: no ring).
uint32_t cpRingRanks(const ParallelLayout& l) noexcept;

/// Lower `w` on `r` (resolveLayout(w, gpus)).
StepLowering lowerStep(const Workload& w, const ResolvedLayout& r);

const char* toString(Phase p) noexcept;     ///< "tp", "ep", "pp", "dp", "cp"
const char* toString(CommKind k) noexcept;  ///< "allreduce", "allgather", "reducescatter", "alltoall", "sendrecv"
/// "blocking", "grad-bucket", "param-gather", "layer-prefetch", "attention-ring"
const char* toString(CommTiming t) noexcept;
const char* toString(FusedKind k) noexcept;       ///< "allgather+gemm", "gemm+reducescatter", "gemm+allreduce"
const char* toString(FusedBlockKind k) noexcept;  ///< "moe-ffn", "ring-attention"
const char* toString(Pass p) noexcept;            ///< "forward", "backward", "step"
const char* toString(ComputeKind k) noexcept;     ///< "gemm", "attention", "other"
const char* toString(KernelClass c) noexcept;     ///< the contract's class: "gemm", "norm", "grad-norm", ...
/// The census's dtype of a kernel: "float8_e4m3" for FP8 GEMMs and casts, toString(op.dtype) otherwise.
const char* dtypeName(const ComputeOp& op) noexcept;

/// Whether the framework's softmax kernels (the loss's log-softmax, forward and backward) hold a row of `rowElems`
/// elements of `elemBytes` in shared memory. PyTorch (aten/src/ATen/native/cuda/SoftMax.cu) takes its
/// shared-memory kernels when the row fits a block's 48 KiB of shared memory less its reduction scratch (128 bytes
/// at 1024 threads) and its length is a multiple of one 16-byte vector; otherwise every pass reads the row from
/// memory. The two run at different rates, so the loss's kernel model is fitted per regime (docs/planner.md).
bool softmaxRowInSharedMemory(uint64_t rowElems, std::size_t elemBytes) noexcept;

/// Bytes nccl-tests calls the op's size (the larger buffer of one rank), for reports: elements x the dtype,
/// times the group size for the gathered / scattered side of all-gather and reduce-scatter.
uint64_t commBytes(const CommOp& op, uint32_t groupSize) noexcept;

}  // namespace mk
