// mkernel — how much GPU memory one training step's state needs per GPU (docs/planner.md): weights, gradients,
// Adam state under the layout's ZeRO stage, and the activations the pipeline schedule keeps in flight.
//
// Activations follow Korthikanti et al., "Reducing Activation Recomputation in Large Transformer Models"
// (MLSys 2023, arXiv 2205.05198), with the attention scores never stored (a FlashAttention-style kernel):
// s b h (10 + 24 / t) bytes per layer, s b h 34 / t with sequence parallelism, 2 s b h / t (the layer input
// only) with full recomputation, minus the chosen modules' bytes with selective recomputation (memory.cpp,
// docs/planner.md "Recomputation"). Not counted: logits, temporary buffers, the CUDA context, fragmentation.
// training.dtype fp8 (Transformer Engine): bf16 weights plus a one-byte FP8 copy of every FP8 GEMM's weight,
// gradients and Adam state as in bf16, the FP8 GEMMs' inputs saved in FP8: s b h (8 + 19 / t), 27 s b h / t.
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

/// Memory of every stage of `step` (lowerStep(w, r)); returns the largest.
MemoryEstimate estimateMemory(const Workload& w, const StepLowering& step);

}  // namespace mk
