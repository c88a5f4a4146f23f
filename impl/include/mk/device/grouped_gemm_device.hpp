// mkernel — the grouped GEMM tile engine: for each group (expert) g < G, C_g = A_g * B_g (or its SwiGLU), where the
// row count of every group is a runtime value the kernel reads from device memory (tokens per expert change every
// step). One persistent grid walks the output tiles of all groups as one list.
//
// It is the Hopper GEMM engine (gemm_device.hpp) with a different work walk and epilogue; the pipeline is the same:
// warpgroup 0 produces (one thread issues the TMA loads of A and B k-slices into a ring of kStages stages, each
// completing on the stage's "full" mbarrier), warpgroups 1 and 2 consume (64 rows each, wgmma m64n256k16 from shared
// memory, one group in flight, the stage freed on its "empty" mbarrier), setmaxnreg moves registers to the consumers.
//
// Work walk. Every CTA first builds the group table in shared memory from the device counts (groupedGemmBuildTable):
// per group its first row, its row count (clamped to the host's bound) and its first tile in the global tile list
// (exclusive prefix sums of ceil(rows / 128) x tilesN). Tile t of the list belongs to the group whose range holds it
// (binary search); inside a group the tiles follow the GEMM engine's grouped raster (groupM tile rows, then the next
// tile column), so CTAs running at once share B_g's column panels in L2. CTA c runs tiles c, c + ctas, ... Groups
// with no row own no tile. The producer and the consumers walk the same list.
//
// Rows. A and C hold the groups' rows stacked, row-major: group g starts at row g x rowStride (Strided: the schedule
// IR's layout, each group a fixed-capacity block) or at the sum of the counts before it (Packed: DeepEP / PyTorch
// style). One TMA map covers A's rows; a group's last tile loads up to 127 rows past the group's end (the next
// group's rows, or zeros past the map) whose products land in accumulator rows the epilogue never stores: every
// store is masked by the group's row count, so no other group's C row is written.
//
// B: one tensor map per group (a device array the host encodes), so each group's weights may live anywhere; the
// maps clip k and n at the group's own extent (zero fill), which keeps the k-tail out of the dot products.
//
// Epilogue: C = acc rounded once to bf16 or fp32, or with swiglu C[i][f] = silu(acc[i][2f]) * acc[i][2f + 1] (the
// gate / up columns of B interleaved, C n / 2 wide), computed in fp32 and rounded once, as the CPU executor's
// grouped-gemm step does. Two variants (compile-time kTmaStoreC, chosen on the host): direct stores from registers,
// masked by the group's rows; or (bf16 output, no SwiGLU) the GEMM engine's TMA-store epilogue for every 64-row block
// wholly inside its group (staged in shared memory, stored by TMA while the warpgroup goes back to its main loop),
// the block that crosses a group's end copied from the staging buffer, masked by row. TMA clips only at C's edges,
// never at a group's end: so only whole blocks take it. (SwiGLU staging made ptxas spill 2 bytes however written:
// SwiGLU runs the direct epilogue, whose output is half as wide.)
#pragma once

#include <cstdint>

#include "mk/device/gemm_params_device.hpp"
#include "mk/device/gemm_primitives_device.hpp"
#include "mk/device/gemm_wgmma_device.hpp"
#include "mk/device/macros_device.hpp"

namespace mk::device {

/// Most groups one launch takes with the direct epilogue: the group table (3 words per group) lives in the shared
/// memory the 128 x 256 tile's stages leave free.
constexpr uint32_t kGroupedGemmMaxGroups = 1024;
/// Most groups with the TMA-store epilogue, whose 32 KiB staging buffer leaves room for a table of 160 groups only
/// (more groups run the direct epilogue).
constexpr uint32_t kGroupedGemmMaxGroupsTmaStore = 160;

/// The tile configuration of the grouped engine: the GEMM engine's widest tile; kTmaStoreC: the TMA-store epilogue.
template <bool kTmaStoreC>
using GroupedGemmTileConfigT = GemmTileConfigT<256, kTmaStoreC>;
/// The direct-epilogue configuration (thread count and tile shape are the same in both).
using GroupedGemmTileConfig = GroupedGemmTileConfigT<false>;

/// Groups the shared-memory table of the kTmaStoreC configuration holds.
template <bool kTmaStoreC>
constexpr uint32_t kGroupedGemmTableGroups = kTmaStoreC ? kGroupedGemmMaxGroupsTmaStore : kGroupedGemmMaxGroups;

/// Dynamic shared memory of one CTA: the GEMM engine's stages, staging buffer and barriers, then the group table
/// (tileStart[G + 1], rowStart[G], rowCount[G]).
template <bool kTmaStoreC>
constexpr uint32_t kGroupedGemmSmemBytes = GroupedGemmTileConfigT<kTmaStoreC>::kSmemBytes +
                                           4 * (3 * kGroupedGemmTableGroups<kTmaStoreC> + 1);
static_assert(kGroupedGemmSmemBytes<false> <= 227 * 1024 && kGroupedGemmSmemBytes<true> <= 227 * 1024,
              "H100/H200 give a CTA at most 227 KiB of shared memory");

/// Where group g's rows start in A and C.
enum class GroupedRows : uint32_t {
  Strided = 0,  ///< at g x rowStride (each count clamped to rowStride)
  Packed = 1,   ///< at the sum of the counts of groups 0 .. g - 1 (the sum clamped to gemm.m)
};

/// Everything the kernel needs; built and checked once on the host (mk::GroupedGemmPlan). Trivially copyable: a
/// __grid_constant__ kernel parameter (its tensor map mapA must live in param, const or global memory).
struct GroupedGemmParams {
  /// The shared part: mapA over the stacked rows (gemm.m rows of K, box 64 k x 128 rows), c, ldc (elements between
  /// rows of C), n (B's columns: 2F with swiglu), k, kIters, blockN = 256, out, bRowMajor, tilesN, groupM, and the
  /// timeout report; with tmaStoreC = 1 (never with swiglu) also mapC (C as n x gemm.m bf16, box 64 x 64, 128-byte
  /// swizzle). gemm.m = rows A and C hold (Strided: groups x rowStride). mapB, tilesM and the
  /// split-K / stream-K fields are unused.
  GemmParams gemm;
  const GemmTensorMap* mapsB;  ///< device array of `groups` maps of B_g (same box as GemmParams::mapB)
  const int32_t* rowCounts;    ///< device array of `groups` row counts (negative reads as 0)
  uint32_t groups;             ///< G, in [1, kGroupedGemmMaxGroups]
  uint32_t rowStride;          ///< Strided: rows between two groups' first rows (the bound of each count)
  GroupedRows rows;            ///< the row layout
  uint32_t swiglu;             ///< 1: the SwiGLU epilogue (n even, C n / 2 wide)
};

/// The group table (in shared memory on the device): tileStart[G + 1] (each group's first tile in the list, then the
/// total), rowStart[G] (its first row in A and C), rowCount[G] (its rows, clamped), arrays of uint32 words.
struct GroupedGemmTable {
  uint32_t* tileStart;
  uint32_t* rowStart;
  uint32_t* rowCount;
};

/// Group, tile row and tile column (inside the group) of tile `tile` of the list (< tileStart[G]): a binary search of
/// the table, then the GEMM engine's grouped raster inside the group. Host and device code (the unit tests walk it).
MK_HOST_DEVICE_INLINE void groupedGemmLocate(const GroupedGemmParams& p, const GroupedGemmTable& t, uint32_t tile,
                                             uint32_t& group, uint32_t& tileM, uint32_t& tileN) {
  uint32_t lo = 0, hi = p.groups;  // the group g with tileStart[g] <= tile < tileStart[g + 1]
  while (hi - lo > 1) {
    const uint32_t mid = (lo + hi) / 2;
    if (t.tileStart[mid] <= tile)
      lo = mid;
    else
      hi = mid;
  }
  group = lo;
  const uint32_t tilesM = (t.rowCount[lo] + GroupedGemmTileConfig::kBlockM - 1) / GroupedGemmTileConfig::kBlockM;
  const uint32_t local = tile - t.tileStart[lo];
  // The GEMM engine's grouped raster (gemmTileCoord) over this group's tilesM x tilesN tiles.
  const uint32_t perGroup = p.gemm.groupM * p.gemm.tilesN;
  const uint32_t band = local / perGroup;
  const uint32_t firstM = band * p.gemm.groupM;
  const uint32_t rows = (tilesM - firstM) < p.gemm.groupM ? (tilesM - firstM) : p.gemm.groupM;
  const uint32_t inBand = local % perGroup;
  tileM = firstM + inBand % rows;
  tileN = inBand / rows;
}

#if MK_HAVE_DEVICE_CODE

namespace grouped_detail {

using namespace gemm_detail;

/// Build the group table from p.rowCounts (warp 0 of the CTA; the caller synchronises the CTA afterwards). Each lane
/// takes a contiguous chunk of groups; two warp scans (rows, then tiles) give the prefix sums. 64-bit sums: G counts
/// of up to 2^31 rows each may exceed 32 bits before they are clamped.
MK_DEVICE_INLINE void buildTable(const GroupedGemmParams& p, const GroupedGemmTable& t, uint32_t lane) {
  const uint32_t chunk = (p.groups + 31) / 32;
  const uint32_t first = lane * chunk < p.groups ? lane * chunk : p.groups;
  const uint32_t last = first + chunk < p.groups ? first + chunk : p.groups;
  const uint64_t bound = p.gemm.m;
  // Pass 1: clamped counts and (Packed) row starts.
  uint64_t rowSum = 0;
  for (uint32_t g = first; g < last; ++g) {
    // Volatile: in the resident kernel the counts change from op to op at one address (an earlier step wrote them).
    const int32_t raw = *reinterpret_cast<const volatile int32_t*>(p.rowCounts + g);
    uint64_t rows = raw > 0 ? static_cast<uint64_t>(raw) : 0;
    if (p.rows == GroupedRows::Strided && rows > p.rowStride) rows = p.rowStride;
    if (rows > bound) rows = bound;
    t.rowCount[g] = static_cast<uint32_t>(rows);
    rowSum += rows;
  }
  uint64_t rowIncl = rowSum;
  for (uint32_t d = 1; d < 32; d *= 2) {
    const uint64_t up = __shfl_up_sync(0xFFFFFFFFu, rowIncl, d);
    if (lane >= d) rowIncl += up;
  }
  uint64_t rowAt = rowIncl - rowSum;
  // Pass 2: row starts, counts clipped to the rows A and C hold, tiles per group.
  uint32_t tileSum = 0;
  for (uint32_t g = first; g < last; ++g) {
    uint64_t start = p.rows == GroupedRows::Strided ? static_cast<uint64_t>(g) * p.rowStride : rowAt;
    if (start > bound) start = bound;
    uint32_t rows = t.rowCount[g];
    if (start + rows > bound) rows = static_cast<uint32_t>(bound - start);
    rowAt += t.rowCount[g];
    t.rowStart[g] = static_cast<uint32_t>(start);
    t.rowCount[g] = rows;
    tileSum += (rows + GroupedGemmTileConfig::kBlockM - 1) / GroupedGemmTileConfig::kBlockM * p.gemm.tilesN;
  }
  uint32_t tileIncl = tileSum;
  for (uint32_t d = 1; d < 32; d *= 2) {
    const uint32_t up = __shfl_up_sync(0xFFFFFFFFu, tileIncl, d);
    if (lane >= d) tileIncl += up;
  }
  uint32_t tileAt = tileIncl - tileSum;
  for (uint32_t g = first; g < last; ++g) {
    t.tileStart[g] = tileAt;
    tileAt += (t.rowCount[g] + GroupedGemmTileConfig::kBlockM - 1) / GroupedGemmTileConfig::kBlockM * p.gemm.tilesN;
  }
  if (lane == 31) t.tileStart[p.groups] = tileIncl;
}

/// silu(gate) x up in fp32 (silu(g) = g / (1 + e^-g)), as the CPU executor's swiglu.
MK_DEVICE_INLINE float swigluOf(float gate, float up) { return gate / (1.0f + expf(-gate)) * up; }

/// Store one consumer warpgroup's 64 x 256 accumulators of a tile whose fragment row r0 (and r0 + 8) is row `localRow`
/// of its group (C row `row0`); rows >= `groupRows` (the group's row count) are skipped, so no other group's row is
/// written. Plain: C[row][col] pairs through the GEMM engine's storePair (clipped at n). SwiGLU: column pair (2f,
/// 2f + 1) gives C[row][f]; the four lanes of a row hold f = 4j + lane % 4, so neighbour lanes swap one value (shfl)
/// and each stores a bf16 pair: the even lane for row r0 (f, f + 1), the odd lane for row r0 + 8 (f - 1, f).
template <uint32_t kRegs>
MK_DEVICE_INLINE void storeGroupTile(const GroupedGemmParams& p, const float (&acc)[kRegs], uint32_t row0,
                                     uint32_t localRow, uint32_t groupRows, uint32_t col0, uint32_t lane) {
  const GemmParams& g = p.gemm;
  const bool in0 = localRow < groupRows, in8 = localRow + 8 < groupRows;
  if (!p.swiglu) {
    const bool full = col0 - 2 * (lane % 4) + 2 * kRegs <= g.n;  // the tile's 2 x kRegs columns are inside n
    if (g.out == GemmOut::Float32) {
#pragma unroll
      for (uint32_t j = 0; j < kRegs / 4; ++j) {
        if (in0) storePair<GemmOut::Float32>(g, row0, col0 + 8 * j, acc[4 * j], acc[4 * j + 1], full);
        if (in8) storePair<GemmOut::Float32>(g, row0 + 8, col0 + 8 * j, acc[4 * j + 2], acc[4 * j + 3], full);
      }
    } else {
#pragma unroll
      for (uint32_t j = 0; j < kRegs / 4; ++j) {
        if (in0) storePair<GemmOut::BFloat16>(g, row0, col0 + 8 * j, acc[4 * j], acc[4 * j + 1], full);
        if (in8) storePair<GemmOut::BFloat16>(g, row0 + 8, col0 + 8 * j, acc[4 * j + 2], acc[4 * j + 3], full);
      }
    }
    return;
  }
  const uint32_t halfN = g.n / 2;
  const bool odd = (lane & 1u) != 0;
  if (g.out == GemmOut::Float32) {
    float* c = static_cast<float*>(g.c);
#pragma unroll
    for (uint32_t j = 0; j < kRegs / 4; ++j) {
      const uint32_t f = (col0 + 8 * j) / 2;
      if (f < halfN) {
        if (in0) c[static_cast<uint64_t>(row0) * g.ldc + f] = swigluOf(acc[4 * j], acc[4 * j + 1]);
        if (in8) c[static_cast<uint64_t>(row0 + 8) * g.ldc + f] = swigluOf(acc[4 * j + 2], acc[4 * j + 3]);
      }
    }
    return;
  }
  uint16_t* c = static_cast<uint16_t*>(g.c);
#pragma unroll
  for (uint32_t j = 0; j < kRegs / 4; ++j) {
    const uint32_t f = (col0 + 8 * j) / 2;
    const float v0 = swigluOf(acc[4 * j], acc[4 * j + 1]);
    const float v8 = swigluOf(acc[4 * j + 2], acc[4 * j + 3]);
    // Every lane of the warp takes part in the shuffle, whatever its rows and columns.
    const float other = __shfl_xor_sync(0xFFFFFFFFu, odd ? v0 : v8, 1);
    // The pair's first column: f (even lane) or f - 1 (odd lane), even either way, so with ldc even (host-checked)
    // the pair is 4-byte aligned; an odd n / 2 leaves the last pair half inside C (its second value not stored).
    const uint32_t fp = odd ? f - 1 : f;
    const bool inRow = odd ? in8 : in0;
    const uint32_t row = odd ? row0 + 8 : row0;
    const float lo = odd ? other : v0, hi = odd ? v8 : other;
    if (inRow && fp < halfN) {
      uint16_t* dst = c + static_cast<uint64_t>(row) * g.ldc + fp;
      if (fp + 1 < halfN)
        *reinterpret_cast<uint32_t*>(dst) = packBf16x2(lo, hi);
      else
        dst[0] = toBf16(lo);
    }
  }
}

/// Store the staged pass whose columns start at `passCol0` (see storeGroupTileStaged).
MK_DEVICE_INLINE void storeStagedPass(const GroupedGemmParams& p, uint32_t stg, uint32_t rowC, uint32_t rows,
                                      uint32_t passCol0, uint32_t outCols, uint32_t consumer, uint32_t wgThread) {
  if (rows == 64) {
    // Generic-proxy shared-memory writes must be ordered before the async proxy (TMA) reads them.
    asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
    consumerBarrier(consumer);
    if (wgThread == 0) {
#pragma unroll
      for (uint32_t box = 0; box < 2; ++box) {
        const uint32_t col = passCol0 + box * 64;
        if (col < outCols)
          tmaStore2d(&p.gemm.mapC, stg + box * (64 * 128), static_cast<int32_t>(col), static_cast<int32_t>(rowC));
      }
      bulkCommit();
    }
    return;
  }
  consumerBarrier(consumer);
  // 64 rows x 16 chunks of 8 columns; chunk c of row r sits in box c / 8 at chunk (c % 8) ^ (r % 8).
  uint16_t* c = static_cast<uint16_t*>(p.gemm.c);
  for (uint32_t idx = wgThread; idx < 64 * 16; idx += 128) {
    const uint32_t r = idx / 16, chunk = idx % 16;
    const uint32_t col = passCol0 + chunk * 8;
    if (r >= rows || col >= outCols) continue;  // outCols is a multiple of 8: the chunk is inside C whole
    const uint32_t src = stg + (chunk / 8) * (64 * 128) + r * 128 + (((chunk % 8) ^ (r % 8)) << 4);
    uint32_t w0, w1, w2, w3;
    asm volatile("ld.shared.v4.b32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(w0), "=r"(w1), "=r"(w2), "=r"(w3)
                 : "r"(src)
                 : "memory");
    *reinterpret_cast<uint4*>(c + static_cast<uint64_t>(rowC + r) * p.gemm.ldc + col) = make_uint4(w0, w1, w2, w3);
  }
}

/// The staged epilogue of one consumer (bf16 output, no SwiGLU): its block of 64 rows starts at C row `rowC` and its
/// first `rows` rows (1 .. 64) belong to its group. Each of the two passes stages 128 columns (stageTile), then a
/// block wholly inside the group (rows = 64) is stored by one thread with TMA (the boxes that start inside n, one
/// bulk group; TMA clips only at C's edges, never at a group's end), and a block that crosses the group's end is
/// copied from the staging buffer by the whole warpgroup, 16 bytes per store, its valid rows only. The buffer is
/// reused once the previous store has read it (and every thread's copy is done: the barrier).
template <uint32_t kRegs>
MK_DEVICE_INLINE void storeGroupTileStaged(const GroupedGemmParams& p, const float (&acc)[kRegs], uint32_t stg,
                                           uint32_t rowC, uint32_t rows, uint32_t tileN, uint32_t consumer,
                                           uint32_t warp, uint32_t lane) {
  const uint32_t wgThread = warp * 32 + lane;
  if (wgThread == 0) bulkWaitRead();
  consumerBarrier(consumer);
  stageTile<0>(acc, stg, warp, lane);
  storeStagedPass(p, stg, rowC, rows, tileN * 256, p.gemm.n, consumer, wgThread);
  if (wgThread == 0) bulkWaitRead();
  consumerBarrier(consumer);
  stageTile<1>(acc, stg, warp, lane);
  storeStagedPass(p, stg, rowC, rows, tileN * 256 + 128, p.gemm.n, consumer, wgThread);
}

/// The consumer warpgroups' tile loop for one B layout (kTransB 1: B row-major, N-major in shared memory; the
/// descriptors are the GEMM engine's, gemm_device.hpp): main loop over every k-slice, then the masked epilogue.
template <bool kTmaStoreC, int kTransB, bool kResident>
MK_DEVICE_INLINE void consumeTiles(const GroupedGemmParams& p, const GroupedGemmTable& table, uint32_t smemA,
                                   uint32_t smemB, uint32_t staging, uint32_t fullBar, uint32_t emptyBar,
                                   uint32_t firstTile, uint32_t tileStride, uint32_t tiles, uint32_t consumer,
                                   uint32_t warp, uint32_t lane) {
  using Cfg = GroupedGemmTileConfigT<kTmaStoreC>;
  const uint32_t stg = staging + consumer * Cfg::kStagingBytesPerConsumer;
  (void)stg;
  constexpr uint32_t lboB = kTransB ? Cfg::kBoxBytesBRowMajor : 16;
  constexpr uint32_t kStepB = kTransB ? 16 * 128 : 32;
  uint32_t stage = 0, phase = 0;
  float acc[Cfg::kAccRegs];
#pragma unroll
  for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) acc[r] = 0.0f;
  for (uint32_t tile = firstTile; tile < tiles; tile += tileStride) {
    uint32_t group = 0, tileM = 0, tileN = 0;
    groupedGemmLocate(p, table, tile, group, tileM, tileN);
    uint32_t prevStage = 0;
    for (uint32_t kIter = 0; kIter < p.gemm.kIters; ++kIter) {
      mbarWait<kResident>(p.gemm, fullBar + 8 * stage, phase, GemmWaiter::Consumer, stage, tile);
      const uint32_t a = smemA + stage * Cfg::kStageBytesA + consumer * 64 * 128;
      const uint32_t b = smemB + stage * Cfg::kStageBytesB;
#pragma unroll
      for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) wgmmaFenceOperand(acc[r]);
      wgmmaFence();
#pragma unroll
      for (uint32_t kk = 0; kk < Cfg::kBlockK / Cfg::kWgmmaK; ++kk) {
        const uint64_t descA = smemDesc128B(a + kk * 32, 16, 1024);
        const uint64_t descB = smemDesc128B(b + kk * kStepB, lboB, 1024);
        wgmmaM64NK16Bf16<kTransB>(acc, descA, descB, (kIter > 0 || kk > 0) ? 1u : 0u);
      }
      wgmmaCommit();
#pragma unroll
      for (uint32_t r = 0; r < Cfg::kAccRegs; ++r) wgmmaFenceOperand(acc[r]);
      if (kIter > 0) {
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
    const uint32_t groupRows = table.rowCount[group];
    const uint32_t blockRow = tileM * Cfg::kBlockM + consumer * 64;  // this consumer's first row in the group
    if constexpr (kTmaStoreC) {
      // Staged: TMA stores for a block wholly inside the group, a masked copy from shared memory for the block that
      // crosses its end (one per tile column of a group at most); nothing for a block past it.
      if (blockRow < groupRows) {
        const uint32_t rows = groupRows - blockRow < 64 ? groupRows - blockRow : 64;
        storeGroupTileStaged(p, acc, stg, table.rowStart[group] + blockRow, rows, tileN, consumer, warp, lane);
      }
      continue;
    }
    const uint32_t localRow = blockRow + warp * 16 + lane / 4;
    const uint32_t col0 = tileN * Cfg::kBlockN + 2 * (lane % 4);
    storeGroupTile(p, acc, table.rowStart[group] + localRow, localRow, groupRows, col0, lane);
  }
  if constexpr (kTmaStoreC) {
    // Every bulk store has completed (C written, the staging buffer no longer read) before the CTA exits.
    if (warp == 0 && lane == 0) bulkWaitAllVisible();
  }
}

}  // namespace grouped_detail

/// Runs tiles firstTile, firstTile + tileStride, ... of the grouped problem `p` (the whole list when every CTA
/// c < tileStride calls it with firstTile = c). Contract: called by all 384 threads of the CTA; `smem` is
/// kGroupedGemmSmemBytes<kTmaStoreC> of dynamic shared memory; p.gemm.blockN == 256, p.gemm.tmaStoreC == kTmaStoreC
/// (then bf16 output without swiglu, a valid mapC) and p.groups <= kGroupedGemmTableGroups<kTmaStoreC>, else it traps;
/// named barriers 2 and 3 with the TMA-store epilogue; no named barrier but 0 (one __syncthreads after the group table
/// is built); the kernel is launched with at most 168 registers per thread (__launch_bounds__(384, 1)). Every mbarrier
/// wait is bounded (kGemmWaitLimitNs, reported through p.gemm.timeoutReport).
///
/// kResident (a GroupedGemm step of the resident kernel's compute lane, mk/device/compute_lane_device.hpp; direct
/// epilogue only: the TMA-store variant's table does not fit beside the kernel's own shared memory): as the GEMM
/// engine's gemmRunTiles<..., kResident> — every thread returns, at the end, with kLaunchRegs registers again (the
/// consumers give back first, named barrier 1 and kGiveBackBarrier), the mbarriers are invalidated before any thread
/// leaves, the tensor maps the host wrote while the kernel ran (A's, and each B_g's before its first use) are
/// acquired by the tensormap proxy, and the waits use p.gemm.waitLimitNs and p.gemm.tag.
template <bool kTmaStoreC, bool kResident = false>
MK_DEVICE_INLINE void groupedGemmRunTiles(const GroupedGemmParams& p, uint8_t* smem, uint32_t firstTile,
                                          uint32_t tileStride) {
  static_assert(!(kResident && kTmaStoreC), "the resident grouped GEMM runs the direct epilogue");
  using Cfg = GroupedGemmTileConfigT<kTmaStoreC>;
  using namespace grouped_detail;
  constexpr uint32_t kTableGroups = kGroupedGemmTableGroups<kTmaStoreC>;
  if (p.gemm.blockN != Cfg::kBlockN || p.gemm.tmaStoreC != (kTmaStoreC ? 1u : 0u) || p.groups > kTableGroups) __trap();
  if (kTmaStoreC && (p.gemm.out != GemmOut::BFloat16 || p.swiglu)) __trap();
  const uintptr_t raw = reinterpret_cast<uintptr_t>(smem);
  uint8_t* base = smem + ((Cfg::kSmemAlign - raw % Cfg::kSmemAlign) % Cfg::kSmemAlign);
  const uint32_t smemA = smemAddr(base);
  const uint32_t smemB = smemA + Cfg::kStages * Cfg::kStageBytesA;
  const uint32_t staging = smemB + Cfg::kStages * Cfg::kStageBytesB;  // 1 KiB aligned: stage sizes are
  const uint32_t fullBar = staging + Cfg::kStagingBytes;
  const uint32_t emptyBar = fullBar + Cfg::kStages * 8;
  uint32_t* words =
      reinterpret_cast<uint32_t*>(base + Cfg::kStages * Cfg::kStageBytes + Cfg::kStagingBytes + 2 * Cfg::kStages * 8);
  const GroupedGemmTable table{words, words + kTableGroups + 1, words + 2 * kTableGroups + 1};

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
    // Resident: A's map was written by a host copy after the kernel started (each B_g's is acquired below).
    if (kResident)
      asm volatile(
          "fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(&p.gemm.mapA))
          : "memory");
  }
  if (threadIdx.x < 32) buildTable(p, table, threadIdx.x);
  __syncthreads();
  const uint32_t tiles = table.tileStart[p.groups];

  if (warpgroup == 0) {
    // ---- producer -----------------------------------------------------------------------------------------
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg::kProducerRegs));
    if (wgThread == 0) {
      asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.gemm.mapA)) : "memory");
      if (kTmaStoreC)
        asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(&p.gemm.mapC)) : "memory");
      uint32_t stage = 0, phase = 0;
      uint32_t acquired = ~0u;  // the group whose B map this thread last acquired (resident)
      for (uint32_t tile = firstTile; tile < tiles; tile += tileStride) {
        uint32_t group = 0, tileM = 0, tileN = 0;
        groupedGemmLocate(p, table, tile, group, tileM, tileN);
        const GemmTensorMap* mapB = p.mapsB + group;
        if (kResident && group != acquired) {
          asm volatile("fence.proxy.tensormap::generic.acquire.sys [%0], 128;\n" ::"l"(reinterpret_cast<uint64_t>(mapB))
                       : "memory");
          acquired = group;
        }
        const int32_t rowA = static_cast<int32_t>(table.rowStart[group] + tileM * Cfg::kBlockM);
        const int32_t colB = static_cast<int32_t>(tileN * Cfg::kBlockN);
        for (uint32_t kIter = 0; kIter < p.gemm.kIters; ++kIter) {
          // A fresh barrier counts as having completed the phase before phase 0: the first pass never waits.
          mbarWait<kResident>(p.gemm, emptyBar + 8 * stage, phase ^ 1, GemmWaiter::Producer, stage, tile);
          const uint32_t full = fullBar + 8 * stage;
          mbarArriveExpectTx(full, Cfg::kStageBytes);
          const int32_t k0 = static_cast<int32_t>(kIter * Cfg::kBlockK);
          tmaLoad2d(smemA + stage * Cfg::kStageBytesA, &p.gemm.mapA, k0, rowA, full);
          const uint32_t dstB = smemB + stage * Cfg::kStageBytesB;
          if (p.gemm.bRowMajor) {
            for (uint32_t box = 0; box < Cfg::kBlockN / Cfg::kBoxN; ++box)
              tmaLoad2d(dstB + box * Cfg::kBoxBytesBRowMajor, mapB, colB + static_cast<int32_t>(box * Cfg::kBoxN), k0,
                        full);
          } else {
            tmaLoad2d(dstB, mapB, k0, colB, full);
          }
          if (++stage == Cfg::kStages) {
            stage = 0;
            phase ^= 1;
          }
        }
      }
    }
    if constexpr (!kResident) return;
    // Resident: take the registers back only once the consumers have given theirs back (gemm_device.hpp says why).
    residentProducerTakesBack<Cfg::kThreads, Cfg::kLaunchRegs>();
  } else {
    // ---- consumers --------------------------------------------------------------------------------------------
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::kConsumerRegs));
    const uint32_t consumer = warpgroup - 1;  // rows [64 * consumer, 64 * consumer + 64) of the tile
    const uint32_t warp = wgThread / 32, lane = wgThread % 32;
    // One straight-line k-loop per B layout (a layout branch between the wgmmas makes ptxas insert
    // warpgroup.arrive before each of them).
    if (p.gemm.bRowMajor)
      consumeTiles<kTmaStoreC, 1, kResident>(p, table, smemA, smemB, staging, fullBar, emptyBar, firstTile, tileStride,
                                             tiles, consumer, warp, lane);
    else
      consumeTiles<kTmaStoreC, 0, kResident>(p, table, smemA, smemB, staging, fullBar, emptyBar, firstTile, tileStride,
                                             tiles, consumer, warp, lane);
    if constexpr (!kResident) return;
    residentConsumersGiveBack<Cfg::kThreads, 128 * Cfg::kConsumerWarpgroups, Cfg::kLaunchRegs>();
  }
  if constexpr (kResident) residentInvalidateStages<Cfg::kStages>(fullBar, emptyBar);
}

#endif  // MK_HAVE_DEVICE_CODE

}  // namespace mk::device
