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

#include "mk/device/gemm_wgmma_device.hpp"
#include "mk/device/macros_device.hpp"

namespace mk::device {

/// The bits of a CUtensorMap (cuda.h's opaque 128-byte, 64-byte aligned TMA descriptor). Declared here so
/// device headers need no cuda.h; the host side copies an encoded CUtensorMap into it.
struct alignas(64) GemmTensorMap {
  uint64_t opaque[16];  ///< encoded by cuTensorMapEncodeTiled on the host
};
static_assert(sizeof(GemmTensorMap) == 128, "a TMA descriptor is 128 bytes");

/// A bounded wait gives up (reports who waited for what and traps) after this many nanoseconds.
constexpr uint64_t kGemmWaitLimitNs = 10ull * 1000 * 1000 * 1000;

/// Tile shape, pipeline depth and thread roles of the engine (compile time). Two output tile widths:
/// 128 x 256 (the most work per byte of shared memory: the default for large grids) and 128 x 128 (twice
/// the tiles: fewer idle CTAs in the last wave when tiles / CTAs rounds up badly, e.g. 116 CTAs).
template <uint32_t kBlockNValue, bool kTmaStoreCValue = false>
struct GemmTileConfigT {
  static constexpr uint32_t kBlockM = 128;           ///< output rows per tile (two consumer warpgroups x 64)
  static constexpr uint32_t kBlockN = kBlockNValue;  ///< output columns per tile (one wgmma n per consumer)
  static constexpr uint32_t kBlockK = 64;            ///< k per stage: 64 bf16 = 128 bytes, one swizzle row
  static constexpr uint32_t kWgmmaK = 16;            ///< k per wgmma instruction (bf16)
  /// Epilogue through a shared-memory staging buffer and TMA stores (bf16 output) instead of direct stores.
  static constexpr bool kTmaStoreC = kTmaStoreCValue;
  /// Shared-memory ring depth: 4 x 48 KiB or 6 x 32 KiB (+ 32 KiB of C staging for the TMA-store epilogue:
  /// both still fit in 227 KiB).
  static constexpr uint32_t kStages = kBlockN == 256 ? 4 : 6;
  static constexpr uint32_t kConsumerWarpgroups = 2;
  static constexpr uint32_t kThreads = 128 * (1 + kConsumerWarpgroups);  ///< producer + consumers
  static constexpr uint32_t kConsumerWarps = 4 * kConsumerWarpgroups;    ///< arrivals that free a stage
  static constexpr uint32_t kAccRegs = kBlockN / 2;  ///< fp32 accumulators per consumer thread (64 x N / 128)
  static constexpr uint32_t kStageBytesA = kBlockM * kBlockK * 2;
  static constexpr uint32_t kStageBytesB = kBlockN * kBlockK * 2;
  static constexpr uint32_t kStageBytes = kStageBytesA + kStageBytesB;  ///< expect_tx of one stage
  /// Row-major B arrives as kBlockN / 64 boxes of 64 columns (128-byte swizzle rows hold 64 bf16).
  static constexpr uint32_t kBoxN = 64;
  static constexpr uint32_t kBoxBytesBRowMajor = kBoxN * kBlockK * 2;
  /// 128B-swizzle atoms must start on 1024-byte boundaries: the dynamic smem base is aligned up by hand.
  static constexpr uint32_t kSmemAlign = 1024;
  /// TMA-store epilogue: each consumer stages 64 rows x kStagingCols bf16 per pass as swizzled 64 x 64 boxes
  /// (box = 64 rows x 128 bytes = 8 KiB); kBlockN / kStagingCols passes per tile. 0 bytes when direct.
  static constexpr uint32_t kBoxBytesC = 64 * 128;
  static constexpr uint32_t kStagingCols = 128;
  static constexpr uint32_t kStagingPasses = kBlockN / kStagingCols;
  static constexpr uint32_t kStagingBytesPerConsumer = kTmaStoreC ? 64 * kStagingCols * 2 : 0;
  static constexpr uint32_t kStagingBytes = kStagingBytesPerConsumer * kConsumerWarpgroups;
  /// Dynamic shared memory the caller provides: alignment slack + stages + staging + 2 mbarriers per stage +
  /// 16 bytes for the split-K "last unit of the tile" flag.
  static constexpr uint32_t kSmemBytes = kSmemAlign + kStages * kStageBytes + kStagingBytes + 2 * kStages * 8 + 16;
  static constexpr uint32_t kProducerRegs = 40;   ///< setmaxnreg.dec target of the producer warpgroup
  static constexpr uint32_t kConsumerRegs = 232;  ///< setmaxnreg.inc target of each consumer warpgroup
  /// Registers per thread at launch (__launch_bounds__(384, 1): 65536 / 384 rounded down to 8). The resident
  /// kernel's compute lanes give every warpgroup this count back when a Gemm step ends (kResident).
  static constexpr uint32_t kLaunchRegs = 168;

  static_assert(kBlockN == 128 || kBlockN == 256, "wgmma wrappers exist for n128 and n256");
  static_assert(kStageBytesA % kSmemAlign == 0 && kStageBytesB % kSmemAlign == 0, "stages keep 1 KiB alignment");
  static_assert(kSmemBytes <= 227 * 1024, "H100/H200 give a CTA at most 227 KiB of shared memory");
  static_assert(kLaunchRegs * kThreads <= 65536 && kLaunchRegs % 8 == 0, "the launch register count fits one SM");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWarpgroups <= kLaunchRegs * kThreads,
                "setmaxnreg only moves registers the CTA was launched with");
  static_assert(kProducerRegs * 128 + kConsumerRegs * 128 * kConsumerWarpgroups <= 65536,
                "the register file holds 64 Ki 32-bit registers per SM");
  static_assert(kBlockM == 64 * kConsumerWarpgroups, "each consumer warpgroup owns 64 rows");
};
/// The default (widest) tile.
using GemmTileConfig = GemmTileConfigT<256>;

/// Output element type (the enum the kernel sees).
enum class GemmOut : uint32_t { BFloat16 = 0, Float32 = 1 };

/// Everything the device routine needs about one problem; built and checked once on the host
/// (mk::GemmPlan). Trivially copyable: it is a kernel parameter (tensor maps must live in param, const or
/// global memory, never in registers or shared memory).
struct GemmParams {
  GemmTensorMap mapA;  ///< A: M x K row-major, box 64 k x 128 rows
  GemmTensorMap mapB;  ///< B: N x K row-major (box 64 k x kBlockN rows) or K x N row-major (box 64 n x 64 k)
  void* c;             ///< C: M x N row-major, element type `out`
  uint64_t ldc;        ///< elements between rows of C
  uint32_t m, n, k;    ///< problem size
  uint32_t tilesM;     ///< ceil(m / kBlockM)
  uint32_t tilesN;     ///< ceil(n / kBlockN)
  uint32_t blockN;     ///< the tile width the kernel was compiled for (128 or 256): checked on entry
  uint32_t kIters;     ///< ceil(k / kBlockK)
  uint32_t groupM;     ///< tile rows per raster group (L2 reuse of B across consecutive tiles)
  GemmOut out;         ///< C's element type
  uint32_t bRowMajor;  ///< 1: B is K x N row-major (wgmma reads it transposed); 0: N x K row-major
  /// 1: the kernel was compiled with the TMA-store epilogue (checked on entry: mapC must be valid and the
  /// output bf16); 0: direct stores.
  uint32_t tmaStoreC;
  /// C as a bf16 tensor (N x M, row stride ldc), box 64 x 64, 128-byte swizzle: only with tmaStoreC = 1.
  GemmTensorMap mapC;
  /// Split-K: k-splits per tile (1 = none). Work unit u covers tile u / splitK, k-slices
  /// [kItersPerSplit * (u % splitK), min(+ kItersPerSplit, kIters)) (never empty: the host sizes it).
  uint32_t splitK;
  uint32_t kItersPerSplit;  ///< k-slices per split (= kIters without split-K)
  /// splitK > 1: tiles x splitK partial tiles of 128 x blockN fp32 in fragment order (element r of consumer
  /// thread t at r * 256 + t), and one arrival counter per tile (0 between launches: the last unit resets it).
  float* workspace;
  uint32_t* tileCounters;
  /// Optional, 8 words of host-mapped memory, zero at launch: a wait that times out writes
  /// {2, cta, thread, waiter (1 producer: stage free, 2 consumer: stage loaded), stage, parity, tile}
  /// (word 0 last) before trapping, so the host can say who waited for what after the context is lost.
  uint32_t* timeoutReport;
  /// 1: C += A * B (the old C is read in the epilogue; direct epilogue only), 0: C = A * B.
  uint32_t accumulate;
  /// Written as word 7 of a timeout report (the resident kernel puts lane << 16 | step there).
  uint32_t tag;
  /// Budget of every mbarrier wait in ns; 0 = kGemmWaitLimitNs (the resident kernel uses its pollBudget).
  uint64_t waitLimitNs;
  /// Stream-K (standalone plans only; always 0 in the resident kernel): the LAST skTiles tiles of the raster are
  /// not run as whole tiles but as equal contiguous ranges of their k-iterations, one per CTA 0 .. skCtas - 1
  /// (GemmStreamK). The tiles before them are data-parallel units (whole waves). A tile cut between CTAs is
  /// summed by the last piece to arrive: workspace holds 2 fp32 partial tiles per stream-K CTA
  /// (GemmStreamK::slot) and tileCounters one counter per stream-K tile. 0 = no stream-K.
  uint32_t skTiles;
  uint32_t skCtas;  ///< CTAs that share the stream-K iterations (<= the launch's CTAs, <= its iterations)
};

/// The stream-K partition (docs/gemm.md, "Stream-K"): `tiles` x `kIters` k-iterations, tile-major (iteration i
/// is k-slice i % kIters of stream-K tile i / kIters), cut into `ctas` contiguous ranges whose sizes differ by
/// at most one (the first iters() % ctas CTAs get one more): CTA c runs [begin(c), begin(c + 1)) and CTAs >=
/// ctas run nothing. Every CTA and the host derive the same pieces from this arithmetic alone: no CTA waits
/// for another, and the last piece of a tile to arrive (per-tile counter == pieces(tile)) adds the others'
/// partials. 32-bit arithmetic only (iters() < 2^32, host-checked; a 64-bit division in the consumers' fix-up
/// costs registers they do not have). Built by gemmStreamK (ctas <= iters(), so no range is empty);
/// unit-tested exhaustively on the host (test_gemm_unit.cpp).
struct GemmStreamK {
  uint32_t tiles = 0;   ///< tiles in the stream-K region
  uint32_t kIters = 0;  ///< k-iterations (64-wide slices) per tile
  uint32_t ctas = 0;    ///< CTAs with a non-empty range
  /// Total k-iterations of the region.
  MK_HOST_DEVICE_INLINE uint32_t iters() const { return tiles * kIters; }
  /// First iteration of CTA `cta`; begin(c) = iters() for every c >= ctas (empty ranges).
  MK_HOST_DEVICE_INLINE uint32_t begin(uint32_t cta) const {
    if (cta >= ctas) return iters();
    const uint32_t base = iters() / ctas, rem = iters() % ctas;
    return cta * base + (cta < rem ? cta : rem);
  }
  /// The CTA whose range holds iteration i (< iters()).
  MK_HOST_DEVICE_INLINE uint32_t owner(uint32_t i) const {
    const uint32_t base = iters() / ctas, rem = iters() % ctas;
    const uint32_t longPart = rem * (base + 1);  // iterations of the CTAs with one more
    return i < longPart ? i / (base + 1) : rem + (i - longPart) / base;
  }
  /// The CTA that runs the first k-iteration of stream-K tile `tile`; the tile's pieces are CTAs
  /// firstCta(tile) .. firstCta(tile) + pieces(tile) - 1 (consecutive: no range is empty).
  MK_HOST_DEVICE_INLINE uint32_t firstCta(uint32_t tile) const { return owner(tile * kIters); }
  /// CTAs that run part of stream-K tile `tile` (1: one CTA runs it whole and stores it like a plain tile).
  MK_HOST_DEVICE_INLINE uint32_t pieces(uint32_t tile) const {
    return owner((tile + 1) * kIters - 1) - firstCta(tile) + 1;
  }
  /// Workspace slot of CTA `cta`'s piece of tile `tile`: 2 cta for the tile its range starts in, 2 cta + 1 for
  /// the tile it ends in (a range cuts at most two tiles; the tiles between are whole and need no slot).
  MK_HOST_DEVICE_INLINE uint32_t slot(uint32_t cta, uint32_t tile) const {
    return 2 * cta + (tile == begin(cta) / kIters ? 0u : 1u);
  }
};

/// The stream-K partition of `tiles` x `kIters` iterations (< 2^32) over at most `ctas` CTAs: min(ctas,
/// iterations) CTAs get a non-empty range, the others nothing.
MK_HOST_DEVICE_INLINE GemmStreamK gemmStreamK(uint32_t tiles, uint32_t kIters, uint32_t ctas) {
  GemmStreamK s;
  s.tiles = tiles;
  s.kIters = kIters;
  const uint32_t iters = s.iters();
  s.ctas = iters < ctas ? iters : ctas;
  return s;
}

/// The stream-K partition of a problem's params (skTiles = 0: an empty one).
MK_HOST_DEVICE_INLINE GemmStreamK gemmStreamKOf(const GemmParams& p) {
  GemmStreamK s;
  s.tiles = p.skTiles;
  s.kIters = p.kIters;
  s.ctas = p.skCtas;
  return s;
}

/// The LAST segment of the stream-K range [begin, end) (begin < end): stream-K tile `tile` (the one iteration
/// end - 1 lies in), k-slices [kBegin, kEnd) from max(begin, the tile's start) to end. The CTAs walk their
/// ranges from the end (the tile a range ends in first, from k = 0; the tile it starts in last): then every CTA
/// reads k-slice ~t at time t of the region (0 to one range-minus-tile length behind), so the CTAs that share
/// an A row or a B column panel read the same slices within a few iterations of each other (L2 hits). Walked
/// forward, neighbours would be a whole range-minus-tile length apart per CTA (docs/gemm.md, "Stream-K").
/// 32-bit: the host keeps iters() < 2^32.
MK_HOST_DEVICE_INLINE void gemmStreamKLastSegment(const GemmStreamK& s, uint32_t begin, uint32_t end, uint32_t& tile,
                                                  uint32_t& kBegin, uint32_t& kEnd) {
  tile = (end - 1) / s.kIters;
  const uint32_t tileStart = tile * s.kIters;
  kBegin = begin > tileStart ? begin - tileStart : 0;
  kEnd = end - tileStart;
}

/// Output tile `tile` of the grouped raster: consecutive tile indices walk down `groupM` tile rows, then
/// move one tile column right, so the CTAs running at the same time share both A rows and B columns in L2.
MK_HOST_DEVICE_INLINE void gemmTileCoord(const GemmParams& p, uint32_t tile, uint32_t& tileM, uint32_t& tileN) {
  const uint32_t perGroup = p.groupM * p.tilesN;
  const uint32_t group = tile / perGroup;
  const uint32_t firstM = group * p.groupM;
  const uint32_t rows = (p.tilesM - firstM) < p.groupM ? (p.tilesM - firstM) : p.groupM;
  const uint32_t inGroup = tile % perGroup;
  tileM = firstM + inGroup % rows;
  tileN = inGroup / rows;
}

/// Work units of a problem: tiles x splitK (unit u = tile * splitK + split: the splits of a tile are
/// neighbours, so they run at the same time and share their A rows and B columns in L2).
/// With stream-K (p.skTiles > 0) only the data-parallel tiles before the stream-K region are units.
MK_HOST_DEVICE_INLINE uint32_t gemmUnitCount(const GemmParams& p) {
  return p.tilesM * p.tilesN * (p.splitK > 1 ? p.splitK : 1u) - p.skTiles;
}

/// Tile, split and k-slice range [kBegin, kEnd) of work unit `unit`.
MK_HOST_DEVICE_INLINE void gemmUnit(const GemmParams& p, uint32_t unit, uint32_t& tile, uint32_t& split,
                                    uint32_t& kBegin, uint32_t& kEnd) {
  if (p.splitK > 1) {
    tile = unit / p.splitK;
    split = unit % p.splitK;
    kBegin = split * p.kItersPerSplit;
    kEnd = kBegin + p.kItersPerSplit < p.kIters ? kBegin + p.kItersPerSplit : p.kIters;
  } else {
    tile = unit;
    split = 0;
    kBegin = 0;
    kEnd = p.kIters;
  }
}

/// The work of one CTA, in order: its data-parallel units unit, unit + stride, ... < end, then (standalone
/// kernels with stream-K only) the segments of its stream-K range [skNext, skEnd), last segment first
/// (gemmStreamKLastSegment). Host and device code (the unit tests replay the kernel's walk). Producer and consumers
/// walk the same sequence. 32-bit iteration indices (the host keeps a stream-K region below 2^32 iterations): the
/// consumers' 128 accumulators leave no register for 64-bit cursors (measured: spills).
struct GemmWorkCursor {
  uint32_t unit, stride, end;
  uint32_t skNext, skEnd;
  /// The next piece of work: raster tile `tile`, split-K piece `split`, k-slices [kBegin, kEnd); false when done.
  template <bool kResident>
  MK_HOST_DEVICE_INLINE bool next(const GemmParams& p, uint32_t& tile, uint32_t& split, uint32_t& kBegin,
                                  uint32_t& kEnd) {
    if (unit < end) {
      gemmUnit(p, unit, tile, split, kBegin, kEnd);
      unit += stride;
      return true;
    }
    if constexpr (!kResident) {
      if (skNext < skEnd) {
        uint32_t skTile = 0;
        gemmStreamKLastSegment(gemmStreamKOf(p), skNext, skEnd, skTile, kBegin, kEnd);
        skEnd -= kEnd - kBegin;  // from the end of the range: see gemmStreamKLastSegment
        tile = p.tilesM * p.tilesN - p.skTiles + skTile;
        split = 0;
        return true;
      }
    }
    return false;
  }
};

/// The cursor of CTA `cta` (its stream-K range; empty without stream-K or in the resident kernel).
template <bool kResident>
MK_HOST_DEVICE_INLINE GemmWorkCursor gemmWorkCursor(const GemmParams& p, uint32_t first, uint32_t stride, uint32_t end,
                                                    uint32_t cta) {
  GemmWorkCursor w{first, stride, end, 0, 0};
  if constexpr (!kResident) {
    if (p.skTiles != 0) {
      const GemmStreamK sk = gemmStreamKOf(p);
      w.skNext = sk.begin(cta);
      w.skEnd = sk.begin(cta + 1);
    }
  }
  return w;
}

/// The hook that does nothing (the standalone GEMM): no barrier or fence is spent on it.
struct GemmNoHook {
  static constexpr bool kEnabled = false;  ///< skip the per-tile consumer barrier
  /// Never called.
  MK_HOST_DEVICE_INLINE void operator()(uint32_t, uint32_t) const {}
};

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
  const uint64_t start = globalTimerNs();
  for (uint32_t spin = 0;; ++spin) {
    if (mbarTryWait(bar, parity)) return;
    const uint64_t limit = kResident && p.waitLimitNs != 0 ? p.waitLimitNs : kGemmWaitLimitNs;
    if ((spin & 255) == 255 && globalTimerNs() - start > limit) {
      if (p.timeoutReport != nullptr && atomicCAS(p.timeoutReport, 0u, 1u) == 0u) {
        volatile uint32_t* r = p.timeoutReport;
        r[1] = blockIdx.x;
        r[2] = threadIdx.x;
        r[3] = static_cast<uint32_t>(who);
        r[4] = stage;
        r[5] = parity;
        r[6] = tile;
        if (kResident) r[7] = p.tag;
        __threadfence_system();
        r[0] = 2;  // written last: the report is complete
      }
      __threadfence_system();
      __trap();
    }
  }
}

/// 2-D TMA load of one box into shared memory, completing (complete_tx) on mbarrier `bar`.
MK_DEVICE_INLINE void tmaLoad2d(uint32_t dst, const GemmTensorMap* map, int32_t inner, int32_t outer, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], [%4];\n" ::"r"(
          dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(inner), "r"(outer), "r"(bar)
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
    __syncwarp();
    namedBarrier<kGiveBackBarrier, Cfg::kThreads>();
    asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(Cfg::kLaunchRegs));
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
    // direct epilogue has no warpgroup barrier of its own after the inc above.
    namedBarrier<1, 128 * Cfg::kConsumerWarpgroups>();
    asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(Cfg::kLaunchRegs));
    // Register hand-back, in this order (the CTA's register pool is first come, first served): the
    // consumers give their extra registers back (dec above), then arrive on kGiveBackBarrier, on which the
    // producer waits before its inc. An inc issued earlier (the producer's idle warps used to reach it a few
    // instructions after their dec) could take back registers the consumers had not claimed yet: their inc
    // would then block for ever (a hang no wait bound sees), or the producer's empty-stage wait would trap.
    // The barrier is also the explicit warpgroup synchronisation the PTX ISA asks for between the
    // producer's dec and inc. Both branches end at kLaunchRegs (ptxas needs the same count where they join).
    asm volatile("bar.arrive %0, %1;\n" ::"n"(kGiveBackBarrier), "n"(Cfg::kThreads) : "memory");
  }
  if constexpr (kResident) {
    // Every warp is back at kLaunchRegs and every TMA transaction has completed (each full barrier's last
    // phase was waited for): the barriers may be invalidated, and are before any thread leaves (the next
    // step may re-initialise the same shared memory).
    __syncthreads();
    if (threadIdx.x == 0) {
      for (uint32_t s = 0; s < Cfg::kStages; ++s) {
        asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(fullBar + 8 * s) : "memory");
        asm volatile("mbarrier.inval.shared::cta.b64 [%0];\n" ::"r"(emptyBar + 8 * s) : "memory");
      }
    }
    __syncthreads();
  }
}

#endif  // MK_HAVE_DEVICE_CODE

}  // namespace mk::device
