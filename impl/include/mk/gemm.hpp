// mkernel — the standalone launch path of the Hopper GEMM engine (issue 6): C = A * B on one GPU.
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

#include "mk/schedule/types.hpp"

namespace mk {

/// How B is stored.
enum class GemmLayout : uint8_t {
  RowMajor = 0,  ///< B is K x N, element (k, n) at b[k * ldb + n]
  ColMajor = 1,  ///< B is stored column by column: element (k, n) at b[n * ldb + k] (an N x K row-major array)
};

/// "row" / "col".
const char* toString(GemmLayout layout) noexcept;

/// One GEMM: C (M x N) = A (M x K) * B (K x N). Signed sizes so that a negative value is reported, not wrapped.
struct GemmProblem {
  int64_t m = 0, n = 0, k = 0;                 ///< sizes, each >= 1
  const void* a = nullptr;                     ///< bf16, row-major, lda >= k
  int64_t lda = 0;                             ///< elements between rows of A
  const void* b = nullptr;                     ///< bf16, see layoutB
  int64_t ldb = 0;                             ///< RowMajor: >= n; ColMajor: >= k
  GemmLayout layoutB = GemmLayout::RowMajor;   ///< B's storage order
  void* c = nullptr;                           ///< output, row-major, ldc >= n
  int64_t ldc = 0;                             ///< elements between rows of C
  DType outDType = DType::BFloat16;            ///< BFloat16 or Float32
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
  /// Test aid: when set, a device array of tilesM * tilesN counters (the GemmTiles validateGemm returns for
  /// the device's SM count); the per-tile hook adds 1 to hookCounts[tileM * tilesN + tileN] once the tile's
  /// stores are visible. nullptr = no hook (fastest).
  uint32_t* hookCounts = nullptr;
};

/// The engine's output tile (rows x columns) and stage depth, for callers sizing hook arrays or grids.
struct GemmTileShape {
  uint32_t blockM = 0, blockN = 0, blockK = 0, stages = 0;
  uint32_t smemBytes = 0;   ///< dynamic shared memory per CTA
  uint32_t threads = 0;     ///< threads per CTA
};
/// The compiled tile shape of tile width `blockN` (128 or 256; anything else reads as 256).
GemmTileShape gemmTileShape(uint32_t blockN = 256) noexcept;

/// The tile width config.tileN = 0 picks for an M x N output on `ctas` CTAs. Time is modelled as
/// waves x tile area / efficiency with waves = ceil(tiles / ctas), and a 128-wide tile taken to run at
/// kGemmNarrowTileEfficiency of the 256-wide one's rate (it re-reads A twice as often per output):
/// 128 wins only when it removes a partly idle last wave (e.g. 256 tiles on 116 CTAs: 3 waves of 256-wide
/// tiles vs 5 half-size waves).
uint32_t gemmChooseTileN(int64_t m, int64_t n, int64_t ctas) noexcept;
/// Measured rate of 128 x 128 tiles relative to 128 x 256 on H200 (docs/gemm.md).
constexpr double kGemmNarrowTileEfficiency = 0.92;

/// Tiles of a problem (ceil(M / blockM) x ceil(N / blockN)).
struct GemmTiles {
  uint64_t blockN = 256;   ///< the tile width chosen
  uint64_t tilesM = 0, tilesN = 0;
  uint64_t count() const { return tilesM * tilesN; }  ///< total output tiles
};

/// Check a problem and config without touching a GPU; `smCount` is the device's SM count.
/// Throws Error(InvalidArgument) naming the field, what was expected and what was seen, or
/// Error(Unsupported) for an output dtype other than bf16 / fp32. Returns the tile grid.
GemmTiles validateGemm(const GemmProblem& problem, const GemmConfig& config, int64_t smCount);

/// A validated, lowered GEMM for the current CUDA device: TMA descriptors encoded once, run many times.
/// Holds no device memory (the caller owns A, B, C and hookCounts, which must outlive every run).
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
  /// CTAs the kernel is launched with (config.ctas, or the SM count, never more than the tile count).
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
