#include "mk/device_info.hpp"

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include "mk/error.hpp"

namespace mk {

// cudaStartupErrorCode (models, no CUDA header) takes these by value.
static_assert(cudaErrorNoDevice == 100 && cudaErrorInsufficientDriver == 35);

namespace {

bool driverLoadable() noexcept {
  void* driver = dlopen("libcuda.so.1", RTLD_LAZY | RTLD_NOLOAD);
  if (!driver) driver = dlopen("libcuda.so.1", RTLD_LAZY);
  if (driver) dlclose(driver);
  return driver != nullptr;
}

}  // namespace

int requireCudaDevices() {
  int n = 0;
  const cudaError_t err = cudaGetDeviceCount(&n);
  if (err == cudaSuccess && n > 0) return n;
  cudaGetLastError();
  if (err == cudaSuccess) throw Error(ErrorCode::NoDevice, "no GPU: the NVIDIA driver reports no CUDA device");
  const bool loadable = driverLoadable();
  const ErrorCode code = cudaStartupErrorCode(static_cast<int>(err), loadable);
  const std::string seen = std::string("cudaGetDeviceCount: ") + cudaGetErrorName(err) + ": " + cudaGetErrorString(err);
  if (code == ErrorCode::NoDevice)
    throw Error(code, loadable
                          ? "no GPU: " + seen
                          : std::string("no GPU: no NVIDIA driver on this machine (libcuda.so.1 cannot be loaded)"));
  if (code == ErrorCode::DriverTooOld)
    throw Error(code, "the NVIDIA driver is too old for this build's CUDA runtime (" + seen +
                          "): install a newer driver, or build with the CUDA toolkit the driver supports");
  throw Error(code, seen);
}

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
