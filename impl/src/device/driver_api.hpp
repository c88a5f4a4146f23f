// mkernel — internal: the few CUDA driver entry points the runtime needs, found at run time through
// cudaGetDriverEntryPointByVersion (never linked: test binaries must load on machines without a driver).
#pragma once

#include <cuda.h>

namespace mk::runtime {

/// Driver entry points (the CUDA 12.0 ABI of each symbol).
struct DriverApi {
  CUresult (*streamWriteValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*streamWaitValue32)(CUstream, CUdeviceptr, cuuint32_t, unsigned int) = nullptr;
  CUresult (*getErrorName)(CUresult, const char**) = nullptr;
  CUresult (*pointerGetAttribute)(void*, CUpointer_attribute, CUdeviceptr) = nullptr;
  /// Base and size of the allocation holding an address (multi-process mode: what an IPC handle exports).
  CUresult (*memGetAddressRange)(CUdeviceptr*, size_t*, CUdeviceptr) = nullptr;
};

/// Resolved once; throws Error(Unsupported) naming the symbol when the driver lacks one.
const DriverApi& driverApi();

/// Throw Error(CudaError) "<what> failed: <CUDA_ERROR_...>" unless r == CUDA_SUCCESS.
void checkDriver(CUresult r, const char* what);

/// cuTensorMapEncodeTiled (CUDA 12.0 ABI): the TMA descriptors of the GEMM engine. Kept apart from DriverApi
/// so that a driver without it fails only the GEMM path.
using TensorMapEncodeTiledFn = CUresult (*)(CUtensorMap*, CUtensorMapDataType, cuuint32_t, void*, const cuuint64_t*,
                                            const cuuint64_t*, const cuuint32_t*, const cuuint32_t*,
                                            CUtensorMapInterleave, CUtensorMapSwizzle, CUtensorMapL2promotion,
                                            CUtensorMapFloatOOBfill);
/// Resolved once; throws Error(Unsupported) naming the symbol when the driver lacks it.
TensorMapEncodeTiledFn tensorMapEncodeTiled();

}  // namespace mk::runtime
