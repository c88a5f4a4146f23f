// CPU-only tests of the GEMM engine's host validation (mk::validateGemm): no GPU, no allocation; the
// pointers are plain addresses that are never dereferenced.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <set>
#include <string>
#include <vector>

#include "mk/device/gemm_device.hpp"
#include "mk/error.hpp"
#include "mk/gemm.hpp"

namespace {

void* addr(uintptr_t a) { return reinterpret_cast<void*>(a); }

mk::GemmProblem good() {
  return {1000,
          700,
          300,
          addr(0x10000),
          304,
          addr(0x20000),
          704,
          mk::GemmLayout::RowMajor,
          addr(0x30000),
          704,
          mk::DType::BFloat16};
}

/// good() resized to M x N x K, B row-major, with the tightest strides the alignment rule allows.
mk::GemmProblem sized(int64_t m, int64_t n, int64_t k) {
  mk::GemmProblem p = good();
  p.m = m;
  p.n = n;
  p.k = k;
  p.lda = (k + 7) / 8 * 8;
  p.ldb = (n + 7) / 8 * 8;
  p.ldc = (n + 7) / 8 * 8;
  return p;
}

/// The error code thrown, and the message through `msg`.
mk::ErrorCode codeOf(const mk::GemmProblem& p, const mk::GemmConfig& c, std::string* msg = nullptr) {
  try {
    mk::validateGemm(p, c, 132);
  } catch (const mk::Error& e) {
    if (msg) *msg = e.message();
    return e.code();
  }
  FAIL("no error thrown");
  return mk::ErrorCode::Internal;
}

}  // namespace

TEST_CASE("gemm validation: a good problem gives its tile grid") {
  mk::GemmConfig wide;
  wide.tileN = 256;
  const mk::GemmTiles t = mk::validateGemm(good(), wide, 132);
  CHECK(t.tilesM == 8);  // ceil(1000 / 128)
  CHECK(t.tilesN == 3);  // ceil(700 / 256)
  CHECK(t.count() == 24);
  const mk::GemmTileShape s = mk::gemmTileShape();
  CHECK(s.blockM == 128);
  CHECK(s.blockN == 256);
  CHECK(s.threads == 384);
  CHECK(s.smemBytes <= 227u * 1024u);
}

TEST_CASE("gemm validation: zero or negative sizes are rejected naming the size") {
  std::string msg;
  auto p = good();
  p.m = 0;
  CHECK(codeOf(p, {}, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("m must be") != std::string::npos);
  p = good();
  p.n = -5;
  CHECK(codeOf(p, {}, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("-5") != std::string::npos);
  p = good();
  p.k = 0;
  CHECK(codeOf(p, {}) == mk::ErrorCode::InvalidArgument);
}

TEST_CASE("gemm validation: TMA alignment of pointers and leading dimensions") {
  std::string msg;
  auto p = good();
  p.a = addr(0x10008);  // 8-byte aligned only
  CHECK(codeOf(p, {}, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("16-byte") != std::string::npos);
  p = good();
  p.b = nullptr;
  CHECK(codeOf(p, {}, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("null") != std::string::npos);
  p = good();
  p.lda = 301;  // >= k but rows not 16-byte aligned
  CHECK(codeOf(p, {}, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("lda") != std::string::npos);
  p = good();
  p.lda = 296;  // < k
  CHECK(codeOf(p, {}) == mk::ErrorCode::InvalidArgument);
  p = good();
  p.ldb = 696;  // row-major B needs ldb >= n
  CHECK(codeOf(p, {}) == mk::ErrorCode::InvalidArgument);
  p.layoutB = mk::GemmLayout::ColMajor;  // column-major B needs ldb >= k only
  CHECK_NOTHROW(mk::validateGemm(p, {}, 132));
  p = good();
  p.ldc = 700;  // >= n but not a multiple of 8
  CHECK(codeOf(p, {}) == mk::ErrorCode::InvalidArgument);
  p = good();
  p.k = 3;
  p.lda = 8;  // K need not be aligned: only the strides are
  CHECK_NOTHROW(mk::validateGemm(p, {}, 132));
}

TEST_CASE("gemm validation: dtype layout and CTA count") {
  auto p = good();
  p.outDType = mk::DType::Float16;
  CHECK(codeOf(p, {}) == mk::ErrorCode::Unsupported);
  p = good();
  p.layoutB = static_cast<mk::GemmLayout>(7);
  CHECK(codeOf(p, {}) == mk::ErrorCode::Unsupported);
  mk::GemmConfig c;
  c.ctas = 133;
  CHECK(codeOf(good(), c) == mk::ErrorCode::InvalidArgument);
  c.ctas = -1;
  CHECK(codeOf(good(), c) == mk::ErrorCode::InvalidArgument);
  c.ctas = 132;
  CHECK_NOTHROW(mk::validateGemm(good(), c, 132));
  c.ctas = 0;
  c.groupM = 0;
  CHECK(codeOf(good(), c) == mk::ErrorCode::InvalidArgument);
}

TEST_CASE("gemm validation: a fixed tile width is checked and kept") {
  mk::GemmConfig c;
  c.tileN = 192;
  CHECK(codeOf(good(), c) == mk::ErrorCode::InvalidArgument);
  c.tileN = 128;
  const mk::GemmTiles t = mk::validateGemm(good(), c, 132);
  CHECK(t.blockN == 128);
  CHECK(t.tilesN == 6);  // ceil(700 / 128)
  CHECK(mk::gemmTileShape(128).stages == 6);
}

TEST_CASE("gemm validation: the tma-store epilogue runs for bf16 output only and keeps the stage count") {
  mk::GemmConfig cfg;
  CHECK(cfg.epilogue ==
        mk::GemmEpilogue::TmaStore);  // the default (measured faster on every reference shape, --shapes reference)
  cfg.epilogue = mk::GemmEpilogue::Direct;
  CHECK(mk::validateGemm(good(), cfg, 132).epilogue == mk::GemmEpilogue::Direct);
  cfg.epilogue = mk::GemmEpilogue::TmaStore;
  mk::GemmProblem n8 = good();
  n8.n = 704;  // a multiple of 8: whole 16-byte pieces per row
  CHECK(mk::validateGemm(n8, cfg, 132).epilogue == mk::GemmEpilogue::TmaStore);
  // N = 700: a TMA store would write past column N inside the last 16 bytes of a row (seen on H200).
  CHECK(mk::validateGemm(good(), cfg, 132).epilogue == mk::GemmEpilogue::Direct);
  mk::GemmProblem f32 = good();
  f32.n = 704;
  f32.outDType = mk::DType::Float32;
  CHECK(mk::validateGemm(f32, cfg, 132).epilogue == mk::GemmEpilogue::Direct);  // no fp32 staging buffer
  cfg.epilogue = static_cast<mk::GemmEpilogue>(9);
  std::string msg;
  CHECK(codeOf(good(), cfg, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("epilogue") != std::string::npos);
  CHECK(msg.find("9") != std::string::npos);
  CHECK(std::string(mk::toString(mk::GemmEpilogue::TmaStore)) == "tma-store");
  CHECK(std::string(mk::toString(mk::GemmEpilogue::Direct)) == "direct");
  // Shared memory: 32 KiB of staging (128 rows x 128 bf16 columns per pass) next to the same stages as the
  // direct epilogue (the main loop is unchanged); both widths stay within the 227 KiB a Hopper CTA may use.
  for (uint32_t width : {128u, 256u}) {
    const mk::GemmTileShape direct = mk::gemmTileShape(width),
                            staged = mk::gemmTileShape(width, mk::GemmEpilogue::TmaStore);
    CHECK(staged.stages == direct.stages);
    CHECK(staged.smemBytes - direct.smemBytes == 128 * 128 * 2);
    CHECK(staged.threads == direct.threads);
    CHECK(staged.smemBytes <= 227 * 1024);
  }
  CHECK(mk::gemmTileShape(256).stages == 4);
  CHECK(mk::gemmTileShape(128).stages == 6);
  const mk::GemmTileShape wideStaged = mk::gemmTileShape(256, mk::GemmEpilogue::TmaStore);
  const mk::GemmTileShape narrowStaged = mk::gemmTileShape(128, mk::GemmEpilogue::TmaStore);
  CHECK(wideStaged.smemBytes <= 227 * 1024);
  CHECK(narrowStaged.smemBytes <= 227 * 1024);
}

TEST_CASE("gemm validation: split-K pieces are never empty and the range is checked") {
  mk::GemmConfig cfg;
  mk::GemmTiles t = mk::validateGemm(good(), cfg, 132);  // K = 300: 5 slices of 64
  CHECK(t.splitK == 1);
  CHECK(t.kItersPerSplit == 5);
  CHECK(t.units() == t.count());
  cfg.splitK = 2;
  t = mk::validateGemm(good(), cfg, 132);
  CHECK(t.splitK == 2);
  CHECK(t.kItersPerSplit == 3);  // 3 + 2
  CHECK(t.units() == 2 * t.count());
  cfg.splitK = 4;
  t = mk::validateGemm(good(), cfg, 132);
  CHECK(t.kItersPerSplit == 2);  // 2 + 2 + 1
  CHECK(t.splitK == 3);
  cfg.splitK = 64;
  t = mk::validateGemm(good(), cfg, 132);
  CHECK(t.splitK == 5);  // one slice each
  CHECK(t.kItersPerSplit == 1);
  std::string msg;
  cfg.splitK = 0;
  CHECK(codeOf(good(), cfg, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("splitK") != std::string::npos);
  cfg.splitK = 65;
  CHECK(codeOf(good(), cfg, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("65") != std::string::npos);
}

TEST_CASE("gemm stream-K: the partition covers every iteration once and every CTA agrees on the pieces") {
  // Exhaustive over small grids, including more CTAs than iterations and one k-slice per tile. The walk is the
  // device's: GemmStreamK::begin for the range, gemmStreamKLastSegment for the segments (last first).
  int64_t failures = 0;
  for (uint32_t tiles = 1; tiles <= 9; ++tiles) {
    for (uint32_t kIters = 1; kIters <= 9; ++kIters) {
      for (uint32_t want = 1; want <= 24; ++want) {
        const mk::device::GemmStreamK sk = mk::device::gemmStreamK(tiles, kIters, want);
        const uint32_t iters = tiles * kIters;
        bool ok = sk.ctas == (iters < want ? iters : want) && sk.iters() == iters;
        std::vector<int> covered(iters, 0);
        std::vector<std::set<uint32_t>> ctasOfTile(tiles);
        std::set<uint32_t> slotsUsed;
        uint32_t minLen = iters, maxLen = 0;
        for (uint32_t cta = 0; cta < want + 2; ++cta) {
          const uint32_t b = sk.begin(cta), e = sk.begin(cta + 1);
          if (cta >= sk.ctas) {
            ok = ok && b == e && b == iters;  // CTAs beyond the partition get nothing
            continue;
          }
          ok = ok && b < e && e <= iters;  // never empty
          minLen = std::min(minLen, e - b);
          maxLen = std::max(maxLen, e - b);
          uint32_t segments = 0;
          uint32_t prevTile = tiles;
          for (uint32_t end = e; end > b;) {  // from the end, as the device walks it
            uint32_t tile = 0, kBegin = 0, kEnd = 0;
            mk::device::gemmStreamKLastSegment(sk, b, end, tile, kBegin, kEnd);
            ok = ok && tile < tiles && kBegin < kEnd && kEnd <= kIters && tile * kIters + kEnd == end;
            ok = ok && tile < prevTile && (kBegin == 0 || tile * kIters + kBegin == b);  // one segment per tile
            prevTile = tile;
            for (uint32_t k = kBegin; k < kEnd; ++k) ++covered[tile * kIters + k];
            for (uint32_t i = end - (kEnd - kBegin); i < end; ++i) ok = ok && sk.owner(i) == cta;
            ctasOfTile[tile].insert(cta);
            // A piece of a cut tile publishes a partial: its slot is this CTA's own, and unique.
            const bool whole = kBegin == 0 && kEnd == kIters;
            if (!whole) {
              const uint32_t slot = sk.slot(cta, tile);
              ok = ok && slot / 2 == cta && slotsUsed.insert(slot).second;
            }
            end -= kEnd - kBegin;
            ++segments;
          }
          ok = ok && segments >= 1;
        }
        ok = ok && maxLen - minLen <= 1;  // equal ranges (+-1)
        for (uint32_t i = 0; i < iters; ++i) ok = ok && covered[i] == 1;
        for (uint32_t t = 0; t < tiles; ++t) {
          // pieces / firstCta from the arithmetic alone match the walk, and the pieces are consecutive CTAs.
          const auto& owners = ctasOfTile[t];
          ok = ok && sk.pieces(t) == owners.size() && sk.firstCta(t) == *owners.begin() &&
               *owners.rbegin() - *owners.begin() + 1 == owners.size();
        }
        if (!ok) {
          if (failures < 5) MESSAGE("tiles " << tiles << " kIters " << kIters << " ctas " << want);
          ++failures;
        }
      }
    }
  }
  CHECK(failures == 0);
  // A reference shape (--shapes reference): 128 wide tiles of 128 k-slices on 116 CTAs: 16384 iterations, 141 or
  // 142 per CTA, no tile in more than 2 pieces, and a CTA cuts at most 2 tiles.
  const mk::device::GemmStreamK big = mk::device::gemmStreamK(128, 128, 116);
  CHECK(big.begin(1) - big.begin(0) == 142);
  CHECK(big.begin(116) - big.begin(115) == 141);
  uint32_t maxPieces = 0;
  for (uint32_t t = 0; t < 128; ++t) maxPieces = std::max(maxPieces, big.pieces(t));
  CHECK(maxPieces == 2);
  // More CTAs than iterations: 2 tiles x 1 slice on 5 CTAs -> 2 CTAs run one iteration each, 3 run nothing.
  const mk::device::GemmStreamK few = mk::device::gemmStreamK(2, 1, 5);
  CHECK(few.ctas == 2);
  CHECK(few.pieces(0) == 1);
  CHECK(few.pieces(1) == 1);
  CHECK(few.begin(4) == few.begin(5));
}

TEST_CASE("gemm stream-K: validation reports what runs and refuses bad schedules") {
  mk::GemmProblem p = sized(512, 8192, 8192);
  mk::GemmConfig cfg;
  cfg.ctas = 116;
  mk::GemmTiles t = mk::validateGemm(p, cfg, 132);
  CHECK(t.schedule == mk::GemmSchedule::StreamK);
  CHECK(t.blockN == 256);
  CHECK(t.streamKTiles == 128);
  CHECK(t.streamKCtas == 116);
  CHECK(t.ctas == 116);
  cfg.schedule = mk::GemmSchedule::Tiles;
  t = mk::validateGemm(p, cfg, 132);
  CHECK(t.schedule == mk::GemmSchedule::Tiles);
  CHECK(t.streamKTiles == 0);
  CHECK(t.ctas == 116);
  // Split-K asked for keeps whole-tile units under Auto; with StreamK it is refused, naming both.
  cfg.schedule = mk::GemmSchedule::Auto;
  cfg.splitK = 2;
  t = mk::validateGemm(p, cfg, 132);
  CHECK(t.schedule == mk::GemmSchedule::Tiles);
  CHECK(t.splitK == 2);
  cfg.schedule = mk::GemmSchedule::StreamK;
  std::string msg;
  CHECK(codeOf(p, cfg, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("StreamK") != std::string::npos);
  CHECK(msg.find("splitK") != std::string::npos);
  cfg.splitK = 1;
  cfg.schedule = static_cast<mk::GemmSchedule>(5);
  CHECK(codeOf(p, cfg, &msg) == mk::ErrorCode::InvalidArgument);
  CHECK(msg.find("schedule") != std::string::npos);
  CHECK(msg.find("5") != std::string::npos);
  // Fewer k-iterations than CTAs: 1 tile x 2 slices asked on every SM -> 2 CTAs launched.
  cfg.schedule = mk::GemmSchedule::StreamK;
  cfg.ctas = 0;
  mk::GemmProblem tiny = good();
  tiny.m = 100;
  tiny.n = 100;
  tiny.k = 100;
  t = mk::validateGemm(tiny, cfg, 132);
  CHECK(t.schedule == mk::GemmSchedule::StreamK);
  CHECK(t.streamKTiles == 1);
  CHECK(t.streamKCtas == 2);
  CHECK(t.ctas == 2);
  // With whole waves before the stream-K region every CTA is launched.
  const mk::GemmProblem sq = sized(4096, 4096, 2048);
  cfg.ctas = 116;
  cfg.tileN = 256;
  t = mk::validateGemm(sq, cfg, 132);
  CHECK(t.streamKTiles == 164);
  CHECK(t.count() - t.streamKTiles == 348);
  CHECK(t.ctas == 116);
  CHECK(std::string(mk::toString(mk::GemmSchedule::StreamK)) == "stream-k");
  CHECK(std::string(mk::toString(mk::GemmSchedule::Tiles)) == "tiles");
  CHECK(std::string(mk::toString(mk::GemmSchedule::Auto)) == "auto");
}

namespace {

/// The schedule fields of the GemmParams a GemmPlan builds from `t` (as GemmPlan's constructor sets them).
mk::device::GemmParams scheduleParams(const mk::GemmTiles& t, int64_t k, int64_t groupM) {
  mk::device::GemmParams p{};
  p.tilesM = static_cast<uint32_t>(t.tilesM);
  p.tilesN = static_cast<uint32_t>(t.tilesN);
  p.blockN = static_cast<uint32_t>(t.blockN);
  p.kIters = static_cast<uint32_t>((k + 63) / 64);
  p.groupM = static_cast<uint32_t>(groupM);
  p.splitK = static_cast<uint32_t>(t.splitK);
  p.kItersPerSplit = static_cast<uint32_t>(t.kItersPerSplit);
  p.skTiles = static_cast<uint32_t>(t.streamKTiles);
  p.skCtas = static_cast<uint32_t>(t.streamKCtas);
  return p;
}

/// Replays the standalone kernel's schedule on the CPU: every CTA 0 .. t.ctas - 1 walks gemmWorkCursor (the
/// device's code) exactly as the producer and the consumers do; the CTAs' pieces are then executed in a random
/// interleaving (CTAs progress independently, each in its own order) with the fix-up of streamKFixup: a piece
/// of a cut tile writes its partial to GemmStreamK::slot, counts itself, and the piece that reaches pieces()
/// resets the counter and sums the others. The "value" of k-slice j of a tile is j + 1, so a stored tile must
/// hold kIters (kIters + 1) / 2. Returns the number of problems found (0 = the schedule is right).
int64_t replaySchedule(const mk::GemmTiles& t, int64_t k, int64_t groupM, int launches, uint64_t seed) {
  const mk::device::GemmParams p = scheduleParams(t, k, groupM);
  const mk::device::GemmStreamK sk = mk::device::gemmStreamKOf(p);
  const uint32_t ctas = static_cast<uint32_t>(t.ctas), tiles = p.tilesM * p.tilesN;
  struct Piece {
    uint32_t tile, kBegin, kEnd;
  };
  std::vector<std::vector<Piece>> work(ctas);
  for (uint32_t cta = 0; cta < ctas; ++cta) {
    mk::device::GemmWorkCursor w = mk::device::gemmWorkCursor<false>(p, cta, ctas, mk::device::gemmUnitCount(p), cta);
    uint32_t tile = 0, split = 0, kBegin = 0, kEnd = 0;
    while (w.next<false>(p, tile, split, kBegin, kEnd)) work[cta].push_back({tile, kBegin, kEnd});
  }
  int64_t problems = 0;
  const uint64_t full = static_cast<uint64_t>(p.kIters) * (p.kIters + 1) / 2;
  std::vector<uint32_t> counters(p.skTiles, 0);
  std::vector<uint64_t> slots(2 * static_cast<std::size_t>(sk.ctas), 0);
  uint64_t rng = seed;
  for (int launch = 0; launch < launches; ++launch) {
    std::vector<uint32_t> stored(tiles, 0), nextPiece(ctas, 0);
    std::vector<int> slotWritten(slots.size(), 0);
    uint32_t left = 0;
    for (const auto& w : work) left += static_cast<uint32_t>(w.size());
    while (left > 0) {
      rng = rng * 6364136223846793005ull + 1442695040888963407ull;
      const uint32_t cta = static_cast<uint32_t>((rng >> 33) % ctas);
      if (nextPiece[cta] == work[cta].size()) continue;
      const Piece pc = work[cta][nextPiece[cta]++];
      --left;
      uint64_t acc = 0;
      for (uint32_t j = pc.kBegin; j < pc.kEnd; ++j) acc += j + 1;
      const uint32_t dp = tiles - p.skTiles;
      if (p.skTiles != 0 && pc.tile >= dp && sk.pieces(pc.tile - dp) > 1) {
        const uint32_t st = pc.tile - dp, slot = sk.slot(cta, st);
        if (slot >= slots.size() || slotWritten[slot]++ != 0) ++problems;  // a slot written twice per launch
        if (slot < slots.size()) slots[slot] = acc;
        if (++counters[st] != sk.pieces(st)) continue;
        counters[st] = 0;
        for (uint32_t c = sk.firstCta(st); c < sk.firstCta(st) + sk.pieces(st); ++c) {
          if (c == cta) continue;
          const uint32_t other = sk.slot(c, st);
          if (other >= slots.size() || slotWritten[other] == 0) ++problems;  // summed before it was written
          if (other < slots.size()) acc += slots[other];
        }
      }
      if (acc != full) ++problems;
      ++stored[pc.tile];
    }
    for (uint32_t tl = 0; tl < tiles; ++tl) problems += stored[tl] != 1;  // the hook: once per tile
    for (uint32_t c : counters) problems += c != 0;                       // reset for the next launch
  }
  return problems;
}

}  // namespace

TEST_CASE("gemm stream-K: a CPU replay of the kernel's walk stores every tile once with its whole k-sum") {
  // The reference shapes (--shapes reference) as Auto / StreamK schedule them, and small grids with cuts, whole tiles
  // inside ranges, CTAs without stream-K work and the hybrid's whole waves; 3 launches each (counters must reset).
  struct Shape {
    int64_t m, n, k, ctas, tileN;
  };
  const Shape shapes[] = {{512, 8192, 8192, 116, 0}, {4096, 4096, 2048, 116, 0},  {1024, 8192, 14336, 116, 0},
                          {128, 8192, 8192, 132, 0}, {512, 8192, 1024, 116, 256}, {520, 696, 300, 3, 128},
                          {520, 696, 300, 7, 256},   {520, 696, 300, 13, 128},    {3, 5, 7, 13, 0},
                          {130, 264, 72, 13, 128},   {129, 255, 1000, 7, 256},    {1000, 700, 300, 1, 0}};
  uint64_t seed = 1;
  for (const Shape& s : shapes) {
    const mk::GemmProblem pr = sized(s.m, s.n, s.k);
    for (auto schedule : {mk::GemmSchedule::StreamK, mk::GemmSchedule::Tiles}) {
      mk::GemmConfig cfg;
      cfg.ctas = s.ctas;
      cfg.tileN = s.tileN;
      cfg.schedule = schedule;
      const mk::GemmTiles t = mk::validateGemm(pr, cfg, 132);
      INFO(s.m << " x " << s.n << " x " << s.k << " on " << s.ctas << " CTAs, " << mk::toString(t.schedule)
               << ", width " << t.blockN << ", stream-K tiles " << t.streamKTiles << " of " << t.count());
      REQUIRE(t.schedule == schedule);
      for (int order = 0; order < 3; ++order) CHECK(replaySchedule(t, s.k, cfg.groupM, 3, seed++) == 0);
    }
  }
}
