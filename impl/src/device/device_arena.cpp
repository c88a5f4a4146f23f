// mkernel — internal: DeviceArena (see device_arena.hpp).
#include "device/device_arena.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <limits>

#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk {

uint64_t ArenaCursor::take(uint64_t bytes) noexcept {
  const uint64_t start = (used_ + kAlign - 1) / kAlign * kAlign;
  if (bytes == 0 || start > capacity_ || bytes > capacity_ - start) return std::numeric_limits<uint64_t>::max();
  used_ = start + bytes;
  return start;
}

DeviceArena::~DeviceArena() { destroy(); }

void DeviceArena::reserve(int device, uint32_t rank, uint64_t bytes) {
  destroy();
  device_ = device;
  rank_ = rank;
  cursor_ = ArenaCursor(bytes);
  if (bytes == 0) return;
  MK_CUDA_CHECK(cudaMalloc(&base_, bytes));
}

void* DeviceArena::allocate(uint64_t bytes, const std::string& what) {
  if (!enabled()) {
    void* p = nullptr;
    MK_CUDA_CHECK(cudaMalloc(&p, bytes));
    return p;
  }
  const uint64_t offset = cursor_.take(bytes);
  if (offset == std::numeric_limits<uint64_t>::max())
    throw Error(ErrorCode::InvalidArgument,
                "the device arena of rank " + std::to_string(rank_) + " is full: " + what + " needs " +
                    std::to_string(bytes) + " bytes, " + std::to_string(cursor_.used()) + " of " +
                    std::to_string(cursor_.capacity()) +
                    " are in use; raise CommConfig::deviceArenaBytes (0 = allocate on demand)");
  return static_cast<char*>(base_) + offset;
}

void DeviceArena::release(void* p) noexcept {
  if (p != nullptr && !enabled()) cudaFree(p);
}

void DeviceArena::destroy() noexcept {
  if (base_ == nullptr) return;
  if (device_ >= 0) cudaSetDevice(device_);
  cudaFree(base_);
  base_ = nullptr;
  cursor_ = ArenaCursor(0);
}

}  // namespace mk
