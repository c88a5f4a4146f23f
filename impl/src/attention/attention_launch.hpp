// mkernel — internal: the standalone attention kernel's launcher (impl/src/kernels/attention.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mk/device/attention_device.hpp"

namespace mk::runtime {

/// Launch `ctas` CTAs of 384 threads running attentionRunUnits<p.headDim> (the units they draw from p.unitCounter,
/// or blockIdx.x, + ctas, ...; sets the kernels' dynamic shared-memory limit on first use per device). Throws
/// Error(CudaError).
void launchAttention(const device::AttentionParams& p, uint32_t ctas, cudaStream_t stream);

/// lse-merge of `rows` float32 rows of `width` values and their log-sum-exp on `stream` (the resident kernel's routine,
/// lse_merge.cuh). dst may alias a or b exactly. Throws Error(CudaError).
void launchLseMerge(float* dst, const float* a, const float* b, uint64_t rows, uint32_t width, cudaStream_t stream);

/// The engine's 4-D bf16 tensor map {headDim, heads, tokens, batch} over [batch][ld tokens][heads][headDim], box
/// {64, 1, 128, 1}, 128-byte swizzle (Q, K or V of an attention step). Throws Error(CudaError) naming `name`.
device::GemmTensorMap encodeAttentionMap(const void* base, uint32_t headDim, uint32_t heads, uint32_t tokens,
                                         uint32_t batch, uint64_t ld, const char* name);

}  // namespace mk::runtime
