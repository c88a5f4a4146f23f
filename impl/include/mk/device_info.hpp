// mkernel — what CUDA devices this process can use, asked without ever throwing.
#pragma once

#include <string>

namespace mk {

/// Number of usable CUDA devices; 0 with `why` filled ("no CUDA driver", "no device", ...) when none.
/// Safe on machines without a driver: the runtime is linked statically and only reports an error.
int cudaDeviceCountOrZero(std::string* why = nullptr) noexcept;

/// True when devices a and b can map each other's memory (cudaDeviceCanAccessPeer both ways).
bool peerAccessPossible(int a, int b) noexcept;

}  // namespace mk
