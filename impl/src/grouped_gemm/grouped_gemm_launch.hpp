// mkernel — internal: the standalone grouped GEMM kernel's launcher (impl/src/kernels/grouped_gemm.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mk/device/grouped_gemm_device.hpp"

namespace mk::runtime {

/// Launch `ctas` CTAs of 384 threads running groupedGemmRunTiles<p.gemm.tmaStoreC> over tiles blockIdx.x, + ctas, ...
/// (sets the kernel's dynamic shared-memory limit on first use per device). Throws Error(CudaError).
void launchGroupedGemm(const device::GroupedGemmParams& p, uint32_t ctas, cudaStream_t stream);

}  // namespace mk::runtime
