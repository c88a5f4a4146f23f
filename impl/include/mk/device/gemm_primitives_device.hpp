// mkernel — the Hopper GEMM tile engine's device primitives: mbarriers, TMA loads and stores, bulk groups, named
// barriers, wgmma shared-memory descriptors, bf16 packing and the epilogue's fragment stores (gemm_device.hpp
// composes them into the tile loop).
#pragma once

#include <cstdint>

#include "mk/device/gemm_params_device.hpp"
#include "mk/device/macros_device.hpp"

namespace mk::device {

#if MK_HAVE_DEVICE_CODE

namespace gemm_detail {

MK_DEVICE_INLINE uint32_t smemAddr(const void* p) { return static_cast<uint32_t>(__cvta_generic_to_shared(p)); }

MK_DEVICE_INLINE void mbarInit(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(bar), "r"(count) : "memory");
}
MK_DEVICE_INLINE void mbarArriveExpectTx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(bar), "r"(bytes) : "memory");
}
MK_DEVICE_INLINE void mbarArrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(bar) : "memory");
}
MK_DEVICE_INLINE bool mbarTryWait(uint32_t bar, uint32_t parity) {
  uint32_t done;
  asm volatile("{\n.reg .pred p;\nmbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2;\nselp.u32 %0, 1, 0, p;\n}\n"
               : "=r"(done)
               : "r"(bar), "r"(parity)
               : "memory");
  return done != 0;
}
MK_DEVICE_INLINE uint64_t globalTimerNs() {
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

/// Who waits on an mbarrier (the role word of a timeout report).
enum class GemmWaiter : uint32_t { Producer = 1, Consumer = 2 };

/// The slow path of a bounded mbarrier wait: spins until the phase of parity `parity` of `bar` completes; after
/// `limitNs` it writes who waited for what to `report` (when set: host-mapped memory that survives the trap; the
/// word r[7] = `tag` only when kTagged) and traps. Shared by the GEMM and attention tile engines.
template <bool kTagged>
MK_DEVICE_INLINE void mbarWaitBounded(uint32_t* report, uint64_t limitNs, uint32_t tag, uint32_t bar, uint32_t parity,
                                      GemmWaiter who, uint32_t stage, uint32_t tile) {
  const uint64_t start = globalTimerNs();
  for (uint32_t spin = 0;; ++spin) {
    if (mbarTryWait(bar, parity)) return;
    if ((spin & 255) == 255 && globalTimerNs() - start > limitNs) {
      if (report != nullptr && atomicCAS(report, 0u, 1u) == 0u) {
        volatile uint32_t* r = report;
        r[1] = blockIdx.x;
        r[2] = threadIdx.x;
        r[3] = static_cast<uint32_t>(who);
        r[4] = stage;
        r[5] = parity;
        r[6] = tile;
        if (kTagged) r[7] = tag;
        __threadfence_system();
        r[0] = 2;  // written last: the report is complete
      }
      __threadfence_system();
      __trap();
    }
  }
}

/// Bounded wait for the phase of parity `parity` of mbarrier `bar`. The fast path is one try_wait. A wait
/// that lasts kWaitLimitNs writes who waited for what to `p.timeoutReport` (when set: host-mapped memory
/// that survives the trap) and traps: a lost TMA completion or a consumer that never frees a stage must not
/// hang the GPU silently. No printf here: any call in the kernel makes ptxas serialise every wgmma.
/// kResident: the budget is p.waitLimitNs (else kGemmWaitLimitNs) and the report carries p.tag (the standalone
/// kernels keep the constant: their consumers have no register to spare).
template <bool kResident = false>
MK_DEVICE_INLINE void mbarWait(const GemmParams& p, uint32_t bar, uint32_t parity, GemmWaiter who, uint32_t stage,
                               uint32_t tile) {
  if (mbarTryWait(bar, parity)) return;
  const uint64_t limit = kResident && p.waitLimitNs != 0 ? p.waitLimitNs : kGemmWaitLimitNs;
  mbarWaitBounded<kResident>(p.timeoutReport, limit, kResident ? p.tag : 0u, bar, parity, who, stage, tile);
}

/// 2-D TMA load of one box into shared memory, completing (complete_tx) on mbarrier `bar`.
MK_DEVICE_INLINE void tmaLoad2d(uint32_t dst, const GemmTensorMap* map, int32_t inner, int32_t outer, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar)
      : "memory");
}

/// 4-D TMA load of one box (coordinates innermost first) into shared memory, completing on mbarrier `bar`.
MK_DEVICE_INLINE void tmaLoad4d(uint32_t dst, const GemmTensorMap* map, int32_t c0, int32_t c1, int32_t c2, int32_t c3,
                                uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}

/// 2-D TMA store of one shared-memory box to global memory (bulk-group completion, out-of-range elements
/// are not written).
MK_DEVICE_INLINE void tmaStore2d(const GemmTensorMap* map, uint32_t src, int32_t inner, int32_t outer) {
  asm volatile("cp.async.bulk.tensor.2d.global.shared::cta.bulk_group [%0, {%1, %2}], [%3];\n" ::"l"(
                   reinterpret_cast<uint64_t>(map)),
               "r"(inner), "r"(outer), "r"(src)
               : "memory");
}
MK_DEVICE_INLINE void bulkCommit() { asm volatile("cp.async.bulk.commit_group;\n" ::: "memory"); }
/// The shared-memory sources of this thread's bulk stores have been read (the staging buffer may be reused).
MK_DEVICE_INLINE void bulkWaitRead() { asm volatile("cp.async.bulk.wait_group.read 0;\n" ::: "memory"); }
/// This thread's bulk stores have completed; the proxy fence and the GPU-scope fence make their global
/// writes visible to generic-proxy readers elsewhere before a hook publishes the tile.
MK_DEVICE_INLINE void bulkWaitAllVisible() {
  asm volatile("cp.async.bulk.wait_group 0;\n" ::: "memory");
  asm volatile("fence.proxy.async.global;\n" ::: "memory");
  __threadfence();
}
MK_DEVICE_INLINE void stShared32(uint32_t addr, uint32_t v) {
  asm volatile("st.shared.b32 [%0], %1;\n" ::"r"(addr), "r"(v) : "memory");
}
/// Named barrier `kId` for `kThreads` threads. Immediate ids only: a barrier id in a register makes ptxas
/// reserve all 16 hardware barriers for the kernel.
template <uint32_t kId, uint32_t kThreads>
MK_DEVICE_INLINE void namedBarrier() {
  asm volatile("bar.sync %0, %1;\n" ::"n"(kId), "n"(kThreads) : "memory");
}
/// Named barrier of the resident variant's register hand-back (gemmRunTiles<..., kResident = true>): the
/// consumers arrive once they gave their registers back, the producer waits for them before taking its own.
constexpr uint32_t kGiveBackBarrier = 4;
/// The resident variants' register hand-back (gemm_device.hpp says why in this order), for a CTA of kThreads threads
/// whose consumer warpgroups took registers with setmaxnreg. Consumers: meet (named barrier 1: the explicit warpgroup
/// synchronisation PTX asks for between two setmaxnreg), give back down to kLaunchRegs, then arrive on
/// kGiveBackBarrier. Producer: wait there, then take back up to kLaunchRegs.
template <uint32_t kThreads, uint32_t kConsumerThreads, uint32_t kLaunchRegs>
MK_DEVICE_INLINE void residentConsumersGiveBack() {
  namedBarrier<1, kConsumerThreads>();
  asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kLaunchRegs));
  asm volatile("bar.arrive %0, %1;\n" ::"n"(kGiveBackBarrier), "n"(kThreads) : "memory");
}
template <uint32_t kThreads, uint32_t kLaunchRegs>
MK_DEVICE_INLINE void residentProducerTakesBack() {
  __syncwarp();
  namedBarrier<kGiveBackBarrier, kThreads>();
  asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kLaunchRegs));
}
/// The end of a resident tile routine: once every warp is back at its launch registers and every TMA transaction
/// has completed, invalidate the kStages full and empty mbarriers before any thread leaves (the next step may
/// initialise the same shared memory). All threads of the CTA call it.
template <uint32_t kStages>
MK_DEVICE_INLINE void residentInvalidateStages(uint32_t fullBar, uint32_t emptyBar) {
  __syncthreads();
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < kStages; ++s) {
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(fullBar + 8 * s) : "memory");
      asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(emptyBar + 8 * s) : "memory");
    }
  }
  __syncthreads();
}

/// The barrier of one consumer warpgroup (ids 2 and 3, 128 threads each).
MK_DEVICE_INLINE void consumerBarrier(uint32_t consumer) {
  if (consumer == 0)
    namedBarrier<2, 128>();
  else
    namedBarrier<3, 128>();
}

/// wgmma shared-memory descriptor, 128-byte swizzle: start address, leading and stride byte offsets (all
/// encoded >> 4), swizzle mode 1 in bits 62-63. Base offset 0: every stage starts on a 1 KiB boundary.
MK_DEVICE_INLINE uint64_t smemDesc128B(uint32_t addr, uint32_t lbo, uint32_t sbo) {
  return static_cast<uint64_t>((addr & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo & 0x3FFFF) >> 4) << 16) |
         (static_cast<uint64_t>((sbo & 0x3FFFF) >> 4) << 32) | (1ull << 62);
}

/// Round-to-nearest-even fp32 -> bf16 of a pair, v0 in the low half (the lower address).
MK_DEVICE_INLINE uint32_t packBf16x2(float v0, float v1) {
  uint32_t packed;
  asm("cvt.rn.bf16x2.f32 %0, %1, %2;\n" : "=r"(packed) : "f"(v1), "f"(v0));
  return packed;
}
MK_DEVICE_INLINE uint16_t toBf16(float v) {
  uint16_t h;
  asm("cvt.rn.bf16.f32 %0, %1;\n" : "=h"(h) : "f"(v));
  return h;
}

MK_DEVICE_INLINE float bf16ToFloat(uint16_t h) { return __uint_as_float(static_cast<uint32_t>(h) << 16); }

/// Store C[row][col], C[row][col + 1]; `full` says both are inside N (the row is always inside M here).
/// Pairs are 4- or 8-byte aligned: col is even and ldc is a multiple of 8 elements (host-checked).
/// kAcc: C += the pair (the old values are read first; one rounding of old + sum, as the CPU executor does).
template <GemmOut kOut, bool kAcc = false>
MK_DEVICE_INLINE void storePair(const GemmParams& p, uint32_t row, uint32_t col, float v0, float v1, bool full) {
  if constexpr (kOut == GemmOut::Float32) {
    float* dst = static_cast<float*>(p.c) + static_cast<uint64_t>(row) * p.ldc + col;
    if (full || col + 1 < p.n) {
      if constexpr (kAcc) {
        const float2 old = *reinterpret_cast<const float2*>(dst);
        v0 += old.x;
        v1 += old.y;
      }
      *reinterpret_cast<float2*>(dst) = make_float2(v0, v1);
    } else if (col < p.n) {
      if constexpr (kAcc) v0 += dst[0];
      dst[0] = v0;
    }
  } else {
    uint16_t* dst = static_cast<uint16_t*>(p.c) + static_cast<uint64_t>(row) * p.ldc + col;
    if (full || col + 1 < p.n) {
      if constexpr (kAcc) {
        const uint32_t old = *reinterpret_cast<const uint32_t*>(dst);
        v0 += bf16ToFloat(static_cast<uint16_t>(old & 0xFFFFu));
        v1 += bf16ToFloat(static_cast<uint16_t>(old >> 16));
      }
      *reinterpret_cast<uint32_t*>(dst) = packBf16x2(v0, v1);
    } else if (col < p.n) {
      if constexpr (kAcc) v0 += bf16ToFloat(dst[0]);
      dst[0] = toBf16(v0);
    }
  }
}

/// Write one consumer warpgroup's 64 x N accumulators (clipped to M x N). Fragment layout of wgmma
/// m64nN: register 4j + {0,1} holds row 16 * warp + lane / 4, columns 8j + 2 * (lane % 4) + {0,1};
/// registers 4j + {2,3} the same columns 8 rows further down.
template <GemmOut kOut, uint32_t kRegs, bool kAcc = false>
MK_DEVICE_INLINE void storeTile(const GemmParams& p, const float (&acc)[kRegs], uint32_t row0, uint32_t col0,
                                bool fullTile) {
  if (fullTile) {
#pragma unroll
    for (uint32_t j = 0; j < kRegs / 4; ++j) {
      storePair<kOut, kAcc>(p, row0, col0 + 8 * j, acc[4 * j], acc[4 * j + 1], true);
      storePair<kOut, kAcc>(p, row0 + 8, col0 + 8 * j, acc[4 * j + 2], acc[4 * j + 3], true);
    }
  } else {
#pragma unroll
    for (uint32_t j = 0; j < kRegs / 4; ++j) {
      if (row0 < p.m) storePair<kOut, kAcc>(p, row0, col0 + 8 * j, acc[4 * j], acc[4 * j + 1], false);
      if (row0 + 8 < p.m) storePair<kOut, kAcc>(p, row0 + 8, col0 + 8 * j, acc[4 * j + 2], acc[4 * j + 3], false);
    }
  }
}

/// Write columns [128 * kPass, 128 * kPass + 128) of one consumer warpgroup's 64 x N accumulators as bf16
/// into its staging buffer `stg`: box b = (column % 128) / 64 at b * 8 KiB, row r at r * 128 bytes, and the
/// 16-byte chunk c of a row at chunk c ^ (r % 8) (the 128-byte swizzle the C tensor map declares). A warp's
/// store writes 8 rows x 4 words whose chunks differ by row: 32 distinct banks.
template <uint32_t kPass, uint32_t kRegs>
MK_DEVICE_INLINE void stageTile(const float (&acc)[kRegs], uint32_t stg, uint32_t warp, uint32_t lane) {
  const uint32_t r0 = warp * 16 + lane / 4;  // the fragment's row; r0 + 8 has the same r % 8
  const uint32_t sw = r0 % 8;
  const uint32_t base0 = stg + r0 * 128 + 4 * (lane % 4);
  constexpr uint32_t kFirst = kPass * 16, kEnd = kFirst + 16;  // 16 groups of 8 columns per pass
  static_assert(kEnd * 4 <= kRegs, "the pass lies inside the fragment");
#pragma unroll
  for (uint32_t j = kFirst; j < kEnd; ++j) {
    const uint32_t addr = base0 + ((j - kFirst) / 8) * (64 * 128) + (((j % 8) ^ sw) << 4);
    stShared32(addr, packBf16x2(acc[4 * j], acc[4 * j + 1]));
    stShared32(addr + 8 * 128, packBf16x2(acc[4 * j + 2], acc[4 * j + 3]));
  }
}

}  // namespace gemm_detail

#endif  // MK_HAVE_DEVICE_CODE

}  // namespace mk::device
