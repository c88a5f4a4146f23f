// mkernel — internal: the engine's host-mapped allocations (pinned, portable, mapped, zeroed) and their device
// address, which unified addressing makes the host pointer itself (checked).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstring>

#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

/// `count` zeroed objects of host-mapped memory, addressed by every device of the process.
template <class T>
T* hostAlloc(size_t count) {
  void* p = nullptr;
  MK_CUDA_CHECK(cudaHostAlloc(&p, count * sizeof(T), cudaHostAllocMapped | cudaHostAllocPortable));
  std::memset(p, 0, count * sizeof(T));
  return static_cast<T*>(p);
}

/// Host-mapped memory is addressed by the same pointer on every device (UVA); checked once here.
template <class T>
T* devicePointer(T* host) {
  void* d = nullptr;
  MK_CUDA_CHECK(cudaHostGetDevicePointer(&d, host, 0));
  if (d != host)
    throw Error(ErrorCode::Unsupported, "host-mapped memory has a different device address (no unified addressing?)");
  return static_cast<T*>(d);
}

}  // namespace mk::runtime
