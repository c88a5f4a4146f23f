// mkernel — how much GPU memory one training step's state needs per GPU (docs/planner.md): weights, gradients,
// Adam state under the layout's ZeRO stage, and the activations the pipeline schedule keeps in flight.
//
// Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
// (MLSys 2023, arXiv 2205.05198), section 4.1's per-tensor accounting, with the attention scores never stored (a
// FlashAttention-style kernel) and generalised to the model's shape: Q, K, V and the attention output at heads x
// head dims (key-value heads for K and V; MLA's per-head keys and values and its latents), the MLP's activation at
// the model's ffn (gate and up when gated), MoE layers' router, routed rows through the experts and shared experts
// (layerActivations). For the paper's shape (multi-head attention, ffn 4h, not gated) this is s b h (10 + 24 / t)
// bytes per layer, s b h 34 / t with sequence parallelism, 2 s b h / t (the layer input only) with full
// recomputation, minus the chosen modules' bytes with selective recomputation (docs/planner.md, "Activation memory").
// training.dtype fp8 (Transformer Engine): bf16 weights plus a one-byte FP8 copy of every FP8 GEMM's weight,
// gradients and Adam state as in bf16, the FP8 GEMMs' inputs saved in FP8 (s b h (8 + 19 / t), 27 s b h / t for
// the paper's shape). Not counted: logits, the attention's log-sum-exp, temporary buffers, the CUDA context,
// fragmentation.
#pragma once

#include "mk/workload/lowering.hpp"
#include "mk/workload/workload.hpp"

namespace mk {

/// Bytes per GPU of the stage that needs the most.
struct MemoryEstimate {
  uint32_t stage = 0;      ///< the pipeline stage these numbers are for
  double weights = 0;      ///< parameters in the training dtype (sharded over dp under ZeRO 3, plus two gathered
                           ///< units: StageLowering::gatheredParams); fp8: + 1 byte per
                           ///< parameter of an FP8 GEMM (its FP8 copy)
  double gradients = 0;    ///< in the layout's gradient dtype (sharded under ZeRO 2 and 3; ZeRO 3: + one unit's)
  double optimizer = 0;    ///< Adam: fp32 master weights, first and second moments, 12 bytes per parameter
  double activations = 0;  ///< per layer per micro-batch x layers x micro-batches in flight
  double inFlight = 0;     ///< micro-batches whose activations the stage holds at once
  double total() const noexcept { return weights + gradients + optimizer + activations; }
};

/// Activation bytes one transformer layer keeps on one GPU for one micro-batch until its backward pass (after
/// recomputation: full keeps the layer input, selective drops the chosen modules' tensors).
struct LayerActivations {
  double dense = 0;  ///< a layer with the dense MLP (model.ffn)
  double moe = 0;    ///< a MoE layer (0 for a dense model): router, routed experts at the busiest rank, shared experts
};
LayerActivations layerActivations(const Workload& w, const ResolvedLayout& r);

/// Memory of every stage of `step` (lowerStep(w, r)); returns the largest.
MemoryEstimate estimateMemory(const Workload& w, const StepLowering& step);

}  // namespace mk
