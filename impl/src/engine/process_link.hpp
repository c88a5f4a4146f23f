// mkernel — internal: what the processes of one multi-process communicator share after the bootstrap.
//
// * A POSIX shared-memory segment per node (created by the node's first rank, its name exchanged through the
//   bootstrap, unlinked once every rank mapped it, registered with cudaHostRegister so every GPU's kernel can write
//   it): the engine's StatusBlock (failure record, abort word), per-rank progress words, and the per-op post board
//   through which each rank tells the others where its buffers of op k are.
// * Device memory crosses processes as CUDA IPC handles of whole cudaMalloc allocations (IpcRef =
//   handle + offset), exported once per allocation (cached by the driver's buffer id) and opened once
//   per (peer, allocation) (cached too, closed at destruction).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "mk/bootstrap.hpp"
#include "mk/device/engine_device.hpp"

namespace mk::runtime {

/// Device memory of one process as another can map it. bufferId == 0: the null pointer.
struct IpcRef {
  cudaIpcMemHandle_t handle;
  uint64_t bufferId;  ///< CU_POINTER_ATTRIBUTE_BUFFER_ID of the allocation in the exporting process
  uint64_t offset;    ///< byte offset of the address inside the allocation
};
static_assert(sizeof(IpcRef) == 80);

/// One rank's part of op k, slot k % ringSlots of the post board. The owner writes every field, then
/// `seq` = k + 1 last (release); a reader acquires `seq` first.
struct alignas(64) OpPost {
  uint32_t seq;
  uint32_t fence;    ///< 1: this op touches user memory of this rank the previous op touched (kOpFence)
  uint64_t keyHash;  ///< FNV-1a of the op's cache key: every rank must submit the same op
  IpcRef input, output, scratch;
  char what[96];  ///< the op in words (for the mismatch message)
};

/// The shared segment's fixed part.
struct alignas(64) SharedHeader {
  device::StatusBlock status;  ///< first: 64-byte aligned at the segment's start
  uint32_t magic, nRanks, ringSlots, reserved;
  uint32_t finalized[device::kMaxRanks];  ///< ops whose descriptor rank q has written (post slots free below)
  uint32_t stopped[device::kMaxRanks];    ///< 1 once rank q's resident kernel left (memory may be freed)
  /// Rank q's process: its pid and start time (/proc/<pid>/stat, clock ticks after boot), written by rank q before
  /// the set-up barrier, so the others can tell a process that died from one that is slow (ProcessLink::goneRanks).
  int32_t pid[device::kMaxRanks];
  uint64_t startTicks[device::kMaxRanks];
};

/// Shared segment + IPC handle caches of one process of a multi-process communicator.
class ProcessLink {
 public:
  /// Collective over `boot`: each node's `leader` (its first rank) creates its node's segment, every rank maps and
  /// registers its leader's. Ranks are global: the post board has a slot per rank of the communicator, and only
  /// the ranks of this node use theirs.
  ProcessLink(Bootstrap& boot, uint32_t ringSlots, int leader);
  ~ProcessLink();
  ProcessLink(const ProcessLink&) = delete;
  ProcessLink& operator=(const ProcessLink&) = delete;

  int rank() const noexcept { return rank_; }
  int size() const noexcept { return size_; }
  SharedHeader& header() noexcept { return *header_; }
  /// The status block as the kernels address it.
  device::StatusBlock* statusDevice() const noexcept { return statusDevice_; }
  /// Slot of op `seq` of rank `q`.
  OpPost& post(uint32_t seq, int q) noexcept;

  /// Export `p` (device memory of this process's current device, or null). Throws Error(InvalidArgument)
  /// naming `what` when its allocation cannot be exported (not cudaMalloc memory).
  IpcRef exportPointer(const void* p, const std::string& what);
  /// `ref` of rank q mapped into this process (current device = this rank's). Throws Error(CudaError).
  void* importPointer(int q, const IpcRef& ref);
  /// Close every imported mapping (after this rank's kernel stopped and every peer's did).
  void closeImports() noexcept;
  /// Whether rank q's process (a rank of this node) has gone, or is going (killed and tearing down, a zombie),
  /// without having stopped its engine (SharedHeader::stopped). False for a process this one cannot see (another
  /// pid namespace: never watched). Reads /proc; needs no lock.
  bool gone(int q) const;
  /// The ranks for which gone() holds, as "rank 1 (pid 4242)" joined by ", "; empty when none.
  std::string goneRanks() const;

 private:
  int rank_ = 0, size_ = 1, leader_ = 0;
  uint32_t ringSlots_ = 0;
  size_t bytes_ = 0;
  void* base_ = nullptr;
  SharedHeader* header_ = nullptr;
  OpPost* posts_ = nullptr;
  device::StatusBlock* statusDevice_ = nullptr;
  bool registered_ = false;
  std::vector<bool> watched_;  ///< rank q's process was visible from here at set-up (same pid namespace)
  struct Export {
    cudaIpcMemHandle_t handle;
    uintptr_t base;
    size_t size;
  };
  std::map<uint64_t, Export> exports_;                 ///< by buffer id
  std::map<std::pair<int, uint64_t>, void*> imports_;  ///< by (rank, buffer id): mapped base
};

}  // namespace mk::runtime
