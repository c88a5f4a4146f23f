#include "device/driver_api.hpp"

#include <cuda_runtime_api.h>

#include <string>

#include "mk/error.hpp"

namespace mk::runtime {
namespace {

template <class Fn>
void resolve(const char* symbol, Fn& out) {
  void* fn = nullptr;
  cudaDriverEntryPointQueryResult status = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &fn, 12000, cudaEnableDefault, &status);
  if (err != cudaSuccess || status != cudaDriverEntryPointSuccess || fn == nullptr) {
    cudaGetLastError();
    throw Error(ErrorCode::Unsupported, std::string("CUDA driver entry point ") + symbol +
                                            " (ABI 12.0) is not available: " + cudaGetErrorName(err) +
                                            " (the GPU engine needs a CUDA 12+ driver with stream memory operations)");
  }
  out = reinterpret_cast<Fn>(fn);
}

DriverApi load() {
  DriverApi api;
  resolve("cuStreamWriteValue32", api.streamWriteValue32);
  resolve("cuStreamWaitValue32", api.streamWaitValue32);
  resolve("cuGetErrorName", api.getErrorName);
  resolve("cuPointerGetAttribute", api.pointerGetAttribute);
  resolve("cuMemGetAddressRange", api.memGetAddressRange);
  return api;
}

}  // namespace

const DriverApi& driverApi() {
  static const DriverApi api = load();
  return api;
}

void checkDriver(CUresult r, const char* what) {
  if (r == CUDA_SUCCESS) return;
  const char* name = "unknown CUresult";
  if (driverApi().getErrorName) driverApi().getErrorName(r, &name);
  throw Error(ErrorCode::CudaError, std::string(what) + " failed: " + name);
}

TensorMapEncodeTiledFn tensorMapEncodeTiled() {
  static const TensorMapEncodeTiledFn fn = [] {
    TensorMapEncodeTiledFn f = nullptr;
    resolve("cuTensorMapEncodeTiled", f);
    return f;
  }();
  return fn;
}

}  // namespace mk::runtime
