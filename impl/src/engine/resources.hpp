// mkernel — internal: the records the engine keeps: a lowered schedule per cache key, the resources of each
// rank, and each op while its ranks' calls are assembled (engine/engine.hpp holds them).
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "device/device_arena.hpp"
#include "lowering/lowering.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk::runtime {

/// A schedule lowered and uploaded for every rank, generated once per key.
struct CachedSchedule {
  Schedule schedule;
  std::string what;  ///< "allreduce one-shot float32 sum count 1021" (for diagnostics)
  std::vector<LoweredProgram> programs;   ///< per rank
  std::vector<void*> devicePrograms;      ///< per rank, on that rank's GPU (null for ranks of other processes)
  uint64_t scratchBytes = 0;
};

/// Engine resources of one rank.
struct RankResources {
  int device = -1;
  cudaStream_t kernelStream = nullptr;  ///< runs the resident kernel (non-blocking)
  cudaStream_t copyStream = nullptr;    ///< uploads (non-blocking: never waits for user streams)
  device::RankState* state = nullptr;
  uint32_t* doorbell = nullptr;
  device::OpStamp* stamps = nullptr;  ///< ringSlots entries, device memory
  std::array<void*, device::kSlots> scratch{};
  uint64_t scratchBytes = 0;
  std::array<void*, device::kSlots> staging{};
  uint64_t stagingBytes = 0;
  std::vector<void*> retired;  ///< device allocations freed once the kernel stopped
  /// Where programs, scratch, staging and compute-lane blocks come from (CommConfig::deviceArenaBytes).
  std::unique_ptr<DeviceArena> arena;
  bool launched = false;
  int8_t kernelHandoff = -1;  ///< 1: StreamHandoff::Kernel on this rank, 0: MemOps, -1: not decided yet
  uint32_t submitted = 0;  ///< ops submitted by this rank
};

/// An op being assembled from the calls of every rank.
struct PendingOp {
  std::string key;
  CachedSchedule* sched = nullptr;
  std::vector<bool> called;
  std::vector<const void*> input;  ///< bound input per rank (staging when staged)
  std::vector<void*> output;
  std::vector<std::pair<uintptr_t, uintptr_t>> reads, writes;  ///< user byte ranges per rank (fence rule)
  uint32_t calls = 0;    ///< local ranks that called
  bool posted = false;   ///< multi-process: this rank's post of the op is on the board
};

}  // namespace mk::runtime
