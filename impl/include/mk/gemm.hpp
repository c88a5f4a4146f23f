// mkernel — the standalone launch path of the Hopper GEMM engine: C = A * B on one GPU.
//
// bf16 inputs, fp32 accumulation, bf16 or fp32 output; A row-major (M x K); B row-major (K x N) or
// column-major (an N x K row-major array, the "TN" case); C row-major (M x N). The device side
// (mk/device/gemm_device.hpp) is what fused operators run on their compute lanes; this header plans and
// launches it as a kernel of its own (persistent grid of `ctas` CTAs, one 128 x 256 output tile at a time).
//
// Alignment rule (TMA): A and B start on 16-byte boundaries and lda, ldb are multiples of 8 elements
// (16 bytes of bf16). C starts on a 16-byte boundary and ldc is a multiple of 8 elements. So K itself may
// be any value >= 1 (K = 3 with lda = 8 is fine), as may M and N; only the strides are constrained.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>
#include <string>

#include "mk/gemm_choice.hpp"
#include "mk/schedule/types.hpp"

namespace mk {

/// How B is stored.
enum class GemmLayout : uint8_t {
  RowMajor = 0,  ///< B is K x N, element (k, n) at b[k * ldb + n]
  ColMajor = 1,  ///< B is stored column by column: element (k, n) at b[n * ldb + k] (an N x K row-major array)
};

/// "row" / "col".
const char* toString(GemmLayout layout) noexcept;

/// How finished tiles leave the consumer warpgroups (docs/gemm.md, "Epilogues").
enum class GemmEpilogue : uint8_t {
  /// Registers straight to global memory; the tensor cores idle while a tile is stored. 4 stages (256-wide).
  Direct = 0,
  /// bf16 output only: registers to a 32 KiB shared-memory staging buffer (128 columns per pass), then TMA
  /// bulk stores that drain while the next tile's main loop runs; same stages as Direct. With fp32 output it
  /// falls back to Direct (fp32 staging would halve the columns per pass); GemmTiles::epilogue says which ran.
  TmaStore = 1,
};

/// "direct" / "tma-store".
const char* toString(GemmEpilogue epilogue) noexcept;

/// One GEMM: C (M x N) = A (M x K) * B (K x N). Signed sizes so that a negative value is reported, not wrapped.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;                ///< sizes, each >= 1
  const void* a = nullptr;                    ///< bf16, row-major, lda >= k
  int64_t lda = 0;                            ///< elements between rows of A
  const void* b = nullptr;                    ///< bf16, see layoutB
  int64_t ldb = 0;                            ///< RowMajor: >= n; ColMajor: >= k
  GemmLayout layoutB = GemmLayout::RowMajor;  ///< B's storage order
  void* c = nullptr;                          ///< output, row-major, ldc >= n
  int64_t ldc = 0;                            ///< elements between rows of C
  DType outDType = DType::BFloat16;           ///< BFloat16 or Float32
};

/// How to run it.
struct GemmConfig {
  /// CTAs of the persistent grid (one per SM at most: each needs ~193 KiB of shared memory); 0 = every SM.
  /// Fewer CTAs leave SMs free for other work (the fused operators' communication lanes).
  int64_t ctas = 0;
  /// Tile rows per raster group: CTAs running at once share A rows and B columns in L2. >= 1.
  int64_t groupM = 8;
  /// Output tile width: 256 (128 x 256 tiles), 128 (128 x 128 tiles) or 0 = choose per problem: the narrower
  /// tile when its wave count (ceil(tiles / CTAs)) makes it faster under the cost model of gemmChooseTileN.
  int64_t tileN = 0;
  /// Epilogue variant. TmaStore (the default) overlaps the store with the next tile: measured on H200 equal or
  /// faster on every reference shape (--shapes reference; docs/gemm.md has the numbers); it runs only for
  /// bf16 output with N a multiple of 8, Direct otherwise (GemmTiles::epilogue says which ran).
  GemmEpilogue epilogue = GemmEpilogue::TmaStore;
  /// Split-K: each output tile's k-range is cut into this many pieces run by different CTAs (work units =
  /// tiles x splitK), for problems with too few tiles to fill the CTAs (e.g. M = 512, N = 8192 on 116 CTAs).
  /// Each piece writes an fp32 partial tile to a workspace the plan allocates; the last piece of a tile to
  /// finish adds the others and stores the tile (and calls the hook). 1 = off. In [1, 64]; reduced so that no
  /// piece is empty (GemmTiles::splitK). A split-K plan must not run on two streams at once (shared workspace).
  int64_t splitK = 1;
  /// Tile schedule: Auto (the default), Tiles or StreamK; GemmTiles::schedule says which runs. Stream-K needs a
  /// workspace the plan allocates (2 fp32 partial tiles per CTA); like split-K, such a plan must not run on two
  /// streams at once. StreamK with splitK > 1 is refused.
  GemmSchedule schedule = GemmSchedule::Auto;
  /// Test aid: when set, a device array of tilesM * tilesN counters (the GemmTiles validateGemm returns for
  /// the device's SM count); the per-tile hook adds 1 to hookCounts[tileM * tilesN + tileN] once the tile's
  /// stores are visible. nullptr = no hook (fastest).
  uint32_t* hookCounts = nullptr;
};

/// The engine's output tile (rows x columns) and stage depth, for callers sizing hook arrays or grids.
struct GemmTileShape {
  uint32_t blockM = 0, blockN = 0, blockK = 0, stages = 0;
  uint32_t smemBytes = 0;  ///< dynamic shared memory per CTA
  uint32_t threads = 0;    ///< threads per CTA
};
/// The compiled tile shape of tile width `blockN` (128 or 256; anything else reads as 256) and epilogue
/// (TmaStore: 32 KiB more shared memory for the C staging buffer).
GemmTileShape gemmTileShape(uint32_t blockN = 256, GemmEpilogue epilogue = GemmEpilogue::Direct) noexcept;

/// Tiles of a problem (ceil(M / blockM) x ceil(N / blockN)).
struct GemmTiles {
  uint64_t blockN = 256;  ///< the tile width chosen
  uint64_t tilesM = 0, tilesN = 0;
  /// The epilogue that runs: config.epilogue, except TmaStore with fp32 output runs Direct.
  GemmEpilogue epilogue = GemmEpilogue::Direct;
  uint64_t splitK = 1;          ///< k-pieces per tile that run (config.splitK, reduced so none is empty)
  uint64_t kItersPerSplit = 0;  ///< 64-wide k-slices per piece
  GemmSchedule schedule = GemmSchedule::Tiles;  ///< the schedule that runs (Tiles or StreamK, never Auto)
  uint64_t streamKTiles = 0;                    ///< stream-K: the last tiles of the raster run as k-ranges (0 = none)
  uint64_t streamKCtas = 0;                     ///< stream-K: CTAs with a k-range (min(CTAs, streamKTiles x kIters))
  uint64_t ctas = 0;                            ///< CTAs the kernel is launched with
  uint64_t count() const { return tilesM * tilesN; }   ///< total output tiles
  uint64_t units() const { return count() * splitK; }  ///< work units (tiles x k-pieces)
};

/// Check a problem and config without touching a GPU; `smCount` is the device's SM count.
/// Throws Error(InvalidArgument) naming the field, what was expected and what was seen, or
/// Error(Unsupported) for an output dtype other than bf16 / fp32. Returns the tile grid.
GemmTiles validateGemm(const GemmProblem& problem, const GemmConfig& config, int64_t smCount);

/// A validated, lowered GEMM for the current CUDA device: TMA descriptors encoded once, run many times.
/// The caller owns A, B, C and hookCounts, which must outlive every run. Device memory of its own only with
/// split-K or stream-K (the fp32 partial tiles and per-tile counters, allocated here, freed by the destructor).
class GemmPlan {
 public:
  /// Validates against the current device (sm_90 required: wgmma and TMA) and encodes the tensor maps.
  GemmPlan(const GemmProblem& problem, const GemmConfig& config);
  ~GemmPlan();
  GemmPlan(GemmPlan&&) noexcept;
  GemmPlan& operator=(GemmPlan&&) noexcept;
  GemmPlan(const GemmPlan&) = delete;
  GemmPlan& operator=(const GemmPlan&) = delete;

  /// Enqueue one GEMM on `stream` (asynchronous; launch errors throw Error(CudaError)).
  void run(cudaStream_t stream) const;
  /// CTAs the kernel is launched with (config.ctas, or the SM count, never more than the work: tiles, or with
  /// stream-K and less than two waves, k-iterations).
  uint32_t ctas() const;
  /// The tile grid.
  GemmTiles tiles() const;
  /// "" normally; after a GEMM on this plan's device trapped because a bounded device wait expired (10 s),
  /// which CTA and thread waited for which shared-memory stage of which tile (read from host memory the
  /// kernel wrote before trapping, so valid although the CUDA context is lost; shared by the device's plans).
  std::string timeoutReport() const;

 private:
  struct Impl;
  Impl* impl_ = nullptr;
};

/// Plan and run once (convenience; repeated calls should keep a GemmPlan).
void gemm(const GemmProblem& problem, const GemmConfig& config, cudaStream_t stream);

}  // namespace mk
