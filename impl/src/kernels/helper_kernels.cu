// mkernel — the engine's two small helper kernels: the stream hand-off of one op (StreamHandoff::Kernel) and the
// clock probe the host calibrates %globaltimer against. Separate from the resident kernel; loaded with it
// (preloadKernels), as any kernel first launched while it runs must be.
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
__global__ void handoffKernel(uint32_t* bell, uint32_t bellValue, const uint32_t* complete, uint32_t waitFor, int wait,
                              const uint32_t* abortWord, uint64_t budgetNs) {
  if (threadIdx.x != 0) return;
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
  return e;
}

cudaError_t launchHandoff(uint32_t* bell, uint32_t bellValue, const uint32_t* complete, uint32_t waitFor, bool wait,
                          const uint32_t* abortWord, uint64_t budgetNs, cudaStream_t stream) {
  device::handoffKernel<<<1, 32, 0, stream>>>(bell, bellValue, complete, waitFor, wait ? 1 : 0, abortWord, budgetNs);
  return cudaGetLastError();
}

cudaError_t launchClockProbe(const uint32_t* ping, uint64_t* pong, uint32_t rounds, uint64_t budgetNs,
                             cudaStream_t stream) {
  device::clockProbeKernel<<<1, 32, 0, stream>>>(ping, pong, rounds, budgetNs);
  return cudaGetLastError();
}

}  // namespace mk::runtime
