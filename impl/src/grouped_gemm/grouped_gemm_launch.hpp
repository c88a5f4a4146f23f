// mkernel — internal: the standalone grouped GEMM kernel's launcher (impl/src/kernels/grouped_gemm.cu).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <vector>

#include "mk/device/grouped_gemm_device.hpp"
#include "mk/grouped_gemm.hpp"

namespace mk::runtime {

/// Launch `ctas` CTAs of 384 threads running groupedGemmRunTiles<p.gemm.tmaStoreC> over tiles blockIdx.x, + ctas, ...
/// (sets the kernel's dynamic shared-memory limit on first use per device). Throws Error(CudaError).
void launchGroupedGemm(const device::GroupedGemmParams& p, uint32_t ctas, cudaStream_t stream);

/// The kernel's parameters of a problem groupedGemmProblem() accepted: A's map (and C's with the TMA-store epilogue)
/// encoded, every size and flag set; the B_g maps go to `mapsB` (one per group), for the caller to place in device
/// memory and point p.mapsB at; p.gemm.timeoutReport is null. Shared by GroupedGemmPlan and the resident kernel's
/// GroupedGemm steps (gemm_lane.cpp). Throws Error(CudaError) when the driver refuses a map.
device::GroupedGemmParams groupedGemmDeviceParams(const GroupedGemmProblem& pr, const GroupedGemmConfig& cfg,
                                                  std::vector<device::GemmTensorMap>* mapsB);

}  // namespace mk::runtime
