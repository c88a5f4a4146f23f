// mkernel — internal: host entry points of the resident kernel (resident_kernel.cu) and its helper kernels
// (helper_kernels.cu); no device code.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "mk/device/engine_device.hpp"

namespace mk::runtime {

/// Threads per CTA the kernel is compiled for at most (__launch_bounds__).
inline constexpr int kMaxThreadsPerCta = 512;

/// Blocks of the resident kernel one SM can hold with `threads` per block (cudaOccupancy...).
int residentBlocksPerSm(bool trace, int threads);
/// Load every kernel of the engine on the current device now. With CUDA's lazy module loading, the first
/// launch of a kernel loads it and that load waits for the device to go idle — which never happens while
/// the resident kernel runs: any kernel first launched after it would deadlock.
cudaError_t preloadKernels();
/// Load the helper kernels (hand-off, clock probe; helper_kernels.cu): part of preloadKernels.
cudaError_t preloadHelperKernels();
/// Launch the resident kernel for one rank (grid = h.nWorkers + 1) on `stream` of the current device.
cudaError_t launchResident(const device::EngineDeviceHandle& h, bool trace, int threads, cudaStream_t stream);

/// One-warp kernel on the caller's stream (StreamHandoff::Kernel): when `bell` is not null, store
/// `bellValue` there (system fence first); then, when `wait`, spin until *complete >= waitFor (cyclic) or
/// *abortWord != 0 or `budgetNs` passed.
cudaError_t launchHandoff(uint32_t* bell, uint32_t bellValue, const uint32_t* complete, uint32_t waitFor, bool wait,
                          const uint32_t* abortWord, uint64_t budgetNs, cudaStream_t stream);

/// Graph capture (engine/capture.hpp): the first node of a rank's captured ops (device::GraphCells -> *base), and
/// the hand-off of captured op `offset` (doorbells[(base + offset) % slots] when `ring`, then the wait when `wait`).
cudaError_t launchGraphBegin(device::GraphCells* cells, uint32_t* base, cudaStream_t stream);
cudaError_t launchGraphHandoff(const uint32_t* base, uint32_t offset, uint32_t* doorbells, uint32_t slots, bool ring,
                               const uint32_t* complete, bool wait, const uint32_t* abortWord, uint64_t budgetNs,
                               cudaStream_t stream);
/// The host address of the first node's kernel (GraphExec finds a graph's captured ops by it).
const void* graphBeginKernelAddress();

// ---- compute lanes (CommConfig::computeLanes; mk/device/compute_lane_device.hpp) ----
/// Blocks of the compute-capable resident kernel (384 threads, kComputeSmemBytes of dynamic shared memory)
/// one SM can hold (1 on sm_90), or -1 when the kernel cannot be prepared on the current device.
int residentComputeBlocksPerSm(bool trace);
/// Allow the compute-capable kernels their dynamic shared memory on the current device.
cudaError_t prepareResidentCompute();
/// Launch the compute-capable resident kernel for one rank (grid = h.nWorkers + 1, 384 threads).
cudaError_t launchResidentCompute(const device::EngineDeviceHandle& h, bool trace, cudaStream_t stream);

/// One-block kernel answering `rounds` host pings with %globaltimer (clock calibration): waits until
/// *ping == i, writes pong[0] = timer then pong[1] = i (release), for i = 1..rounds; gives up after
/// `budgetNs` without a ping.
cudaError_t launchClockProbe(const uint32_t* ping, uint64_t* pong, uint32_t rounds, uint64_t budgetNs,
                             cudaStream_t stream);

}  // namespace mk::runtime
