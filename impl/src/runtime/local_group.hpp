// mkernel — internal: the state every rank of a single-process communicator shares.
//
// The seams for the multi-process modes (phase 2): everything a rank needs from its peers goes through
// `peerState` (their RankState as this GPU addresses it), `scratchOf` (their scratch arenas) and the
// per-op address table. In one process these come from cudaDeviceEnablePeerAccess and plain pointers; a
// bootstrap (MPI / TCP rendezvous) will exchange CUDA IPC or cuMem handles for the same three things,
// and user buffers of peers will be registered rather than taken from the peer's call.
#pragma once

#include <cuda_runtime_api.h>

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <functional>
#include <string>
#include <tuple>
#include <vector>

#include "lowering.hpp"
#include "mk/communicator.hpp"
#include "mk/device/engine_device.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

/// A schedule lowered and uploaded for every rank, generated once per key.
struct CachedSchedule {
  Schedule schedule;
  std::string what;  ///< "allreduce one-shot float32 sum count 1021" (for diagnostics)
  std::vector<LoweredProgram> programs;   ///< per rank
  std::vector<void*> devicePrograms;      ///< per rank, on that rank's GPU
  uint64_t scratchBytes = 0;
  uint64_t inputBytes = 0, outputBytes = 0;  ///< per rank (collectives; 0 for custom schedules)
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
  bool launched = false;
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
  uint32_t calls = 0;
};

/// Shared state of a local group; Communicator holds it through shared_ptr.
class LocalGroup {
 public:
  LocalGroup(const std::vector<int>& devices, const CommConfig& config);
  ~LocalGroup();
  LocalGroup(const LocalGroup&) = delete;
  LocalGroup& operator=(const LocalGroup&) = delete;

  int size() const noexcept { return static_cast<int>(ranks_.size()); }
  const RankResources& rank(int r) const { return ranks_[r]; }
  const Topology& topology() const noexcept { return topology_; }
  uint32_t workers() const noexcept { return workers_; }
  const CommConfig& config() const noexcept { return config_; }

  /// Submit one rank's part of a collective / custom schedule (see Communicator).
  void submitCollective(int r, const CollectiveSpec& spec, const GenOptions& gen, const void* send, void* recv,
                        cudaStream_t stream);
  void submitSchedule(int r, const Schedule& s, const void* input, void* output, cudaStream_t stream);

  std::string chooseAlgorithm(CollOp op, uint64_t count, DType dtype);
  GenOptions chooseGenOptions(CollOp op, uint64_t count, DType dtype) const;

  void synchronize(int r);
  uint64_t submitted(int r);
  OpTiming opTiming(int r, uint64_t op);
  ClockSync calibrateClock(int r, int rounds);
  std::vector<TraceEvent> takeTrace(int r);
  /// Enqueue the completion wait for op `seq` (0-based) of rank r on `stream` (groupEnd uses it).
  void enqueueWait(int r, cudaStream_t stream, uint32_t seq);

 private:
  void init(const std::vector<int>& devices);
  void launchKernels();
  void shutdown() noexcept;
  void releaseMemory() noexcept;

  /// Throws the first failure (poisoned communicator or a device-side abort).
  void throwIfFailedLocked(bool deep = false);
  [[noreturn]] void poisonAndThrow(ErrorCode code, const std::string& message);
  std::string describeDeviceFailure() const;

  std::string chooseAlgorithmLocked(CollOp op, uint64_t count, DType dtype);
  CachedSchedule& cacheLocked(const std::string& key, const std::function<Schedule()>& make, uint64_t inBytes,
                              uint64_t outBytes, const std::string& what);
  void ensureScratchLocked(uint64_t bytes);
  void* stagingLocked(int r, uint32_t seq, uint64_t bytes);
  void submitLocked(int r, const std::string& key, CachedSchedule& sched, const void* send, void* recv,
                    uint64_t inBytes, uint64_t outBytes, cudaStream_t stream);
  void waitRingSpaceLocked(int r, uint32_t seq);
  void finalizeLocked(uint32_t seq, PendingOp& op);
  uint32_t fetched(int r) const;
  uint32_t completed(int r) const;

  CommConfig config_;
  Topology topology_;
  uint32_t workers_ = 0;
  uint32_t ringSlots_ = 0;
  std::vector<RankResources> ranks_;

  // Host-mapped blocks (pinned, portable, mapped; one allocation each).
  device::StatusBlock* status_ = nullptr;
  device::OpDescriptor* ring_ = nullptr;
  device::RankMailbox* mailboxes_ = nullptr;    // [nRanks]
  device::TraceRecord* trace_ = nullptr;        // [nRanks][traceCapacity]
  std::vector<uint32_t> traceTaken_;            // records already returned per rank
  uint32_t* clockPing_ = nullptr;               // clock probe mailbox (host-mapped)
  uint64_t* clockPong_ = nullptr;

  std::mutex mu_;
  std::string poison_;  ///< first failure; non-empty = unusable
  ErrorCode poisonCode_ = ErrorCode::Internal;
  std::map<std::string, std::unique_ptr<CachedSchedule>> cache_;
  std::map<std::tuple<int, uint64_t, int>, std::string> autoCache_;  ///< "auto" choices
  std::map<uint32_t, PendingOp> pending_;  ///< ops not yet submitted by every rank, by sequence number
  std::vector<const CachedSchedule*> opSchedule_;  ///< [seq % ringSlots]: what each recent op ran
  std::vector<std::pair<uintptr_t, uintptr_t>> prevReads_, prevWrites_;  ///< user ranges of the last finalized op
  uint32_t finalized_ = 0;  ///< ops whose descriptor was written
  uint64_t scratchBytes_ = 0;
};

}  // namespace mk::runtime
