// mkernel — the Hopper GEMM tile engine's parameters and work division, shared by the host and the device:
// the tensor-map bytes, the tile configurations, GemmParams, stream-K's split of the last tiles, the tile order and
// the work cursor (gemm_device.hpp runs them; the host fills them in gemm/).
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

}  // namespace mk::device
