// mkernel — internal to the resident kernel: the shared-memory mbarrier operations its control block hands ops
// over with (init, arrive, non-blocking test and acquire by parity). Included by resident_kernel.cu only.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace mk::device {
namespace {

__device__ __forceinline__ uint32_t mbarAddr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbarInit(uint64_t* bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(mbarAddr(bar)), "r"(count) : "memory");
}
/// Arrive (release, CTA scope): one of the arrivals the barrier's current phase expects.
__device__ __forceinline__ void mbarArrive(uint64_t* bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(mbarAddr(bar)) : "memory");
}
/// Non-blocking (acquire, CTA scope): true once the phase of parity `parity` has completed.
__device__ __forceinline__ bool mbarDone(uint64_t* bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.test_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(mbarAddr(bar)), "r"(parity)
               : "memory");
  return done != 0;
}
/// Acquire a phase some lane of this warp already saw complete (try_wait: returns at once then). The lanes
/// that did not poll acquire this way: racecheck models try_wait as a barrier wait.
__device__ __forceinline__ void mbarAcquire(uint64_t* bar, uint32_t parity) {
  uint32_t done = 0;
  while (!done)
    asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
                 : "=r"(done)
                 : "r"(mbarAddr(bar)), "r"(parity)
                 : "memory");
}

}  // namespace
}  // namespace mk::device
