// mkernel — the Hopper GEMM tile engine: C = A * B, bf16 inputs, fp32 accumulation, bf16 or fp32
// output, run by one CTA of 384 threads over a set of output tiles (persistent tile loop).
//
// Roles inside the CTA (warp specialisation):
//  * warpgroup 0 = producer: one thread issues TMA bulk tensor copies of the A and B k-slices of every
//    tile into a ring of kStages shared-memory stages; each copy completes on the stage's "full" mbarrier
//    (arrive.expect_tx + complete_tx), so no thread polls global memory;
//  * warpgroups 1 and 2 = consumers: each owns 64 of the tile's 128 rows, waits for a full stage, issues
//    four wgmma m64nNk16 (one per 16-wide k step, N = kBlockN = 256 or 128) straight from shared memory,
//    keeps one wgmma group in flight and frees the previous stage (its "empty" mbarrier, one arrival per
//    consumer warp) once that group has retired; after the last k-slice it writes its 64 x N accumulators
//    to global memory (clipped to M x N) and, when a hook is given, the tile is handed to it once both
//    consumers' stores are visible.
//  * setmaxnreg moves registers from the producer (40 per thread) to the consumers (232): the N / 2 fp32
//    accumulators per consumer thread (128 for the 256-wide tile) must live in registers.
//
// Shared-memory layout (TMA 128-byte swizzle, which is the layout wgmma's 128B-swizzle descriptors expect):
//  * A stage: 128 rows x 64 k (bf16), K-major: row r at r * 128 bytes, 8-row swizzle atoms of 1024 bytes;
//  * B stage, B column-major (the "TN" case, an N x K row-major array): N rows x 64 k, K-major like A;
//  * B stage, B row-major (K x N): N / 64 TMA boxes of 64 n x 64 k, each N-major (k-row j at j * 128 bytes),
//    8 KiB apart; wgmma reads it transposed (imm-trans-b = 1) with LBO = 8 KiB (the next 64 columns) and
//    SBO = 1 KiB (the next 8 k-rows).
// Out-of-range rows, columns and k of remainder tiles are zero-filled by TMA (so they add nothing to the
// dot products) and the epilogue never stores outside M x N.
//
// Two epilogues (compile-time kTmaStoreC, chosen on the host by GemmConfig::epilogue):
//  * direct (the default): consumers store their fragments from registers to global memory; the tensor
//    cores idle meanwhile (~15 % of a tile with 32 k-steps, docs/gemm.md);
//  * TMA store (bf16 output only): each consumer writes its 64 x N bf16 fragment, 128 columns per pass,
//    into a 16 KiB shared-memory staging buffer (two 128-byte swizzled boxes of 64 x 64: bank-conflict
//    free), one thread issues cp.async.bulk.tensor stores of it and, after the last pass, the warpgroup
//    goes straight back to the next tile's main loop while the store drains. 32 KiB of staging fit next
//    to the same stages as the direct epilogue (4 x 48 KiB, 6 x 32 KiB), so the main loop is unchanged.
//    Reusing the buffer waits for the previous pass's reads (bulk wait_group.read: only the 256-wide tile's
//    second pass waits inside the epilogue); with a hook, a tile is handed over one tile later, once its
//    stores have completed (bulk wait_group 0).
//
// Split-K (p.splitK > 1, for problems with too few tiles): the CTAs walk work units (a tile's k-range cut
// into pieces) instead of tiles; each piece publishes fp32 partials to a global workspace and the last
// piece of a tile to arrive (per-tile counter) sums them and runs the epilogue and the hook (splitKReduce).
// Stream-K (p.skTiles > 0, standalone kernels only): after its whole-tile units each CTA walks an equal
// contiguous range of the last skTiles tiles' k-iterations (GemmStreamK), segment by segment from the end of
// the range; a tile cut between CTAs is summed the same wait-free way by its last piece (streamKFixup).
#pragma once

#include <cstdint>

#include "mk/device/gemm_params_device.hpp"
#include "mk/device/gemm_primitives_device.hpp"
#include "mk/device/gemm_wgmma_device.hpp"
#include "mk/device/macros_device.hpp"

namespace mk::device {

#if MK_HAVE_DEVICE_CODE

namespace gemm_detail {

/// The consumer warpgroups' part of gemmRunTiles for one B layout (kTransB 1: B row-major, N-major in smem).
/// One staging pass of the TMA-store epilogue: columns [128 * kPass, + 128) of this consumer's 64 rows go to
/// the staging buffer (free: the caller waited), then one thread stores them with TMA (clipped at M x N by
/// the tensor map; boxes wholly outside C are skipped) and commits them as one bulk group.
template <class Cfg, uint32_t kPass>
MK_DEVICE_INLINE void stagePass(const GemmParams& p, const float (&acc)[Cfg::kAccRegs], uint32_t stg, uint32_t tileM,
                                uint32_t tileN, uint32_t consumer, uint32_t warp, uint32_t lane) {
  stageTile<kPass>(acc, stg, warp, lane);
  // Generic-proxy shared-memory writes must be ordered before the async proxy (TMA) reads them.
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  consumerBarrier(consumer);
  if (warp == 0 && lane == 0) {
    const uint32_t rowC = tileM * Cfg::kBlockM + consumer * 64;
    if (rowC < p.m) {
#pragma unroll
      for (uint32_t box = 0; box < Cfg::kStagingCols / 64; ++box) {
        const uint32_t colC = tileN * Cfg::kBlockN + kPass * Cfg::kStagingCols + box * 64;
        if (colC < p.n)
          tmaStore2d(&p.mapC, stg + box * Cfg::kBoxBytesC, static_cast<int32_t>(colC), static_cast<int32_t>(rowC));
      }
    }
    bulkCommit();
  }
}

/// The last-arriver fix-up of split-K and stream-K: store this piece's fp32 partial tile at `mine` (fragment
/// order) and count it on `*counter`; the piece that brings the count to `pieces` resets it and returns true
/// (the caller then adds the other pieces' partials into `acc` and runs the epilogue and the hook), the others
/// return false. Wait-free: no piece waits for another (the last arriver does the sum), the classic fence +
/// counter pattern: partials stored (L2), __threadfence, counter incremented; the last arriver fences again
/// before the caller reads them through L2 (ld.global.cg: never a stale L1 line).
template <class Cfg>
MK_DEVICE_INLINE bool publishPartial(const float (&acc)[Cfg::kAccRegs], float* mine, uint32_t* counter, uint32_t pieces,
                                     uint32_t flag, uint32_t t) {
  constexpr uint32_t kConsumerThreads = 128 * Cfg::kConsumerWarpgroups;
#pragma unroll
  for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) __stcg(mine + r * kConsumerThreads, acc[r]);
  __threadfence();
  namedBarrier<1, kConsumerThreads>();
  if (t == 0) {
    const uint32_t before = atomicAdd(counter, 1u);
    const uint32_t last = before + 1 == pieces ? 1u : 0u;
    if (last) *counter = 0;  // every piece of the tile has arrived: ready for the next launch
    asm volatile("st.shared.u32 [%0], %1;\n" ::"r"(flag), "r"(last) : "memory");
  }
  namedBarrier<1, kConsumerThreads>();
  uint32_t last = 0;
  asm volatile("ld.shared.u32 %0, [%1];\n" : "=r"(last) : "r"(flag) : "memory");
  if (last == 0) return false;
  __threadfence();
  return true;
}

/// Split-K: publishPartial for unit (tile, split); the tile's last unit adds every other split's partial.
template <class Cfg>
MK_DEVICE_INLINE bool splitKReduce(const GemmParams& p, float (&acc)[Cfg::kAccRegs], uint32_t tile, uint32_t split,
                                   uint32_t flag, uint32_t t) {
  constexpr uint32_t kConsumerThreads = 128 * Cfg::kConsumerWarpgroups;
  constexpr uint64_t kSlot = static_cast<uint64_t>(Cfg::kBlockM) * Cfg::kBlockN;  // floats per partial tile
  float* mine = p.workspace + (static_cast<uint64_t>(tile) * p.splitK + split) * kSlot + t;
  if (!publishPartial<Cfg>(acc, mine, &p.tileCounters[tile], p.splitK, flag, t)) return false;
  for (uint32_t s = 0; s < p.splitK; ++s) {
    if (s == split) continue;
    const float* other = p.workspace + (static_cast<uint64_t>(tile) * p.splitK + s) * kSlot + t;
#pragma unroll
    for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) acc[r] += __ldcg(other + r * kConsumerThreads);
  }
  return true;
}

/// Stream-K: like splitKReduce for a piece of stream-K tile `skTile` (index inside the stream-K region) run by
/// CTA `cta`: a tile that one CTA runs whole returns true at once (no workspace traffic); otherwise the piece
/// publishes its partial in its slot (GemmStreamK::slot), counts itself on the tile's counter and the piece that
/// brings it to pieces(skTile) resets it, adds the other pieces' partials and returns true.
template <class Cfg>
MK_DEVICE_INLINE bool streamKFixup(const GemmParams& p, float (&acc)[Cfg::kAccRegs], uint32_t skTile, uint32_t cta,
                                   uint32_t flag, uint32_t t) {
  const GemmStreamK sk = gemmStreamKOf(p);
  const uint32_t pieces = sk.pieces(skTile);
  if (pieces == 1) return true;
  constexpr uint32_t kConsumerThreads = 128 * Cfg::kConsumerWarpgroups;
  constexpr uint64_t kSlot = static_cast<uint64_t>(Cfg::kBlockM) * Cfg::kBlockN;  // floats per partial tile
  float* mine = p.workspace + static_cast<uint64_t>(sk.slot(cta, skTile)) * kSlot + t;
  if (!publishPartial<Cfg>(acc, mine, &p.tileCounters[skTile], pieces, flag, t)) return false;
  const uint32_t first = sk.firstCta(skTile);
  for (uint32_t c = first; c < first + pieces; ++c) {
    if (c == cta) continue;
    const float* other = p.workspace + static_cast<uint64_t>(sk.slot(c, skTile)) * kSlot + t;
#pragma unroll
    for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) acc[r] += __ldcg(other + r * kConsumerThreads);
  }
  return true;
}

/// kTmaStoreC: epilogue through the staging buffer at `staging` (see the file comment). kResident: the
/// direct epilogue also honours p.accumulate (C += A * B; compiled only into the resident kernel).
template <uint32_t kBlockN, bool kTmaStoreC, int kTransB, bool kResident, class Hook>
MK_DEVICE_INLINE void consumeTiles(const GemmParams& p, uint32_t smemA, uint32_t smemB, uint32_t staging,
                                   uint32_t fullBar, uint32_t emptyBar, uint32_t splitFlag, uint32_t firstTile,
                                   uint32_t tileStride, uint32_t endTile, Hook& hook, uint32_t skCta) {
  using Cfg = GemmTileConfigT<kBlockN, kTmaStoreC>;
  const uint32_t consumer = threadIdx.x / 128 - 1;  // rows [64 * consumer, 64 * consumer + 64) of the tile
  const uint32_t wgThread = threadIdx.x % 128;
  const uint32_t warp = wgThread / 32, lane = wgThread % 32;
  // K-major operands: 8-row atoms 1 KiB apart (SBO), LBO unused by 128B-swizzled K-major layouts (1 by
  // convention); the next 16 k are 32 bytes further along the swizzled row.
  // N-major B: LBO = 8 KiB to the next 64 columns, SBO = 1 KiB to the next 8 k-rows; 16 k = 2 KiB.
  constexpr uint32_t lboB = kTransB ? Cfg::kBoxBytesBRowMajor : 16;
  constexpr uint32_t kStepB = kTransB ? 16 * 128 : 32;
  uint32_t stage = 0, phase = 0;
  // TMA-store epilogue: this consumer's staging boxes and the tile whose store is still in flight (its hook
  // is called one tile later). Named barriers: 2 + consumer for one warpgroup, 1 for both.
  const uint32_t stg = staging + consumer * Cfg::kStagingBytesPerConsumer;
  bool pending = false;
  uint32_t pendingM = 0, pendingN = 0;
  (void)stg;
  (void)pending;
  (void)pendingM;
  (void)pendingN;
  float acc[Cfg::kAccRegs];
#pragma unroll
  for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) acc[r] = 0.0f;
  GemmWorkCursor work = gemmWorkCursor<kResident>(p, firstTile, tileStride, endTile, skCta);
  for (;;) {
    uint32_t tile = 0, split = 0, kBegin = 0, kEnd = 0, tileM = 0, tileN = 0;
    if (!work.template next<kResident>(p, tile, split, kBegin, kEnd)) break;
    gemmTileCoord(p, tile, tileM, tileN);
    uint32_t prevStage = 0;
    for (uint32_t kIter = kBegin; kIter < kEnd; ++kIter) {
      mbarWait<kResident>(p, fullBar + 8 * stage, phase, GemmWaiter::Consumer, stage, tile);
      const uint32_t a = smemA + stage * Cfg::kStageBytesA + consumer * 64 * 128;
      const uint32_t b = smemB + stage * Cfg::kStageBytesB;
#pragma unroll
      for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) wgmmaFenceOperand(acc[r]);
      wgmmaFence();
#pragma unroll
      for (uint32_t kk = 0; kk < Cfg::kBlockK / Cfg::kWgmmaK; ++kk) {
        const uint64_t descA = smemDesc128B(a + kk * 32, 16, 1024);
        const uint64_t descB = smemDesc128B(b + kk * kStepB, lboB, 1024);
        const uint32_t scaleD = (kIter > kBegin || kk > 0) ? 1u : 0u;
        wgmmaM64NK16Bf16<kTransB>(acc, descA, descB, scaleD);
      }
      wgmmaCommit();
#pragma unroll
      for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) wgmmaFenceOperand(acc[r]);
      if (kIter > kBegin) {
        // The group of the previous k-slice has retired: its stage may be refilled.
        wgmmaWait<1>();
        if (lane == 0) mbarArrive(emptyBar + 8 * prevStage);
      }
      prevStage = stage;
      if (++stage == Cfg::kStages) {
        stage = 0;
        phase ^= 1;
      }
    }
    wgmmaWait<0>();
#pragma unroll
    for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) wgmmaFenceOperand(acc[r]);
    if (lane == 0) mbarArrive(emptyBar + 8 * prevStage);
    // Split-K: only the tile's last unit (which sums the partials) stores the tile and calls the hook.
    if (p.splitK > 1 && !splitKReduce<Cfg>(p, acc, tile, split, splitFlag, threadIdx.x - 128)) continue;
    // Stream-K: a tile cut between CTAs is stored (and handed to the hook) by its last piece only.
    if constexpr (!kResident) {
      const uint32_t dpTiles = p.tilesM * p.tilesN - p.skTiles;  // stream-K tiles follow the whole ones
      if (p.skTiles != 0 && tile >= dpTiles &&
          !streamKFixup<Cfg>(p, acc, tile - dpTiles, skCta, splitFlag, threadIdx.x - 128))
        continue;
    }

    if constexpr (kTmaStoreC) {
      // ---- epilogue through shared memory: the staging buffer is free once the previous tile's store has
      // read it; with a hook, that store must also have completed (the previous tile is handed over now).
      if (wgThread == 0) {
        if constexpr (Hook::kEnabled)
          bulkWaitAllVisible();
        else
          bulkWaitRead();
      }
      if constexpr (Hook::kEnabled) {
        namedBarrier<1, 128 * Cfg::kConsumerWarpgroups>();
        if (pending && consumer == 0 && wgThread == 0) hook(pendingM * Cfg::kBlockM, pendingN * Cfg::kBlockN);
      } else {
        consumerBarrier(consumer);
      }
      stagePass<Cfg, 0>(p, acc, stg, tileM, tileN, consumer, warp, lane);
      if constexpr (Cfg::kStagingPasses > 1) {
        // The second half reuses the buffer once the first half's store has read it.
        if (wgThread == 0) bulkWaitRead();
        consumerBarrier(consumer);
        stagePass<Cfg, 1>(p, acc, stg, tileM, tileN, consumer, warp, lane);
      }
      pending = true;
      pendingM = tileM;
      pendingN = tileN;
      continue;
    }
    // ---- epilogue: straight from registers to global memory.
    const uint32_t row0 = tileM * Cfg::kBlockM + consumer * 64 + warp * 16 + lane / 4;
    const uint32_t col0 = tileN * Cfg::kBlockN + 2 * (lane % 4);
    const bool fullTile = (tileM + 1) * Cfg::kBlockM <= p.m && (tileN + 1) * Cfg::kBlockN <= p.n;
    if (kResident && p.accumulate) {
      if (p.out == GemmOut::Float32)
        storeTile<GemmOut::Float32, Cfg::kAccRegs, true>(p, acc, row0, col0, fullTile);
      else
        storeTile<GemmOut::BFloat16, Cfg::kAccRegs, true>(p, acc, row0, col0, fullTile);
    } else if (p.out == GemmOut::Float32) {
      storeTile<GemmOut::Float32>(p, acc, row0, col0, fullTile);
    } else {
      storeTile<GemmOut::BFloat16>(p, acc, row0, col0, fullTile);
    }
    if constexpr (Hook::kEnabled) {
      // Every consumer thread fences its own stores GPU-wide, then the 256 consumers meet on named
      // barrier 1 (the producer is not part of it): the hook sees a finished, visible tile.
      __threadfence();
      asm volatile("bar.sync 1, %0;\n" ::"n"(128 * Cfg::kConsumerWarpgroups) : "memory");
      if (consumer == 0 && wgThread == 0) hook(tileM * Cfg::kBlockM, tileN * Cfg::kBlockN);
    }
  }
  if constexpr (kTmaStoreC) {
    // Drain: every store has completed (C is written and the staging buffer is no longer read) before any
    // consumer returns, then the last tile goes to the hook.
    if (wgThread == 0) bulkWaitAllVisible();
    namedBarrier<1, 128 * Cfg::kConsumerWarpgroups>();
    if constexpr (Hook::kEnabled) {
      if (pending && consumer == 0 && wgThread == 0) hook(pendingM * Cfg::kBlockM, pendingN * Cfg::kBlockN);
    }
  }
}

}  // namespace gemm_detail

/// Runs work units firstTile, firstTile + tileStride, ... (< endTile <= gemmUnitCount(p)) of problem `p`, then
/// returns. A unit is an output tile, or with p.splitK > 1 one k-range of a tile (gemmUnit); the CTAs that
/// share a problem must together run every unit of each tile they touch (split-K sums in the last one).
///
/// Contract: called by all GemmTileConfigT<kBlockN, kTmaStoreC>::kThreads (384) threads of the CTA with the
/// same arguments; `smem` is GemmTileConfigT<kBlockN, kTmaStoreC>::kSmemBytes of dynamic shared memory the CTA
/// owns for the call; p.blockN == kBlockN (the tensor maps' B box depends on it) and p.tmaStoreC ==
/// kTmaStoreC (with bf16 output and a valid p.mapC), else it traps; named barriers 1, 2, 3 are used (and 4
/// with kResident); `p` lives in
/// param, constant or global memory (its tensor maps are read by TMA). The routine initialises its
/// mbarriers, re-balances registers with setmaxnreg (the kernel must be launched with at most
/// 65536 / 384 = 168 registers per thread, e.g. __launch_bounds__(384, 1)), and when it returns every TMA
/// copy it issued has been consumed. `hook(m0, n0)` runs on one consumer thread after each tile whose first
/// element is (m0, n0); all of the tile's stores are visible GPU-wide (fenced) before it is called.
/// Stream-K (p.skTiles > 0, never with kResident): after its units the CTA runs its range of the stream-K
/// region as CTA `skCta` of the partition (gemmStreamKOf(p)); every CTA 0 .. p.skCtas - 1 must run, and each
/// stream-K tile is stored and handed to the hook once, by its last piece to arrive.
///
/// kResident (the resident kernel's compute lanes, mk/device/compute_lane_device.hpp): the kernel goes on
/// running other steps afterwards, so (a) every thread returns only at the end, with
/// GemmTileConfigT::kLaunchRegs registers again (the consumers give back, a CTA barrier, then the producer
/// takes back: never the other way round; the kernel must be launched with exactly that count), (b) the mbarriers are
/// invalidated once every thread is done (the next call re-initialises the same shared memory), (c) the tensor maps,
/// written by the host while the kernel ran, are acquired by the tensormap proxy before their first use
/// (fence.proxy.tensormap), and (d) p.accumulate is honoured by the direct epilogue. Every store to C is complete when
/// it returns (the TMA-store epilogue drains with cp.async.bulk.wait_group 0 + fence.proxy.async.global).
template <uint32_t kBlockN, bool kTmaStoreC = false, bool kResident = false, class Hook>
MK_DEVICE_INLINE void gemmRunTiles(const GemmParams& p, uint8_t* smem, uint32_t firstTile, uint32_t tileStride,
                                   uint32_t endTile, Hook& hook, uint32_t skCta = 0) {
  using Cfg = GemmTileConfigT<kBlockN, kTmaStoreC>;
  using namespace gemm_detail;
  if (p.blockN != kBlockN || p.tmaStoreC != (kTmaStoreC ? 1u : 0u)) __trap();
  if (kTmaStoreC && p.out != GemmOut::BFloat16) __trap();
  const uintptr_t raw = reinterpret_cast<uintptr_t>(smem);
  uint8_t* base = smem + ((Cfg::kSmemAlign - raw % Cfg::kSmemAlign) % Cfg::kSmemAlign);
  const uint32_t smemA = smemAddr(base);
  const uint32_t smemB = smemA + Cfg::kStages * Cfg::kStageBytesA;
  const uint32_t staging = smemB + Cfg::kStages * Cfg::kStageBytesB;  // 1 KiB aligned: stage sizes are
  const uint32_t fullBar = staging + Cfg::kStagingBytes;
  const uint32_t emptyBar = fullBar + Cfg::kStages * 8;
  const uint32_t splitFlag = emptyBar + Cfg::kStages * 8;

  const uint32_t warpgroup = threadIdx.x / 128;
  const uint32_t wgThread = threadIdx.x % 128;
  if (threadIdx.x == 0) {
    for (uint32_t s = 0; s < Cfg::kStages; ++s) {
      mbarInit(fullBar + 8 * s, 1);
      mbarInit(emptyBar + 8 * s, Cfg::kConsumerWarps);
    }
    // Make the initialised barriers visible to the async proxy (TMA's complete_tx).
    asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
  }
  if constexpr (kResident) {
    // The maps were written (by a host copy) after the kernel started: order that write before the
    // tensormap proxy reads them, in every thread that issues TMA with them (producer; consumer leaders).
    // The producer also acquires C's map: it prefetches it into the descriptor cache below.
    if (wgThread == 0) {
      if (warpgroup == 0) {
        asm volatile(
            "fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapA))
            : "memory");
        asm volatile(
            "fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapB))
            : "memory");
        if (kTmaStoreC)
          asm volatile(
              "fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapC))
              : "memory");
      } else if (kTmaStoreC) {
        asm volatile(
            "fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapC))
            : "memory");
      }
    }
  }
  __syncthreads();

  if (warpgroup == 0) {
    // ---- producer ---------------------------------------------------------------------------------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg::kProducerRegs));
    if (wgThread == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapA)) : "memory");
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapB)) : "memory");
      if (kTmaStoreC) asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.mapC)) : "memory");
      uint32_t stage = 0, phase = 0;
      GemmWorkCursor work = gemmWorkCursor<kResident>(p, firstTile, tileStride, endTile, skCta);
      for (;;) {
        uint32_t tile = 0, split = 0, kBegin = 0, kEnd = 0, tileM = 0, tileN = 0;
        if (!work.template next<kResident>(p, tile, split, kBegin, kEnd)) break;
        gemmTileCoord(p, tile, tileM, tileN);
        const int32_t rowA = static_cast<int32_t>(tileM * Cfg::kBlockM);
        const int32_t colB = static_cast<int32_t>(tileN * Cfg::kBlockN);
        for (uint32_t kIter = kBegin; kIter < kEnd; ++kIter) {
          // A fresh barrier counts as having completed the phase before phase 0: the first pass never waits.
          mbarWait<kResident>(p, emptyBar + 8 * stage, phase ^ 1, GemmWaiter::Producer, stage, tile);
          const uint32_t full = fullBar + 8 * stage;
          mbarArriveExpectTx(full, Cfg::kStageBytes);
          const int32_t k0 = static_cast<int32_t>(kIter * Cfg::kBlockK);
          tmaLoad2d(smemA + stage * Cfg::kStageBytesA, &p.mapA, k0, rowA, full);
          const uint32_t dstB = smemB + stage * Cfg::kStageBytesB;
          if (p.bRowMajor) {
            for (uint32_t box = 0; box < Cfg::kBlockN / Cfg::kBoxN; ++box)
              tmaLoad2d(dstB + box * Cfg::kBoxBytesBRowMajor, &p.mapB, colB + static_cast<int32_t>(box * Cfg::kBoxN),
                        k0, full);
          } else {
            tmaLoad2d(dstB, &p.mapB, k0, colB, full);
          }
          if (++stage == Cfg::kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    if constexpr (!kResident) return;
    // Resident: take the registers back only once the consumers have given theirs back (see below).
    residentProducerTakesBack<Cfg::kThreads, Cfg::kLaunchRegs>();
  } else {
    // ---- consumers ------------------------------------------------------------------------------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::kConsumerRegs));
    // One straight-line k-loop per B layout: a layout branch between the wgmmas makes ptxas insert
    // warpgroup.arrive before each of them.
    if (p.bRowMajor)
      gemm_detail::consumeTiles<kBlockN, kTmaStoreC, 1, kResident>(
          p, smemA, smemB, staging, fullBar, emptyBar, splitFlag, firstTile, tileStride, endTile, hook, skCta);
    else
      gemm_detail::consumeTiles<kBlockN, kTmaStoreC, 0, kResident>(
          p, smemA, smemB, staging, fullBar, emptyBar, splitFlag, firstTile, tileStride, endTile, hook, skCta);
    if constexpr (!kResident) return;
    // The PTX ISA asks every warp of a warpgroup to synchronise explicitly between two setmaxnreg: the
    // direct epilogue has no warpgroup barrier of its own after the inc above (named barrier 1 below).
    // Register hand-back, in this order (the CTA's register pool is first come, first served): the
    // consumers give their extra registers back, then arrive on kGiveBackBarrier, on which the
    // producer waits before its inc. An inc issued earlier (the producer's idle warps used to reach it a few
    // instructions after their dec) could take back registers the consumers had not claimed yet: their inc
    // would then block for ever (a hang no wait bound sees), or the producer's empty-stage wait would trap.
    // The barrier is also the explicit warpgroup synchronisation the PTX ISA asks for between the
    // producer's dec and inc. Both branches end at kLaunchRegs (ptxas needs the same count where they join).
    residentConsumersGiveBack<Cfg::kThreads, 128 * Cfg::kConsumerWarpgroups, Cfg::kLaunchRegs>();
  }
  // Every warp is back at kLaunchRegs and every TMA transaction has completed (each full barrier's last phase was
  // waited for): the barriers may be invalidated, and are before any thread leaves.
  if constexpr (kResident) residentInvalidateStages<Cfg::kStages>(fullBar, emptyBar);
}

#endif  // MK_HAVE_DEVICE_CODE

}  // namespace mk::device
