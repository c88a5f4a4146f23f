// mkernel — internal: the host side of the resident kernel's compute lanes (Gemm and Attention steps).
//
// Per op, every local rank whose program has Gemm or Attention steps needs one device-memory block: GemmParams (one
// per Gemm step: the TMA tensor maps of the op's A, B and C addresses, the sizes and tile choice of the lowering),
// then AttentionParams (one per Attention step: the maps of Q, K and V, the shape)
// whose address the op's binding table carries (mk/device/compute_lane_device.hpp). Tensor maps embed
// global addresses, so the block depends on the op's bindings: GemmLaneBinder builds it on the host
// (cuTensorMapEncodeTiled through the driver entry point), copies it into device memory once, and keeps it
// by (program, addresses of the rank's buffers). An op whose addresses repeat costs one map lookup; a new
// address set costs the encodes and one small host-to-device copy. Blocks are recycled only once the last
// op that used them has completed on every rank (never freed while the kernel runs: cudaFree would wait
// for it).
//
// The binders of a communicator live in a registry keyed by its engine (engine/finalize.cpp calls
// gemmLaneBinder() while it writes an op's descriptor, engine/teardown.cpp releaseGemmLaneBinders() once its
// kernels have stopped).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <map>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "device/device_arena.hpp"
#include "gemm/gemm_lane_params.hpp"
#include "lowering/lowering.hpp"
#include "mk/device/compute_lane_device.hpp"

namespace mk::runtime {

/// The GemmParams blocks of one rank (one GPU).
class GemmLaneBinder {
 public:
  /// `waitLimitNs`: the communicator's pollBudget; the engine's mbarrier waits get gemmLaneWaitLimitNs() of it.
  /// `arena`: where the blocks come from (nullptr: cudaMalloc / cudaFree); it must outlive release().
  GemmLaneBinder(int device, uint32_t rank, uint64_t waitLimitNs, DeviceArena* arena = nullptr);
  ~GemmLaneBinder();
  GemmLaneBinder(const GemmLaneBinder&) = delete;
  GemmLaneBinder& operator=(const GemmLaneBinder&) = delete;

  /// Device address of the GemmParams block of `program` (this rank's, with nGemms > 0; `programKey`
  /// identifies it, e.g. its device copy) for op `seq` whose binding table is `table` (global binding
  /// index rank * nBuffers + buffer). `completed`: ops complete on every rank (blocks of older ops may be
  /// recycled). Copies through `copyStream` (waited for) on a miss. Throws Error on a driver failure.
  uint64_t bind(const LoweredProgram& program, const void* programKey, const uint64_t* table, uint32_t seq,
                uint32_t completed, cudaStream_t copyStream);
  /// "" normally; after a Gemm step's wait expired and the kernel trapped, who waited for what (read from
  /// host-mapped memory the kernel wrote before trapping), naming rank, lane and step.
  std::string timeoutReport() const;
  /// Free every block and the report (the kernel must have stopped).
  void release() noexcept;

 private:
  struct Block {
    void* device = nullptr;
    size_t bytes = 0;
    uint32_t lastSeq = 0;
  };
  using Key = std::pair<const void*, std::vector<uint64_t>>;

  int device_;
  uint32_t rank_;
  uint64_t waitLimitNs_;
  DeviceArena* arena_ = nullptr;
  uint32_t* report_ = nullptr;  ///< host-mapped, 8 words (GemmParams::timeoutReport)
  std::map<Key, Block> blocks_;
  std::vector<Block> free_;           ///< recycled device memory (its last op completed)
  std::set<uint32_t> attentionTags_;  ///< report tags (lane << 16 | step) of Attention steps bound so far
};

/// The binder of (engine, rank), created on first use.
/// `arena` is used only when the binder is created here (the first call for the pair).
GemmLaneBinder& gemmLaneBinder(const void* engine, uint32_t rank, int device, uint64_t waitLimitNs,
                               DeviceArena* arena = nullptr);
/// Report of (engine, rank)'s binder, "" when none or no timeout.
std::string gemmLaneTimeoutReport(const void* engine, uint32_t rank);
/// Forget the binders of `engine`; free their memory when `freeMemory` (its kernels have stopped), else leak it
/// (a kernel that never stopped may still read it), so that a later engine at the same address starts clean.
void releaseGemmLaneBinders(const void* engine, bool freeMemory) noexcept;

}  // namespace mk::runtime
