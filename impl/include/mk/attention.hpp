// mkernel — the attention forward tile engine on one GPU (mk/device/attention_device.hpp), launched on its own: the
// `attention` step kind's contract (mk/schedule/attention.hpp) for bf16 inputs, head dims 64 and 128.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "mk/attention_params.hpp"
#include "mk/device/attention_device.hpp"
#include "mk/schedule/attention.hpp"
#include "mk/schedule/element.hpp"

namespace mk {

/// How attentionForward runs (the defaults are the fast path).
struct AttentionOptions {
  uint32_t ctas = 0;  ///< CTAs of the persistent grid; 0: one per SM (never more than the units)
  /// Whether CTAs draw units from a counter (a CTA that finishes early takes the next: causal and short sequences
  /// end with less of a tail) or split them statically.
  bool dynamicUnits = true;
  /// Host-mapped, 8 words zeroed (optional): receives who waited for what if a device wait times out.
  uint32_t* timeoutReport = nullptr;
  /// The counter of dynamicUnits: a zeroed device word (cudaMalloc + cudaMemset once) that each call leaves zero
  /// again; calls that may run at the same time need their own. Null: attentionForward keeps one per (device,
  /// stream), allocated by the first call on that stream (so pass your own inside a CUDA graph capture).
  uint32_t* unitCounter = nullptr;
};

/// out = the attention step of `sh` over q (Q) and kv (K, then V vOffset elements later), bf16, on the current
/// device, ordered on `stream` (asynchronous). `out` is float32 [batch][ldo][qHeads][headDim + 1] (rows past sq in
/// each batch untouched). Throws Error(InvalidArgument) with attentionForwardProblem's reason, or for a null or
/// misaligned pointer (q, kv 16-byte aligned), before any device work; Error(CudaError) when the driver refuses a
/// tensor map or the launch fails.
void attentionForward(const AttentionShape& sh, DType dtype, const void* q, const void* kv, float* out,
                      cudaStream_t stream, const AttentionOptions& options = {});

/// dst <- lse-merge(a, b) on the current device, ordered on `stream`: `rows` float32 rows of `width` values and their
/// log-sum-exp each (the attention engine's output rows, width = headDim), merged as the resident kernel's Reduce with
/// RedOp::LseMerge does (mk::lseMergeWeights in float: a row whose partials saw no key stays 0 and -inf). dst may
/// alias a or b exactly. What a layered context-parallel program runs between its attention kernels. Throws
/// Error(InvalidArgument) for a null pointer (with rows > 0) or width 0, Error(CudaError) when the launch fails.
void lseMergeDevice(float* dst, const float* a, const float* b, uint64_t rows, uint32_t width, cudaStream_t stream);

}  // namespace mk
