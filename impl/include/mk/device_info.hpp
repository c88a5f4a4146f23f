// mkernel — what CUDA devices this process can use, asked without ever throwing.
#pragma once

#include <string>

namespace mk {

/// Number of usable CUDA devices; 0 with `why` filled ("no CUDA driver", "no device", ...) when none.
/// Safe on machines without a driver: the runtime is linked statically and only reports an error.
int cudaDeviceCountOrZero(std::string* why = nullptr) noexcept;

/// Number of usable CUDA devices (>= 1), for a tool about to use them. Throws Error(NoDevice) "no GPU: <why>"
/// when the machine has no NVIDIA driver or the driver sees no device, Error(DriverTooOld) when the driver is
/// older than the CUDA runtime of this build, Error(CudaError) for any other failure (mk::cli::exitCodeFor
/// turns them into exit codes 3, 4 and 2).
int requireCudaDevices();

/// True when devices a and b can map each other's memory (cudaDeviceCanAccessPeer both ways).
bool peerAccessPossible(int a, int b) noexcept;

}  // namespace mk
