// mkernel — how the GEMM tile engine spreads an M x N x K problem over its CTAs: the tile width and the tile
// schedule (whole tiles or stream-K), chosen by a wave model. Pure host code without CUDA: the standalone GEMM
// (mk/gemm.hpp, GemmPlan) and the lowering of a schedule's Gemm steps (impl/src/lowering/) both call it, so the
// lowering builds and is tested on machines without the CUDA toolkit.
#pragma once

#include <cstdint>

namespace mk {

/// How the output tiles are spread over the CTAs (docs/gemm.md, "Stream-K").
enum class GemmSchedule : uint8_t {
  /// Stream-K where the wave model (gemmChooseSchedule) predicts a real gain over whole tiles, every CTA gets
  /// a tile of k-work and the k-loop is long (K >= 4096); whole tiles otherwise (and always with splitK > 1).
  Auto = 0,
  /// Data-parallel: CTA c runs whole tiles c, c + ctas, ... (a partly idle last wave when tiles / CTAs rounds up).
  Tiles = 1,
  /// Whole waves of tiles, then the remaining tiles (between one and two waves' worth, or all of them when
  /// there are fewer than two waves) as equal contiguous k-iteration ranges, one per CTA; a tile cut between
  /// CTAs is summed through an fp32 workspace by its last piece. Not with splitK > 1.
  StreamK = 2,
};

/// "auto" / "tiles" / "stream-k".
const char* toString(GemmSchedule schedule) noexcept;

/// The tile width config.tileN = 0 picks for an M x N output on `ctas` CTAs. Time is modelled as
/// waves x tile area / efficiency with waves = ceil(tiles / ctas), and a 128-wide tile taken to run at
/// kGemmNarrowTileEfficiency of the 256-wide one's rate (it re-reads A twice as often per output):
/// 128 wins only when it removes a partly idle last wave (e.g. 256 tiles on 116 CTAs: 3 waves of 256-wide
/// tiles vs 5 half-size waves).
uint32_t gemmChooseTileN(int64_t m, int64_t n, int64_t ctas) noexcept;
/// Measured rate of 128 x 128 tiles relative to 128 x 256 on H200 (docs/gemm.md).
constexpr double kGemmNarrowTileEfficiency = 0.92;

/// Modelled cost of moving one fp32 partial tile (128 x 256: 128 KiB) between a CTA and L2, in k-iterations of
/// the 256-wide tile (one k-iteration streams 48 KiB of operands in ~0.7 us on H200; one SM moves a 128 KiB
/// partial in ~1 us). The 128-wide tile's partial costs half.
constexpr double kGemmStreamKPartialIters = 1.5;
/// Auto takes stream-K only when its modelled time is below this fraction of the best whole-tile schedule's.
constexpr double kGemmStreamKMinGain = 0.95;
/// ... and only for k-loops of at least this many 64-wide slices (K >= 4096): measured on H200, stream-K lost
/// at K = 2048 (4096 x 4096 on 116 CTAs: 0.89 of share against 0.94 with whole tiles) and K = 1024.
constexpr int64_t kGemmStreamKMinKIters = 64;

/// What gemmChooseSchedule decided, and the modelled times it compared (in k-iterations of a 256-wide tile on
/// one CTA: the critical path of the busiest CTA).
struct GemmScheduleChoice {
  GemmSchedule schedule = GemmSchedule::Tiles;  ///< Tiles or StreamK
  uint32_t blockN = 256;                        ///< the tile width to run
  double tilesTime = 0;                         ///< best whole-tile schedule: waves x kIters x (rate of the width)
  double streamKTime = 0;  ///< best stream-K schedule: whole waves + the CTA's range + partial-tile traffic
};

/// The schedule and width for an M x N x K problem on `ctas` CTAs; `tileN` 0 = choose the width too (else 128 /
/// 256 fixed); `requested` Auto, Tiles or StreamK (Tiles / StreamK only choose the width). Model (docs/gemm.md,
/// "Stream-K"): whole tiles take ceil(tiles / ctas) waves of kIters iterations; stream-K takes its whole waves
/// plus ceil(stream-K iterations / CTAs) plus, for a tile cut into P pieces, P partial-tile transfers on the
/// critical path of the last piece (its own write and P - 1 reads). Auto picks stream-K when it is below
/// kGemmStreamKMinGain of whole tiles AND there are at least as many tiles as CTAs AND the k-loop has at least
/// kGemmStreamKMinKIters slices: below those the pieces are so short that pipeline fill and partial sums
/// dominate (measured: 128 x 8192 x 8192 on 116 CTAs and 4096 x 4096 x 2048 on 116 ran slower with stream-K).
GemmScheduleChoice gemmChooseSchedule(int64_t m, int64_t n, int64_t k, int64_t ctas, int64_t tileN,
                                      GemmSchedule requested) noexcept;

/// Tiles of the stream-K region for `tiles` tiles on `ctas` CTAs: with at least two full waves, all but
/// (full waves - 1) waves' worth (so each CTA's stream-K range is between one and two tiles of k-work: the
/// whole waves before it run as plain tiles, with no partial sums); with fewer, every tile.
uint64_t gemmStreamKTileCount(uint64_t tiles, uint64_t ctas) noexcept;

}  // namespace mk
