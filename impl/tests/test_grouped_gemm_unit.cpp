// CPU-side tests of the grouped GEMM engine's host API (mk/grouped_gemm.hpp): what it refuses before any device work,
// each reason naming the argument. No GPU needed (the refusals come before any CUDA call; the pointers are never
// dereferenced on the host).
#include <doctest/doctest.h>

#include <cstdint>
#include <random>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "mk/device/grouped_gemm_device.hpp"
#include "mk/error.hpp"
#include "mk/grouped_gemm.hpp"

using namespace mk;

namespace {

alignas(16) uint16_t gDummy[64];
alignas(16) int32_t gCounts[kGroupedGemmMaxGroups + 1];

/// A problem the engine accepts: 3 groups, the FFN's first GEMM at a small size.
struct Good {
  std::vector<const void*> b{gDummy, gDummy, gDummy};
  GroupedGemmProblem pr;
  Good() {
    pr.groups = 3;
    pr.n = 512;
    pr.k = 256;
    pr.maxRows = 100;
    pr.rowCounts = gCounts;
    pr.a = gDummy;
    pr.lda = 256;
    pr.b = b.data();
    pr.ldb = 512;
    pr.c = gDummy;
    pr.ldc = 512;
  }
};

/// groupedGemmProblem names `needle`, and GroupedGemmPlan throws Error(InvalidArgument) saying so.
void refused(const GroupedGemmProblem& pr, const std::string& needle, const GroupedGemmConfig& cfg = {}) {
  const std::string why = groupedGemmProblem(pr, cfg);
  CHECK_MESSAGE(why.find(needle) != std::string::npos, "reason: '" << why << "', expected '" << needle << "'");
  try {
    GroupedGemmPlan plan(pr, cfg);
    FAIL("accepted: " << needle);
  } catch (const Error& e) {
    CHECK((e.code() == ErrorCode::InvalidArgument));
    CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
    CHECK(std::string(e.what()).find("groupedGemm: ") != std::string::npos);  // what() is "<code>: <message>"
  }
}

}  // namespace

TEST_CASE("grouped gemm: a well-formed problem passes the check, both layouts, with and without SwiGLU") {
  Good g;
  CHECK(groupedGemmProblem(g.pr).empty());
  g.pr.swiglu = true;
  g.pr.ldc = 256;  // n / 2
  CHECK(groupedGemmProblem(g.pr).empty());
  g.pr.rowLayout = GroupedRowLayout::Packed;
  g.pr.layoutB = GemmLayout::ColMajor;
  g.pr.ldb = 256;  // >= k
  g.pr.outDType = DType::Float32;
  CHECK(groupedGemmProblem(g.pr).empty());
  CHECK(groupedGemmRows(g.pr) == 100);
  g.pr.rowLayout = GroupedRowLayout::Strided;
  CHECK(groupedGemmRows(g.pr) == 300);
}

TEST_CASE("grouped gemm: refuses bad group counts and sizes, naming them") {
  for (int64_t groups : {int64_t{0}, int64_t{-1}, kGroupedGemmMaxGroups + 1}) {
    Good g;
    g.pr.groups = groups;
    refused(g.pr, "groups must be in [1, 1024]");
  }
  {
    Good g;
    g.pr.n = 0;
    refused(g.pr, "n must be");
  }
  {
    Good g;
    g.pr.k = -3;
    refused(g.pr, "k must be");
  }
  {
    Good g;
    g.pr.maxRows = 0;
    refused(g.pr, "maxRows must be");
  }
  {
    Good g;  // 3 x 2^30 rows do not fit the 32-bit row index
    g.pr.maxRows = int64_t{1} << 30;
    refused(g.pr, "groups x maxRows");
  }
}

TEST_CASE("grouped gemm: SwiGLU needs an even n and ldc >= n / 2") {
  Good g;
  g.pr.swiglu = true;
  g.pr.n = 511;
  g.pr.ldb = 512;
  refused(g.pr, "swiglu needs an even n");
  Good h;
  h.pr.swiglu = true;
  h.pr.ldc = 248;  // < n / 2 = 256
  refused(h.pr, "ldc must be >= n / 2 (swiglu)");
}

TEST_CASE("grouped gemm: refuses null and misaligned pointers, naming them") {
  {
    Good g;
    g.pr.rowCounts = nullptr;
    refused(g.pr, "rowCounts is null");
  }
  {
    Good g;
    g.pr.a = nullptr;
    refused(g.pr, "a is null");
  }
  {
    Good g;
    g.pr.a = reinterpret_cast<const uint8_t*>(gDummy) + 2;
    refused(g.pr, "a must be 16-byte aligned");
  }
  {
    Good g;
    g.pr.c = nullptr;
    refused(g.pr, "c is null");
  }
  {
    Good g;
    g.pr.b = nullptr;
    refused(g.pr, "b is null");
  }
  {
    Good g;
    g.b[2] = nullptr;
    refused(g.pr, "b[2] is null");
  }
  {
    Good g;
    g.b[1] = reinterpret_cast<const uint8_t*>(gDummy) + 8;
    refused(g.pr, "b[1] must be 16-byte aligned");
  }
}

TEST_CASE("grouped gemm: refuses leading dimensions, dtypes, layouts and configs it cannot run") {
  {
    Good g;
    g.pr.lda = 200;  // < k
    refused(g.pr, "lda must be >= k");
  }
  {
    Good g;
    g.pr.lda = 260;  // not a multiple of 8
    refused(g.pr, "lda must be a multiple of 8");
  }
  {
    Good g;
    g.pr.ldb = 500;  // row-major B: >= n
    refused(g.pr, "ldb must be >= n");
  }
  {
    Good g;
    g.pr.layoutB = GemmLayout::ColMajor;
    g.pr.ldb = 128;  // column-major B: >= k
    refused(g.pr, "ldb must be >= k");
  }
  {
    Good g;
    g.pr.ldc = 516;
    refused(g.pr, "ldc must be a multiple of 8");
  }
  {
    Good g;
    g.pr.outDType = DType::Float16;
    refused(g.pr, "outDType must be bfloat16 or float32");
  }
  {
    Good g;
    g.pr.layoutB = static_cast<GemmLayout>(7);
    refused(g.pr, "layoutB must be");
  }
  {
    Good g;
    g.pr.rowLayout = static_cast<GroupedRowLayout>(5);
    refused(g.pr, "rowLayout must be");
  }
  {
    Good g;
    GroupedGemmConfig cfg;
    cfg.ctas = -1;
    refused(g.pr, "ctas must be >= 0", cfg);
  }
  {
    Good g;
    GroupedGemmConfig cfg;
    cfg.groupM = 0;
    refused(g.pr, "groupM must be in [1, 65535]", cfg);
  }
  {
    Good g;
    GroupedGemmConfig cfg;
    cfg.epilogue = static_cast<GemmEpilogue>(9);
    refused(g.pr, "epilogue must be Direct or TmaStore", cfg);
  }
}

TEST_CASE("grouped gemm: the TMA-store epilogue runs for bf16 without SwiGLU, n % 8 == 0, <= 160 groups") {
  auto runs = [](const GroupedGemmProblem& pr, GemmEpilogue asked) {
    GroupedGemmConfig cfg;
    cfg.epilogue = asked;
    return groupedGemmEpilogue(pr, cfg);
  };
  Good g;
  CHECK((runs(g.pr, GemmEpilogue::TmaStore) == GemmEpilogue::TmaStore));
  CHECK((runs(g.pr, GemmEpilogue::Direct) == GemmEpilogue::Direct));
  GroupedGemmProblem swiglu = g.pr;
  swiglu.swiglu = true;
  CHECK((runs(swiglu, GemmEpilogue::TmaStore) == GemmEpilogue::Direct));
  GroupedGemmProblem fp32 = g.pr;
  fp32.outDType = DType::Float32;
  CHECK((runs(fp32, GemmEpilogue::TmaStore) == GemmEpilogue::Direct));
  GroupedGemmProblem oddN = g.pr;
  oddN.n = 500;
  CHECK((runs(oddN, GemmEpilogue::TmaStore) == GemmEpilogue::Direct));
  GroupedGemmProblem many = g.pr;
  many.groups = kGroupedGemmMaxGroupsTmaStore;
  CHECK((runs(many, GemmEpilogue::TmaStore) == GemmEpilogue::TmaStore));
  many.groups = kGroupedGemmMaxGroupsTmaStore + 1;
  CHECK((runs(many, GemmEpilogue::TmaStore) == GemmEpilogue::Direct));
}

TEST_CASE("grouped gemm: the tile walk visits every tile of every group once, none of an empty group") {
  // The kernel's table for given row counts (what buildTable computes, sequentially) and its walk (groupedGemmLocate,
  // the same code the producer and the consumers run), for random counts with many zeros, random groupM and widths.
  std::mt19937 rng(std::random_device{}());
  auto below = [&](uint32_t n) { return static_cast<uint32_t>(rng() % n); };
  for (int trial = 0; trial < 200; ++trial) {
    const uint32_t groups = 1 + below(70);
    std::vector<uint32_t> tileStart(groups + 1), rowStart(groups), rowCount(groups);
    device::GroupedGemmParams p{};
    p.groups = groups;
    p.gemm.tilesN = 1 + below(9);
    p.gemm.groupM = 1 + below(10);
    uint32_t tiles = 0, rows = 0;
    for (uint32_t g = 0; g < groups; ++g) {
      rowCount[g] = below(3) == 0 ? 0 : below(1100);
      rowStart[g] = rows;
      rows += rowCount[g];
      tileStart[g] = tiles;
      tiles += (rowCount[g] + 127) / 128 * p.gemm.tilesN;
    }
    tileStart[groups] = tiles;
    const device::GroupedGemmTable table{tileStart.data(), rowStart.data(), rowCount.data()};
    std::set<std::tuple<uint32_t, uint32_t, uint32_t>> seen;
    bool ok = true;
    for (uint32_t t = 0; t < tiles; ++t) {
      uint32_t g = 0, tm = 0, tn = 0;
      device::groupedGemmLocate(p, table, t, g, tm, tn);
      ok = ok && g < groups && tileStart[g] <= t && t < tileStart[g + 1] && tm * 128 < rowCount[g] &&
           tn < p.gemm.tilesN && seen.insert({g, tm, tn}).second;
    }
    CHECK_MESSAGE(
        ok, "trial " << trial << ": groups " << groups << ", tilesN " << p.gemm.tilesN << ", groupM " << p.gemm.groupM);
    CHECK(seen.size() == tiles);
  }
}
