#include "mk/cuda_check.hpp"

#include "mk/device_info.hpp"

namespace mk {

void throwCudaError(cudaError_t err, const char* expr, const char* file, int line) {
  // The first CUDA call of a tool on a machine without a usable GPU: say "no GPU" or "driver too old" (exit 3 or 4,
  // mk::cli::exitCodeFor), not a bare runtime error. requireCudaDevices throws that error with its reason.
  if (err == cudaErrorNoDevice || err == cudaErrorInsufficientDriver) requireCudaDevices();
  throw Error(ErrorCode::CudaError, std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace mk
