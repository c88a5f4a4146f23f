// mkernel — internal: where a communicator's late device allocations come from (CommConfig::deviceArenaBytes).
//
// By default every device buffer the engine needs after creation (lowered programs, scratch and staging
// arenas, compute-lane parameter blocks) is a cudaMalloc at first use. With an arena, one block per rank is
// allocated at creation, before the resident kernel starts, and those buffers are carved from it. Two reasons:
// compute-sanitizer memcheck checks a running kernel's accesses against the allocations that existed when it
// was launched (docs/gpu-engine.md, "memcheck and the resident kernel"), and no cudaMalloc lands on the
// submission path. Carved buffers are never handed back before the communicator is destroyed (the engine
// keeps what it allocates: programs are cached, outgrown scratch is retired, not freed), so a bump pointer
// is the whole allocator.
#pragma once

#include <cstdint>
#include <string>

namespace mk {

/// The arithmetic of a bump allocator over [0, capacity): offsets aligned to `kAlign`. Host-only, no CUDA
/// (unit-tested on its own).
class ArenaCursor {
 public:
  /// Alignment of every carved buffer: TMA descriptors need 64 bytes, cudaMalloc gives 256.
  static constexpr uint64_t kAlign = 256;
  explicit ArenaCursor(uint64_t capacity = 0) : capacity_(capacity) {}
  /// Offset of `bytes` more bytes (>= 1), or UINT64_MAX when they do not fit (nothing changes then).
  uint64_t take(uint64_t bytes) noexcept;
  uint64_t used() const noexcept { return used_; }
  uint64_t capacity() const noexcept { return capacity_; }

 private:
  uint64_t capacity_ = 0;
  uint64_t used_ = 0;
};

/// One rank's late device allocations: carved from a block reserved at creation when CommConfig::
/// deviceArenaBytes > 0, plain cudaMalloc / cudaFree otherwise.
class DeviceArena {
 public:
  DeviceArena() = default;
  ~DeviceArena();
  DeviceArena(const DeviceArena&) = delete;
  DeviceArena& operator=(const DeviceArena&) = delete;

  /// Reserve `bytes` on `device` (current device is set); 0 = no arena (allocate on demand). `rank` names it
  /// in errors. Throws Error(CudaError) when the block cannot be allocated.
  void reserve(int device, uint32_t rank, uint64_t bytes);
  bool enabled() const noexcept { return base_ != nullptr; }
  /// The reserved block (null without an arena).
  void* base() const noexcept { return base_; }
  /// `bytes` (>= 1) of device memory on the arena's device (the caller made it current), 256-byte aligned.
  /// `what` names the buffer in the error thrown when the arena is full (Error(InvalidArgument): raise
  /// CommConfig::deviceArenaBytes) or cudaMalloc fails (Error(CudaError)).
  void* allocate(uint64_t bytes, const std::string& what);
  /// Give back a buffer from allocate(): cudaFree without an arena, nothing with one (the block goes at
  /// destruction). The resident kernel must not be using it.
  void release(void* p) noexcept;
  /// Free the reserved block (the kernel must have stopped); allocate() is plain cudaMalloc afterwards.
  void destroy() noexcept;
  uint64_t used() const noexcept { return cursor_.used(); }

 private:
  void* base_ = nullptr;
  int device_ = -1;
  uint32_t rank_ = 0;
  ArenaCursor cursor_;
};

}  // namespace mk
