#include "mk/device_info.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

namespace mk {

int cudaDeviceCountOrZero(std::string* why) noexcept {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err != cudaSuccess) {
    // The statically linked runtime reports a missing driver as "insufficient driver"; say what it means.
    void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
    if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY);
    if (!driver) {
      if (why) *why = "no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)";
      cudaGetLastError();
      return 0;
    }
    dlclose(driver);
    if (why) *why = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
    cudaGetLastError();  // clear the sticky-free error so later calls start clean
    return 0;
  }
  if (n == 0 && why) *why = "the CUDA driver reports no device";
  return n;
}

bool peerAccessPossible(int a, int b) noexcept {
  int ab = 0, ba = 0;
  if (cudaDeviceCanAccessPeer(&ab, a, b) != cudaSuccess || cudaDeviceCanAccessPeer(&ba, b, a) != cudaSuccess) {
    cudaGetLastError();
    return false;
  }
  return ab && ba;
}

}  // namespace mk
