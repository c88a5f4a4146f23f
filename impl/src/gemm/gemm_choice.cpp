// mkernel — the GEMM tile engine's tile width and schedule choice (mk/gemm_choice.hpp): no CUDA.
#include "mk/gemm_choice.hpp"

#include <algorithm>

#include "mk/device/gemm_params_device.hpp"

namespace mk {

namespace {

using device::GemmTileConfig;

int64_t ceilDiv(int64_t a, int64_t b) { return (a + b - 1) / b; }

}  // namespace

const char* toString(GemmSchedule schedule) noexcept {
  switch (schedule) {
    case GemmSchedule::Auto: return "auto";
    case GemmSchedule::Tiles: return "tiles";
    case GemmSchedule::StreamK: return "stream-k";
  }
  return "unknown";
}

uint32_t gemmChooseTileN(int64_t m, int64_t n, int64_t ctas) noexcept {
  if (m < 1 || n < 1 || ctas < 1) return 256;
  const int64_t tilesM = ceilDiv(m, GemmTileConfig::kBlockM);
  const auto waves = [&](int64_t blockN) {
    const int64_t tiles = tilesM * ceilDiv(n, blockN);
    return static_cast<double>(ceilDiv(tiles, std::min(ctas, tiles)));
  };
  const double wide = waves(256) * 2.0, narrow = waves(128) / kGemmNarrowTileEfficiency;
  return narrow < wide ? 128u : 256u;
}

uint64_t gemmStreamKTileCount(uint64_t tiles, uint64_t ctas) noexcept {
  if (ctas == 0) return tiles;
  const uint64_t waves = tiles / ctas;
  return waves >= 2 ? tiles - (waves - 1) * ctas : tiles;
}

namespace {

/// Time of one k-iteration of a tile of width `blockN`, in k-iterations of the 256-wide tile.
double iterTime(int64_t blockN) { return blockN == 256 ? 1.0 : 0.5 / kGemmNarrowTileEfficiency; }

/// Modelled whole-tile time (see gemmChooseSchedule).
double tilesTime(int64_t tilesM, int64_t n, int64_t kIters, int64_t ctas, int64_t blockN) {
  const int64_t tiles = tilesM * ceilDiv(n, blockN);
  return static_cast<double>(ceilDiv(tiles, std::min(ctas, tiles)) * kIters) * iterTime(blockN);
}

/// Modelled stream-K time (see gemmChooseSchedule).
double streamKTime(int64_t tilesM, int64_t n, int64_t kIters, int64_t ctas, int64_t blockN) {
  const auto tiles = static_cast<uint64_t>(tilesM * ceilDiv(n, blockN));
  const uint64_t skTiles = gemmStreamKTileCount(tiles, static_cast<uint64_t>(ctas));
  const uint64_t dpWaves = (tiles - skTiles) / static_cast<uint64_t>(ctas);
  const uint64_t skIters = skTiles * static_cast<uint64_t>(kIters);
  const uint64_t skCtas = std::min(static_cast<uint64_t>(ctas), skIters);
  const uint64_t perCta = (skIters + skCtas - 1) / skCtas, minPerCta = skIters / skCtas;
  // A tile of kIters iterations meets at most ceil(kIters / shortest range) + 1 ranges.
  const uint64_t pieces = std::min(skCtas, (static_cast<uint64_t>(kIters) + minPerCta - 1) / minPerCta + 1);
  const double partial = kGemmStreamKPartialIters * static_cast<double>(blockN) / 256.0;
  const double fixup = pieces > 1 ? static_cast<double>(pieces + 1) * partial : 0.0;
  return static_cast<double>(dpWaves * static_cast<uint64_t>(kIters) + perCta) * iterTime(blockN) + fixup;
}

}  // namespace

GemmScheduleChoice gemmChooseSchedule(int64_t m, int64_t n, int64_t k, int64_t ctas, int64_t tileN,
                                      GemmSchedule requested) noexcept {
  GemmScheduleChoice c;
  if (m < 1 || n < 1 || k < 1 || ctas < 1) return c;
  const int64_t tilesM = ceilDiv(m, GemmTileConfig::kBlockM), kIters = ceilDiv(k, GemmTileConfig::kBlockK);
  const int64_t tilesWidth = tileN == 128 || tileN == 256 ? tileN : gemmChooseTileN(m, n, ctas);
  c.tilesTime = tilesTime(tilesM, n, kIters, ctas, tilesWidth);
  int64_t skWidth = tileN == 128 || tileN == 256 ? tileN : 256;
  c.streamKTime = streamKTime(tilesM, n, kIters, ctas, skWidth);
  if (tileN != 128 && tileN != 256) {
    const double narrow = streamKTime(tilesM, n, kIters, ctas, 128);
    if (narrow < c.streamKTime) {
      c.streamKTime = narrow;
      skWidth = 128;
    }
  }
  bool streamK = requested == GemmSchedule::StreamK;
  if (requested == GemmSchedule::Auto) {
    const int64_t skTiles = tilesM * ceilDiv(n, skWidth);
    // The model alone also picked stream-K for short k-loops and for fewer tiles than CTAs, and both measured
    // slower on H200 (docs/gemm.md, "Stream-K", measured): pipeline fill and the partial sums are paid per
    // piece, so a piece needs a long k-range and each CTA at least one tile of work.
    streamK = c.streamKTime < kGemmStreamKMinGain * c.tilesTime && skTiles >= ctas && kIters >= kGemmStreamKMinKIters;
  }
  c.schedule = streamK ? GemmSchedule::StreamK : GemmSchedule::Tiles;
  c.blockN = static_cast<uint32_t>(streamK ? skWidth : tilesWidth);
  return c;
}

}  // namespace mk
