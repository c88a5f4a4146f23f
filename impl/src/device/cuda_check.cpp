#include "mk/cuda_check.hpp"

namespace mk {

void throwCudaError(cudaError_t err, const char* expr, const char* file, int line) {
  throw Error(ErrorCode::CudaError, std::string(expr) + " failed at " + file + ":" + std::to_string(line) + ": " +
                                        cudaGetErrorName(err) + ": " + cudaGetErrorString(err));
}

}  // namespace mk
