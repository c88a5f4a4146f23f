// mkernel — internal: the standalone GEMM kernel's launcher (impl/src/kernels/gemm.cu), called by GemmPlan.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mk/device/gemm_device.hpp"

namespace mk::runtime {

/// Set the kernels' dynamic shared-memory limit on the current device (once per device and process).
void prepareGemmKernels();
/// Launch the persistent GEMM kernel of tile width params.blockN (128 or 256) and the epilogue
/// params.tmaStoreC (1: shared-memory staging + TMA stores, 0: direct stores): `ctas` CTAs of 384 threads
/// walk the tiles blockIdx.x, blockIdx.x + ctas, ... With `hookCounts` set, each finished tile adds 1 to its
/// counter.
/// Throws Error(CudaError) when the launch fails.
void launchGemm(const device::GemmParams& params, uint32_t ctas, uint32_t* hookCounts, cudaStream_t stream);

}  // namespace mk::runtime
