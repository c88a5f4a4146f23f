// The GEMM tile engine's tile width and schedule choice (mk/gemm_choice.hpp): CUDA-free, run in every build.
#include <doctest/doctest.h>

#include <cstdint>

#include "mk/gemm_choice.hpp"

TEST_CASE("gemm choice: the tile width choice removes badly filled last waves only") {
  // 1024 x 8192: 256 wide tiles on 132 CTAs fill 2 waves (keep 256); on 116 CTAs 3 waves, of which the
  // last is 21 % busy, against 5 waves of half-size tiles (take 128).
  CHECK(mk::gemmChooseTileN(1024, 8192, 132) == 256);
  CHECK(mk::gemmChooseTileN(1024, 8192, 116) == 128);
  CHECK(mk::gemmChooseTileN(128, 8192, 132) == 128);  // 32 wide tiles leave 100 SMs idle
  CHECK(mk::gemmChooseTileN(8192, 8192, 132) == 256);
  CHECK(mk::gemmChooseTileN(16384, 8192, 116) == 256);
  CHECK(mk::gemmChooseTileN(0, 8192, 116) == 256);  // nonsense in, the default out (validation rejects it)
}

TEST_CASE("gemm stream-K: whole waves stay tiles and the remainder is between one and two waves") {
  CHECK(mk::gemmStreamKTileCount(128, 116) == 128);  // one wave and a bit: all stream-K
  CHECK(mk::gemmStreamKTileCount(100, 116) == 100);  // less than a wave
  CHECK(mk::gemmStreamKTileCount(256, 116) == 140);  // 1 whole wave + 140
  CHECK(mk::gemmStreamKTileCount(512, 116) == 164);  // 3 whole waves + 164
  CHECK(mk::gemmStreamKTileCount(232, 116) == 116);  // 2 exact waves: 1 whole + 1 stream-K (no cuts)
  CHECK(mk::gemmStreamKTileCount(7, 0) == 7);
  for (uint64_t tiles = 1; tiles < 1000; tiles += 7)
    for (uint64_t ctas = 1; ctas < 140; ctas += 3) {
      const uint64_t sk = mk::gemmStreamKTileCount(tiles, ctas);
      CHECK((tiles - sk) % ctas == 0);
      CHECK((sk == tiles || (sk >= ctas && sk < 2 * ctas)));
    }
}

TEST_CASE("gemm stream-K: Auto takes it only where the last wave is partly idle and the pieces are long") {
  using mk::GemmSchedule;
  auto pick = [](int64_t m, int64_t n, int64_t k, int64_t ctas) {
    return mk::gemmChooseSchedule(m, n, k, ctas, 0, GemmSchedule::Auto);
  };
  // The reference table's gap: 128 wide tiles on 116 CTAs (2 waves, the second 10 % full).
  mk::GemmScheduleChoice c = pick(512, 8192, 8192, 116);
  CHECK(c.schedule == GemmSchedule::StreamK);
  CHECK(c.blockN == 256);
  CHECK(c.streamKTime < 0.8 * c.tilesTime);
  CHECK(pick(1024, 8192, 14336, 116).schedule == GemmSchedule::StreamK);
  // Measured slower with stream-K on H200 (the model alone picked it): short k-loops (32 and 16 slices) and
  // fewer tiles than CTAs (64 narrow tiles on 116).
  CHECK(pick(4096, 4096, 2048, 116).schedule == GemmSchedule::Tiles);
  CHECK(pick(2048, 2048, 1024, 116).schedule == GemmSchedule::Tiles);
  CHECK(pick(128, 8192, 8192, 116).schedule == GemmSchedule::Tiles);
  CHECK(mk::gemmChooseSchedule(4096, 4096, 2048, 116, 0, GemmSchedule::StreamK).schedule == GemmSchedule::StreamK);
  CHECK(pick(512, 8192, 4096, 116).schedule == GemmSchedule::StreamK);  // 64 slices: the shortest taken
  CHECK(pick(512, 8192, 4032, 116).schedule == GemmSchedule::Tiles);    // 63 slices
  // Full (or nearly full) waves: whole tiles.
  CHECK(pick(512, 8192, 8192, 128).schedule == GemmSchedule::Tiles);   // 128 tiles on 128 CTAs
  CHECK(pick(4096, 4096, 2048, 132).schedule == GemmSchedule::Tiles);  // 3.9 waves
  CHECK(pick(8192, 8192, 4096, 132).schedule == GemmSchedule::Tiles);
  CHECK(pick(16384, 8192, 14336, 116).schedule == GemmSchedule::Tiles);
  CHECK(pick(16384, 16384, 8192, 132).schedule == GemmSchedule::Tiles);
  // Too little work per CTA (64 narrow tiles on 132 CTAs: under half a tile each): whole tiles, width as before.
  c = pick(128, 8192, 8192, 132);
  CHECK(c.schedule == GemmSchedule::Tiles);
  CHECK(c.blockN == mk::gemmChooseTileN(128, 8192, 132));
  // Asked for explicitly: stream-K runs there too, with the width its model prefers.
  CHECK(mk::gemmChooseSchedule(128, 8192, 8192, 132, 0, GemmSchedule::StreamK).schedule == GemmSchedule::StreamK);
  // Tiles keeps the old width choice; a fixed width is kept by every schedule.
  c = mk::gemmChooseSchedule(512, 8192, 8192, 116, 0, GemmSchedule::Tiles);
  CHECK(c.schedule == GemmSchedule::Tiles);
  CHECK(c.blockN == mk::gemmChooseTileN(512, 8192, 116));
  CHECK(mk::gemmChooseSchedule(512, 8192, 8192, 116, 128, GemmSchedule::StreamK).blockN == 128);
  CHECK(mk::gemmChooseSchedule(512, 8192, 8192, 116, 256, GemmSchedule::Tiles).blockN == 256);
}
