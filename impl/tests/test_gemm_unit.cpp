// CPU-only tests of the GEMM engine's host validation (mk::validateGemm): no GPU, no allocation; the
// pointers are plain addresses that are never dereferenced.
#include <doctest/doctest.h>

#include <cstdint>
#include <string>

#include "mk/error.hpp"
#include "mk/gemm.hpp"

namespace {

void* addr(uintptr_t a) { return reinterpret_cast<void*>(a); }

mk::GemmProblem good() {
  return {1000, 700, 300, addr(0x10000), 304, addr(0x20000), 704, mk::GemmLayout::RowMajor, addr(0x30000), 704,
          mk::DType::BFloat16};
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
  CHECK(t.tilesM == 8);   // ceil(1000 / 128)
  CHECK(t.tilesN == 3);   // ceil(700 / 256)
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

TEST_CASE("gemm validation: the tile width choice removes badly filled last waves only") {
  // 1024 x 8192: 256 wide tiles on 132 CTAs fill 2 waves (keep 256); on 116 CTAs 3 waves, of which the
  // last is 21 % busy, against 5 waves of half-size tiles (take 128).
  CHECK(mk::gemmChooseTileN(1024, 8192, 132) == 256);
  CHECK(mk::gemmChooseTileN(1024, 8192, 116) == 128);
  CHECK(mk::gemmChooseTileN(128, 8192, 132) == 128);  // 32 wide tiles leave 100 SMs idle
  CHECK(mk::gemmChooseTileN(8192, 8192, 132) == 256);
  CHECK(mk::gemmChooseTileN(16384, 8192, 116) == 256);
  CHECK(mk::gemmChooseTileN(0, 8192, 116) == 256);  // nonsense in, the default out (validation rejects it)
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
  CHECK(cfg.epilogue == mk::GemmEpilogue::TmaStore);  // the default (measured faster on every issue-6 shape)
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
    const mk::GemmTileShape direct = mk::gemmTileShape(width), staged = mk::gemmTileShape(width, mk::GemmEpilogue::TmaStore);
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
