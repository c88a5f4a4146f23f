// mkernel — CUDA runtime error checking for host code.
#pragma once

#include <cuda_runtime_api.h>

#include <string>

#include "mk/error.hpp"

namespace mk {

/// Throws Error(CudaError) "<expr> failed at <file>:<line>: <cudaErrorName>: <description>".
[[noreturn]] void throwCudaError(cudaError_t err, const char* expr, const char* file, int line);

}  // namespace mk

/// Evaluate a CUDA runtime call once; throw mk::Error(CudaError) naming the call, place and error on failure.
#define MK_CUDA_CHECK(expr)                                                                     \
  do {                                                                                          \
    const cudaError_t mkCudaErr_ = (expr);                                                      \
    if (mkCudaErr_ != cudaSuccess) ::mk::throwCudaError(mkCudaErr_, #expr, __FILE__, __LINE__); \
  } while (0)
