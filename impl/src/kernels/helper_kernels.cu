// mkernel — the engine's small helper kernels: the stream hand-off of one op (StreamHandoff::Kernel), its captured
// form (graph capture: a replay's first node and each op's hand-off) and the clock probe the host calibrates
// %globaltimer against. Separate from the resident kernel; loaded with it (preloadKernels), as any kernel first
// launched while it runs must be.
#include <cuda_runtime.h>

#include <cstdint>

#include "mk/device/poll_device.hpp"
#include "resident_kernel.hpp"

namespace mk::device {
namespace {

/// The stream hand-off of one op (StreamHandoff::Kernel), run on the caller's stream: ring the op's doorbell
/// (when `bell` is set) once the stream's earlier work is done, then hold the stream until `complete`
/// reaches `waitFor` (when `wait` is set). Measured against a stream memory write + wait pair
/// (mk-probe-latency): the front end deschedules a memory wait that is not met at once and takes 7-9 us
/// to come back, while this kernel releases the stream about 2.3 us after the answer. Bounded: it leaves
/// after `budgetNs` or once the group aborted (the host then reports the failure).
__device__ __forceinline__ void handoffBody(uint32_t* bell, uint32_t bellValue, const uint32_t* complete,
                                            uint32_t waitFor, int wait, const uint32_t* abortWord, uint64_t budgetNs) {
  if (bell) {
    fenceSys();  // the stream's earlier writes (finished kernels and copies) before the doorbell
    storeRelaxed(bell, bellValue);
  }
  if (!wait) return;
  const uint64_t t0 = globalTimerNs();
  for (uint32_t spins = 1;; ++spins) {
    if (seqGeq(loadVolatile(complete), waitFor)) break;
    if ((spins & 63u) == 0u && (loadVolatile(abortWord) != 0u || globalTimerNs() - t0 > budgetNs)) break;
  }
  fenceGpu();  // acquire: the engine released `complete` after every rank's writes into this GPU
}

__global__ void handoffKernel(uint32_t* bell, uint32_t bellValue, const uint32_t* complete, uint32_t waitFor, int wait,
                              const uint32_t* abortWord, uint64_t budgetNs) {
  if (threadIdx.x != 0) return;
  handoffBody(bell, bellValue, complete, waitFor, wait, abortWord, budgetNs);
}

/// Graph capture (engine/capture.hpp): the first node of a captured rank's ops, once per replay. Launches of one
/// executable graph run one after another, so its n-th run is the host's n-th launch: it takes that launch's first
/// op number from the host's cell and leaves it in device memory for the op nodes after it. A replay the host never
/// authorised (cudaGraphLaunch instead of mk::GraphExec::launch) would ring doorbells of op numbers nobody gave
/// out: it records the replay in `misused` and stops the context (the host names the cause: capture.cpp). No
/// printf here: a kernel using it makes CUDA set up its print buffer at the graph's instantiation, which waits for
/// the device to go idle — never, beside a resident kernel.
__global__ void graphBeginKernel(GraphCells* cells, uint32_t* base) {
  if (threadIdx.x != 0) return;
  const uint32_t n = loadVolatile(&cells->begun);
  if (!seqGeq(loadVolatile(&cells->authorized), n + 1)) {
    storeRelaxed(&cells->misused, n + 1);
    fenceSys();
    __trap();
  }
  fenceSys();  // acquire: the host wrote the launch's base before it authorised the launch
  *base = loadVolatile(&cells->base[n % kGraphCells]);
  storeRelaxed(&cells->begun, n + 1);  // the host may reuse cell n % kGraphCells
}

/// The hand-off of captured op `offset` of a replay: the op's number is the replay's base + offset (left by
/// graphBeginKernel earlier in the same graph); otherwise as handoffKernel, the doorbell being that op's ring slot.
__global__ void graphHandoffKernel(const uint32_t* base, uint32_t offset, uint32_t* doorbells, uint32_t slots, int ring,
                                   const uint32_t* complete, int wait, const uint32_t* abortWord, uint64_t budgetNs) {
  if (threadIdx.x != 0) return;
  const uint32_t seq = *base + offset;
  handoffBody(ring ? &doorbells[seq % slots] : nullptr, seq + 1, complete, seq + 1, wait, abortWord, budgetNs);
}

__global__ void clockProbeKernel(const uint32_t* ping, uint64_t* pong, uint32_t rounds, uint64_t budgetNs) {
  if (threadIdx.x != 0) return;
  for (uint32_t i = 1; i <= rounds; ++i) {
    const uint64_t start = globalTimerNs();
    while (loadVolatile(ping) != i) {
      if (globalTimerNs() - start > budgetNs || loadVolatile(ping) == 0xFFFFFFFFu) return;
    }
    storeRelaxed(&pong[0], globalTimerNs());
    storeRelease(reinterpret_cast<uint32_t*>(&pong[1]), i);
  }
}

}  // namespace
}  // namespace mk::device

namespace mk::runtime {

cudaError_t preloadHelperKernels() {
  cudaFuncAttributes attr{};
  cudaError_t e = cudaFuncGetAttributes(&attr, device::clockProbeKernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, device::handoffKernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, device::graphBeginKernel);
  if (e == cudaSuccess) e = cudaFuncGetAttributes(&attr, device::graphHandoffKernel);
  return e;
}

cudaError_t launchHandoff(uint32_t* bell, uint32_t bellValue, const uint32_t* complete, uint32_t waitFor, bool wait,
                          const uint32_t* abortWord, uint64_t budgetNs, cudaStream_t stream) {
  device::handoffKernel<<<1, 32, 0, stream>>>(bell, bellValue, complete, waitFor, wait ? 1 : 0, abortWord, budgetNs);
  return cudaGetLastError();
}

cudaError_t launchGraphBegin(device::GraphCells* cells, uint32_t* base, cudaStream_t stream) {
  device::graphBeginKernel<<<1, 32, 0, stream>>>(cells, base);
  return cudaGetLastError();
}

cudaError_t launchGraphHandoff(const uint32_t* base, uint32_t offset, uint32_t* doorbells, uint32_t slots, bool ring,
                               const uint32_t* complete, bool wait, const uint32_t* abortWord, uint64_t budgetNs,
                               cudaStream_t stream) {
  device::graphHandoffKernel<<<1, 32, 0, stream>>>(base, offset, doorbells, slots, ring ? 1 : 0, complete, wait ? 1 : 0,
                                                   abortWord, budgetNs);
  return cudaGetLastError();
}

const void* graphBeginKernelAddress() { return reinterpret_cast<const void*>(device::graphBeginKernel); }

cudaError_t launchClockProbe(const uint32_t* ping, uint64_t* pong, uint32_t rounds, uint64_t budgetNs,
                             cudaStream_t stream) {
  device::clockProbeKernel<<<1, 32, 0, stream>>>(ping, pong, rounds, budgetNs);
  return cudaGetLastError();
}

}  // namespace mk::runtime
