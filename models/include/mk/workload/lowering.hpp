// mkernel — one training step lowered to what every GPU does: its GEMMs and attention kernels per micro-batch
// and the collectives each parallel dimension needs, per pipeline stage (docs/planner.md has every formula).
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
//   * ranks are ordered tp fastest, then dp (whose ep consecutive indices form an expert-parallel group), then pp.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/schedule/types.hpp"
#include "mk/workload/workload.hpp"

namespace mk {

/// Forward or backward pass (a recomputed forward counts as backward work).
enum class Pass : uint8_t { Forward, Backward };
/// What a compute operation is: a GEMM, or the attention core (a FlashAttention-style fused kernel).
enum class ComputeKind : uint8_t { Gemm, Attention };

/// One compute kernel of a stage, run `times` times per micro-batch.
struct ComputeOp {
  std::string name;  ///< "qkv", "qkv.dgrad", "qkv.wgrad", "attention", "attention.bwd", "expert-up", ...
  ComputeKind kind = ComputeKind::Gemm;
  Pass pass = Pass::Forward;
  uint64_t m = 0, n = 0, k = 0;  ///< one GEMM instance (attention: m = n = seq, k = head dim)
  uint64_t batch = 1;            ///< instances in one kernel (experts per rank; sequences x heads for attention)
  double flops = 0;              ///< of one kernel, all instances (attention: causal mask applied)
  double bytes = 0;              ///< HBM traffic of one kernel: operands read and result written once
  uint32_t times = 1;            ///< kernels per micro-batch on the stage
  bool recompute = false;        ///< a forward op run again in the backward pass (not model FLOPs)
};

/// Which parallel dimension a communication belongs to.
enum class Phase : uint8_t { Tp, Ep, Pp, Dp };
/// The communication pattern.
enum class CommKind : uint8_t { AllReduce, AllGather, ReduceScatter, AllToAll, SendRecv };
/// When a communication runs, which decides what the step model may hide behind compute.
enum class CommTiming : uint8_t {
  Blocking,       ///< on its micro-batch's critical path (TP, EP, PP in the layered variant)
  GradBucket,     ///< a gradient bucket reduced while the last backward pass runs (per step)
  ParamGather,    ///< ZeRO 1/2: the updated parameters all-gathered after the optimizer step (per step)
  LayerPrefetch,  ///< ZeRO 3: a layer's parameters gathered (gradients scattered) next to a neighbour's compute
};

/// A set of rank groups that run the same communication at the same time (each group one instance).
struct GroupSet {
  std::string name;                              ///< "tp", "dp", "ep", "edp" (expert data-parallel), "pp"
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

/// One pipeline stage, as each of its GPUs sees it.
struct StageLowering {
  uint32_t stage = 0;
  uint32_t layers = 0;                   ///< transformer layers on the stage
  bool embedding = false, head = false;  ///< holds the token embedding / the LM head
  std::vector<ComputeOp> compute;
  std::vector<CommOp> comm;
  std::vector<GroupSet> groups;
  std::vector<FusedCandidate> fused;
  double denseParams = 0;   ///< parameters per GPU reduced over the data-parallel group
  double expertParams = 0;  ///< parameters per GPU reduced over the expert data-parallel group
};

/// The whole step.
struct StepLowering {
  ResolvedLayout layout;
  std::vector<StageLowering> stages;  ///< one per pipeline stage
  uint64_t tokensPerStep = 0;         ///< globalBatch x seq
  double modelFlopsPerStep = 0;       ///< over all GPUs, forward + backward, recomputation not counted
};

/// Lower `w` on `r` (resolveLayout(w, gpus)).
StepLowering lowerStep(const Workload& w, const ResolvedLayout& r);

const char* toString(Phase p) noexcept;        ///< "tp", "ep", "pp", "dp"
const char* toString(CommKind k) noexcept;     ///< "allreduce", "allgather", "reducescatter", "alltoall", "sendrecv"
const char* toString(CommTiming t) noexcept;   ///< "blocking", "grad-bucket", "param-gather", "layer-prefetch"
const char* toString(FusedKind k) noexcept;    ///< "allgather+gemm", "gemm+reducescatter", "gemm+allreduce"
const char* toString(Pass p) noexcept;         ///< "forward", "backward"
const char* toString(ComputeKind k) noexcept;  ///< "gemm", "attention"

/// Bytes nccl-tests calls the op's size (the larger buffer of one rank), for reports: elements x the dtype,
/// times the group size for the gathered / scattered side of all-gather and reduce-scatter.
uint64_t commBytes(const CommOp& op, uint32_t groupSize) noexcept;

}  // namespace mk
