// mkernel — memory-ordering primitives and the bounded wait (MK_POLL) of the resident kernel.
//
// Scopes and costs (measured on 2 x H200: ~500 us per op when 65 threads spun with ld.acquire.sys; a
// system-scope acquire or release is a full L1 invalidate / memory drain, and hot-spinning with it stalls
// the other CTAs' memory traffic):
//  * spin with volatile loads (relaxed, L1 bypassed) and order once, after the wait succeeds, with an
//    acquire fence — system scope when the writer is another GPU (flags, barriers, done / entered words,
//    the doorbell written by the stream front end), GPU scope when it is this GPU (lane counters, published);
//  * a signal to another GPU is a system-scope release (its NVLink data must land first); counters only
//    this GPU touches use GPU scope;
//  * spins check a device-memory abort word, never host memory (the control warp mirrors the host's).
#pragma once

#include <cstdint>

#include "mk/device/engine_device.hpp"
#include "mk/device/macros_device.hpp"

#if MK_HAVE_DEVICE_CODE
namespace mk::device {

// Loads, stores and reductions of one memory-model flavour each, for 32- and 64-bit words (generic
// addresses: device, peer or host-mapped memory). One macro per shape so every flavour is spelled once.
#define MK_DEFINE_LOADS(name, instr)                                    \
  MK_DEVICE_INLINE uint32_t name(const uint32_t* p) {                   \
    uint32_t v;                                                         \
    asm volatile(instr ".u32 %0, [%1];" : "=r"(v) : "l"(p) : "memory"); \
    return v;                                                           \
  }                                                                     \
  MK_DEVICE_INLINE uint64_t name(const uint64_t* p) {                   \
    uint64_t v;                                                         \
    asm volatile(instr ".u64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); \
    return v;                                                           \
  }
#define MK_DEFINE_STORES(name, instr)                                 \
  MK_DEVICE_INLINE void name(uint32_t* p, uint32_t v) {               \
    asm volatile(instr ".u32 [%0], %1;" ::"l"(p), "r"(v) : "memory"); \
  }                                                                   \
  MK_DEVICE_INLINE void name(uint64_t* p, uint64_t v) {               \
    asm volatile(instr ".u64 [%0], %1;" ::"l"(p), "l"(v) : "memory"); \
  }

/// Acquire load, system scope.
MK_DEFINE_LOADS(loadAcquire, "ld.acquire.sys")
/// Volatile load: a poll that sees other agents' stores (never cached in L1) and orders nothing.
MK_DEFINE_LOADS(loadVolatile, "ld.volatile")
/// Relaxed load, system scope: a poll that must see other agents' stores but orders nothing.
MK_DEFINE_LOADS(loadRelaxed, "ld.relaxed.sys")

/// Relaxed 16-byte load, system scope: two words in one transaction (`p` 16-byte aligned). Host memory is read at
/// PCIe distance, and a thread's loads there cost a round trip each: the fewer per thread, the sooner it has them.
MK_DEVICE_INLINE void loadRelaxed2(const uint64_t* p, uint64_t* a, uint64_t* b) {
  asm volatile("ld.relaxed.sys.v2.u64 {%0, %1}, [%2];" : "=l"(*a), "=l"(*b) : "l"(p) : "memory");
}

/// Release store / add, GPU scope (counters only this GPU reads).
MK_DEFINE_STORES(storeReleaseGpu, "st.release.gpu")
MK_DEFINE_STORES(addReleaseGpu, "red.release.gpu.add")
/// Relaxed store / add, GPU scope: what follows an explicit fence (fence + relaxed = release, one fence;
/// mk-probe-latency measures a release store at about twice the cost of the fence alone).
MK_DEFINE_STORES(storeRelaxedGpu, "st.relaxed.gpu")
MK_DEFINE_STORES(addRelaxedGpu, "red.relaxed.gpu.add")
/// Release store / add, system scope: every earlier write of this thread is visible before `v` is.
MK_DEFINE_STORES(storeRelease, "st.release.sys")
MK_DEFINE_STORES(addRelease, "red.release.sys.add")
/// Relaxed store / add, system scope: mirrors and stamps nobody orders against, and signals to another
/// GPU after an explicit fenceSys().
MK_DEFINE_STORES(storeRelaxed, "st.relaxed.sys")
MK_DEFINE_STORES(addRelaxed, "red.relaxed.sys.add")

#undef MK_DEFINE_LOADS
#undef MK_DEFINE_STORES

MK_DEVICE_INLINE uint32_t fetchAddAcqRelGpu(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.gpu.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
/// Acquire-release fetch-add, system scope: the arrival that tells the last CTA of a lane it is last
/// must also acquire the other CTAs' writes before that CTA signals on their behalf.
MK_DEVICE_INLINE uint32_t fetchAddAcqRel(uint32_t* p, uint32_t v) {
  uint32_t old;
  asm volatile("atom.acq_rel.sys.add.u32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
}
/// Acquire-release fence, GPU scope.
MK_DEVICE_INLINE void fenceGpu() { asm volatile("fence.acq_rel.gpu;" ::: "memory"); }

/// Nanoseconds of the GPU's global timer (32 ns resolution on H200).
MK_DEVICE_INLINE uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// a >= b on wrapping 32-bit sequence numbers.
MK_DEVICE_INLINE bool seqGeq(uint32_t a, uint32_t b) { return static_cast<int32_t>(a - b) >= 0; }

/// Where a bounded wait happens, for the failure record.
struct PollSite {
  Status code;
  uint32_t op, lane, step, flag;
  uint64_t expected;
};

/// Record the first failure of the group and raise the abort flag (see StatusBlock for the order).
MK_DEVICE_INLINE void reportFailure(const EngineDeviceHandle& h, const PollSite& site, uint64_t seen,
                                    uint64_t elapsedNs) {
  StatusBlock* s = h.status;
  if (atomicCAS(h.failureClaim, 0u, 1u) == 0u) {
    s->code = static_cast<uint32_t>(site.code);
    s->rank = h.rank;
    s->lane = site.lane;
    s->step = site.step;
    s->flag = site.flag;
    s->op = site.op;
    s->expected = site.expected;
    s->seen = seen;
    s->elapsedNs = elapsedNs;
    __threadfence_system();
  }
  storeRelease(&s->abort, 1u);
  // Ranks of other nodes hear of it from the host, which relays the abort (their state is not mapped here).
  for (uint32_t q = 0; q < h.nRanks; ++q)
    if (h.localMask & (1u << q)) storeRelease(&h.peers[q]->abort, 1u);
}

/// Full fence, system scope: this thread's earlier writes (to any memory) are visible to every agent
/// before its later ones.
MK_DEVICE_INLINE void fenceSys() { asm volatile("fence.acq_rel.sys;" ::: "memory"); }

/// True once the group was aborted: the device-memory mirror every spin checks (set by a failing CTA of
/// any rank, or by this rank's control warp when the host raised StatusBlock::abort).
MK_DEVICE_INLINE bool aborted(const EngineDeviceHandle& h) { return loadVolatile(&h.state->abort) != 0u; }

/// Spin until cond() holds (cond should read with loadVolatile; the caller fences once afterwards). Every
/// 64 spins: give up if the group aborted, or report `site` with seen() once the wait has lasted
/// h.pollBudgetNs. Returns false when the caller must stop (abort or timeout).
template <class Cond, class Seen>
MK_DEVICE_INLINE bool pollUntil(const EngineDeviceHandle& h, Cond&& cond, const PollSite& site, Seen&& seen) {
  if (cond()) return true;
  const uint64_t start = globalTimerNs();
  for (uint32_t spins = 1;; ++spins) {
    if (cond()) return true;
    if ((spins & 63u) == 0u) {
      if (aborted(h)) return false;
      const uint64_t elapsed = globalTimerNs() - start;
      if (elapsed > h.pollBudgetNs) {
        reportFailure(h, site, seen(), elapsed);
        return false;
      }
    }
  }
}

}  // namespace mk::device

/// Bounded wait: spin until `cond` holds; on timeout write {code, rank, lane, step, flag, expected, seen}
/// (from `site` and `seenExpr`) into the status block, raise the abort flag and evaluate to false; also
/// false when another agent aborted. Live in release builds: a hang is a bug, a timeout a diagnosis.
#define MK_POLL(handle, cond, site, seenExpr)                                          \
  ::mk::device::pollUntil((handle), [&]() { return static_cast<bool>(cond); }, (site), \
                          [&]() { return static_cast<uint64_t>(seenExpr); })

#endif  // MK_HAVE_DEVICE_CODE
