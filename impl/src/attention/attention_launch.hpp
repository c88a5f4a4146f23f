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

}  // namespace mk::runtime
