// GPU tests of the Hopper GEMM engine: element-wise against a CPU reference (double accumulation
// of the same bf16 inputs) on small and odd shapes, both B layouts, both output types, fewer CTAs than
// tiles, the per-tile hook, and against cuBLASLt on a large shape.
#include <doctest/doctest.h>

#include <cuda_runtime_api.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cublaslt_loader.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/gemm.hpp"

namespace {

uint16_t toBf16(float f) {
  uint32_t u = 0;
  std::memcpy(&u, &f, 4);
  u += 0x7FFFu + ((u >> 16) & 1u);
  return static_cast<uint16_t>(u >> 16);
}
double fromBf16(uint16_t h) {
  const uint32_t u = static_cast<uint32_t>(h) << 16;
  float f = 0;
  std::memcpy(&f, &u, 4);
  return f;
}

struct Dev {
  void* p = nullptr;
  explicit Dev(std::size_t bytes) { MK_CUDA_CHECK(cudaMalloc(&p, bytes)); }
  ~Dev() { cudaFree(p); }
  Dev(const Dev&) = delete;
  Dev& operator=(const Dev&) = delete;
};

struct Case {
  int64_t m, n, k;
  mk::GemmLayout layout;
  mk::DType out;
  int64_t ctas = 0;
  bool hook = false;
  int64_t tileN = 0;  ///< 0 = chosen per problem
  mk::GemmEpilogue epilogue = mk::GemmEpilogue::Direct;
  int64_t splitK = 1;
  int runs = 1;  ///< launches of the same plan (split-K counters must reset between them)
  mk::GemmSchedule schedule = mk::GemmSchedule::Auto;  ///< Tiles / StreamK: required to be what runs
};

std::string describe(const Case& c) {
  return "m=" + std::to_string(c.m) + " n=" + std::to_string(c.n) + " k=" + std::to_string(c.k) + " B " +
         mk::toString(c.layout) + " out " + (c.out == mk::DType::Float32 ? "f32" : "bf16") +
         " ctas=" + std::to_string(c.ctas) + " tileN=" + std::to_string(c.tileN) + " epilogue " +
         mk::toString(c.epilogue) + " splitK=" + std::to_string(c.splitK) + " runs=" + std::to_string(c.runs) +
         " schedule " + mk::toString(c.schedule);
}

/// Runs one GEMM on random inputs and compares every element of C (and nothing outside it: the padding
/// columns of C must keep their sentinel) with the CPU reference.
void runAndCompare(const Case& c, uint64_t seed) {
  INFO(describe(c));
  const bool rowB = c.layout == mk::GemmLayout::RowMajor;
  const int64_t lda = (c.k + 7) / 8 * 8, ldb = rowB ? (c.n + 7) / 8 * 8 : lda, ldc = (c.n + 7) / 8 * 8 + 8;
  const bool f32 = c.out == mk::DType::Float32;
  const std::size_t es = f32 ? 4 : 2;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> a(static_cast<std::size_t>(c.m * lda)), b(static_cast<std::size_t>((rowB ? c.k : c.n) * ldb));
  for (auto& v : a) v = toBf16(d(rng));
  for (auto& v : b) v = toBf16(d(rng));
  Dev da(a.size() * 2), db(b.size() * 2), dc(static_cast<std::size_t>(c.m * ldc) * es);
  MK_CUDA_CHECK(cudaMemcpy(da.p, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(db.p, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemset(dc.p, 0x7F, static_cast<std::size_t>(c.m * ldc) * es));  // sentinel
  mk::GemmProblem pr{c.m, c.n, c.k, da.p, lda, db.p, ldb, c.layout, dc.p, ldc, c.out};
  mk::GemmConfig cfg;
  cfg.ctas = c.ctas;
  cfg.tileN = c.tileN;
  cfg.epilogue = c.epilogue;
  cfg.splitK = c.splitK;
  cfg.schedule = c.schedule;
  int sms = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  const mk::GemmTiles tiles = mk::validateGemm(pr, cfg, sms);
  Dev counts(tiles.count() * 4);
  if (c.hook) {
    MK_CUDA_CHECK(cudaMemset(counts.p, 0, tiles.count() * 4));
    cfg.hookCounts = static_cast<uint32_t*>(counts.p);
  }
  mk::GemmPlan plan(pr, cfg);
  REQUIRE(plan.tiles().count() == tiles.count());
  // The staged epilogue runs for bf16 output with N a multiple of 8 (whole 16-byte pieces per row), else direct.
  const bool staged = c.epilogue == mk::GemmEpilogue::TmaStore && !f32 && c.n % 8 == 0;
  REQUIRE(plan.tiles().epilogue == (staged ? mk::GemmEpilogue::TmaStore : mk::GemmEpilogue::Direct));
  INFO("ran: schedule " << mk::toString(plan.tiles().schedule) << " width " << plan.tiles().blockN << " stream-K tiles "
                        << plan.tiles().streamKTiles << " of " << plan.tiles().count() << " on "
                        << plan.tiles().streamKCtas << " of " << plan.ctas() << " CTAs");
  if (c.schedule != mk::GemmSchedule::Auto) REQUIRE(plan.tiles().schedule == c.schedule);
  REQUIRE(plan.ctas() == plan.tiles().ctas);
  for (int run = 0; run < c.runs; ++run) plan.run(nullptr);
  const cudaError_t err = cudaDeviceSynchronize();
  INFO(plan.timeoutReport());
  REQUIRE(err == cudaSuccess);

  std::vector<uint8_t> got(static_cast<std::size_t>(c.m * ldc) * es);
  MK_CUDA_CHECK(cudaMemcpy(got.data(), dc.p, got.size(), cudaMemcpyDeviceToHost));
  auto at = [&](int64_t row, int64_t col) -> double {
    const std::size_t i = static_cast<std::size_t>(row * ldc + col);
    if (f32) {
      float f = 0;
      std::memcpy(&f, got.data() + i * 4, 4);
      return f;
    }
    uint16_t h = 0;
    std::memcpy(&h, got.data() + i * 2, 2);
    return fromBf16(h);
  };
  // |ours - exact| <= u_out |exact| + K 2^-24 sum |a b| (fp32 accumulation), with a little slack.
  const double uOut = f32 ? 0.0 : std::ldexp(1.0, -8);
  // The reference runs on every host core (column-strided): the stream-K cases check 512 x 8192 x 1024.
  std::vector<double> ad(a.size());
  for (std::size_t i = 0; i < a.size(); ++i) ad[i] = fromBf16(a[i]);
  struct Bad {
    int64_t row, col;
    double v, exact, tol;
  };
  const auto workers = static_cast<int64_t>(std::max(1u, std::min(16u, std::thread::hardware_concurrency())));
  std::vector<int64_t> wrongOf(static_cast<std::size_t>(workers), 0);
  std::vector<std::vector<Bad>> badOf(static_cast<std::size_t>(workers));
  auto checkColumns = [&](int64_t w) {
    std::vector<double> bcol(static_cast<std::size_t>(c.k));
    for (int64_t col = w; col < c.n; col += workers) {
      for (int64_t kk = 0; kk < c.k; ++kk)
        bcol[static_cast<std::size_t>(kk)] =
            fromBf16(rowB ? b[static_cast<std::size_t>(kk * ldb + col)] : b[static_cast<std::size_t>(col * ldb + kk)]);
      for (int64_t row = 0; row < c.m; ++row) {
        double exact = 0, mag = 0;
        const double* arow = ad.data() + row * lda;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double prod = arow[kk] * bcol[static_cast<std::size_t>(kk)];
          exact += prod;
          mag += std::fabs(prod);
        }
        const double tol = uOut * std::fabs(exact) + static_cast<double>(c.k) * std::ldexp(1.0, -24) * mag * 2 + 1e-30;
        const double v = at(row, col);
        if (!(std::fabs(v - exact) <= tol)) {
          auto& bad = badOf[static_cast<std::size_t>(w)];
          if (bad.size() < 5) bad.push_back({row, col, v, exact, tol});
          ++wrongOf[static_cast<std::size_t>(w)];
        }
      }
    }
  };
  std::vector<std::thread> pool;
  for (int64_t w = 1; w < workers; ++w) pool.emplace_back(checkColumns, w);
  checkColumns(0);
  for (auto& t : pool) t.join();
  int64_t wrong = 0, sentinelHit = 0;
  for (int64_t w = 0; w < workers; ++w) {
    for (const Bad& e : badOf[static_cast<std::size_t>(w)])
      if (wrong < 5)
        MESSAGE("C[" << e.row << "][" << e.col << "] = " << e.v << ", expected " << e.exact << " +- " << e.tol);
    wrong += wrongOf[static_cast<std::size_t>(w)];
  }
  // Columns n..ldc-1 are outside C: the clipped epilogue must never write them.
  for (int64_t row = 0; row < c.m; ++row)
    for (int64_t col = c.n; col < ldc; ++col) {
      const std::size_t i = static_cast<std::size_t>(row * ldc + col) * es;
      if (got[i] != 0x7F || got[i + es - 1] != 0x7F) ++sentinelHit;
    }
  CHECK(wrong == 0);
  CHECK(sentinelHit == 0);
  if (c.hook) {
    std::vector<uint32_t> h(tiles.count());
    MK_CUDA_CHECK(cudaMemcpy(h.data(), counts.p, h.size() * 4, cudaMemcpyDeviceToHost));
    int64_t notOnce = 0;
    for (uint32_t v : h) notOnce += v != static_cast<uint32_t>(c.runs);  // once per tile and run
    CHECK(notOnce == 0);
  }
}

}  // namespace

TEST_CASE("gemm: exact tiles match the CPU reference for every layout output type and tile width") {
  uint64_t seed = 1;
  for (int64_t tileN : {128, 256})
    for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor})
      for (auto out : {mk::DType::BFloat16, mk::DType::Float32})
        runAndCompare({128, 256, 64, layout, out, 0, false, tileN}, seed++);
}

TEST_CASE("gemm: remainders in M N and K are zero-filled on load and clipped on store") {
  uint64_t seed = 100;
  const int64_t shapes[][3] = {{1, 1, 8},       {1, 1, 1},        {3, 5, 7},      {130, 260, 72},
                               {257, 513, 136}, {129, 255, 1000}, {200, 300, 65}, {64, 700, 24}};
  for (int64_t tileN : {128, 256})
    for (const auto& s : shapes)
      for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor})
        for (auto out : {mk::DType::BFloat16, mk::DType::Float32})
          runAndCompare({s[0], s[1], s[2], layout, out, 0, false, tileN}, seed++);
}

TEST_CASE("gemm: fewer CTAs than tiles walk every tile and the hook sees each tile exactly once") {
  uint64_t seed = 200;
  for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor}) {
    runAndCompare({700, 1100, 300, layout, mk::DType::BFloat16, 3, true}, seed++);       // 6 x 5 tiles on 3 CTAs
    runAndCompare({1024, 2048, 512, layout, mk::DType::Float32, 7, true}, seed++);       // 8 x 8 tiles on 7 CTAs
    runAndCompare({333, 777, 128, layout, mk::DType::Float32, 1, true}, seed++);         // one CTA does everything
    runAndCompare({700, 1100, 300, layout, mk::DType::BFloat16, 5, true, 128}, seed++);  // 6 x 9 narrow tiles
  }
}

namespace {

/// A 2112 x 4088 x 2088 GEMM (remainders in all three dimensions) against cuBLASLt on the same inputs:
/// relative Frobenius error <= u_out + 2 K 2^-24 (u_out = 2^-8 for bf16 output, 0 for fp32), NaN fails.
void compareWithCublas(mkbench::CublasLt& lt, mk::GemmLayout layout, mk::DType out, int64_t tileN,
                       mk::GemmEpilogue epilogue) {
  const int64_t m = 2048 + 64, n = 4096 - 8, k = 2048 + 40;
  const bool rowB = layout == mk::GemmLayout::RowMajor;
  const bool f32 = out == mk::DType::Float32;
  const int64_t ldb = rowB ? n : k;
  std::mt19937_64 rng(7);
  std::uniform_real_distribution<float> d(-1.0f, 1.0f);
  std::vector<uint16_t> a(static_cast<std::size_t>(m * k)), b(static_cast<std::size_t>(k * n));
  for (auto& v : a) v = toBf16(d(rng));
  for (auto& v : b) v = toBf16(d(rng));
  const std::size_t es = f32 ? 4 : 2;
  Dev da(a.size() * 2), db(b.size() * 2), c1(static_cast<std::size_t>(m * n) * es),
      c2(static_cast<std::size_t>(m * n) * es);
  MK_CUDA_CHECK(cudaMemcpy(da.p, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(db.p, b.data(), b.size() * 2, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemset(c1.p, 0xFF, static_cast<std::size_t>(m * n) * es));  // NaN until written
  mk::GemmProblem pr{m, n, k, da.p, k, db.p, ldb, layout, c1.p, n, out};
  mk::GemmConfig cfg;
  cfg.tileN = tileN;
  cfg.epilogue = epilogue;
  mk::gemm(pr, cfg, nullptr);
  mk::GemmProblem ref = pr;
  ref.c = c2.p;
  const auto plan = lt.plan(ref);
  lt.run(plan, nullptr);
  REQUIRE(cudaDeviceSynchronize() == cudaSuccess);
  auto read = [&](const Dev& dev) {
    std::vector<double> v(static_cast<std::size_t>(m * n));
    if (f32) {
      std::vector<float> h(v.size());
      MK_CUDA_CHECK(cudaMemcpy(h.data(), dev.p, h.size() * 4, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = h[i];
    } else {
      std::vector<uint16_t> h(v.size());
      MK_CUDA_CHECK(cudaMemcpy(h.data(), dev.p, h.size() * 2, cudaMemcpyDeviceToHost));
      for (std::size_t i = 0; i < v.size(); ++i) v[i] = fromBf16(h[i]);
    }
    return v;
  };
  const std::vector<double> x = read(c1), y = read(c2);
  double diff2 = 0, ref2 = 0;
  bool finite = true;
  for (std::size_t i = 0; i < x.size(); ++i) {
    finite = finite && std::isfinite(x[i]);
    diff2 += (x[i] - y[i]) * (x[i] - y[i]);
    ref2 += y[i] * y[i];
  }
  const double rel = std::sqrt(diff2 / ref2);
  INFO("B " << mk::toString(layout) << " out " << (f32 ? "f32" : "bf16") << " tileN " << tileN << " epilogue "
            << mk::toString(epilogue) << ": relative Frobenius error " << rel);
  CHECK(finite);
  CHECK(rel <= (f32 ? 0.0 : std::ldexp(1.0, -8)) + 2.0 * static_cast<double>(k) * std::ldexp(1.0, -24));
}

}  // namespace

TEST_CASE("gemm: large problem matches cuBLASLt within the relative error bound") {
  mkbench::CublasLt lt;
  for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor})
    compareWithCublas(lt, layout, mk::DType::Float32, layout == mk::GemmLayout::RowMajor ? 256 : 128,
                      mk::GemmEpilogue::Direct);
}

TEST_CASE("gemm tma-store: exact tiles and remainders match the CPU reference and never write outside C") {
  uint64_t seed = 300;
  const int64_t shapes[][3] = {{128, 256, 64},
                               {1, 1, 8},
                               {1, 1, 1},
                               {3, 5, 7},
                               {130, 260, 72},
                               {257, 513, 136},
                               {129, 255, 1000},
                               {200, 300, 65},
                               {64, 700, 24},
                               {65, 1000, 200},
                               // N a multiple of 8 (the staged path runs) with M and K remainders:
                               {3, 8, 7},
                               {257, 512, 136},
                               {129, 264, 1000},
                               {1, 72, 9}};
  for (int64_t tileN : {128, 256})
    for (const auto& s : shapes)
      for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor})
        runAndCompare({s[0], s[1], s[2], layout, mk::DType::BFloat16, 0, false, tileN, mk::GemmEpilogue::TmaStore},
                      seed++);
  // fp32 output asks for the staged epilogue but runs the direct one (runAndCompare checks which ran).
  runAndCompare({130, 260, 72, mk::GemmLayout::RowMajor, mk::DType::Float32, 0, false, 256, mk::GemmEpilogue::TmaStore},
                seed++);
}

TEST_CASE("gemm tma-store: many tiles per CTA reuse the staging buffer and the hook sees each tile exactly once") {
  uint64_t seed = 400;
  for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor}) {
    for (bool hook : {false, true}) {
      runAndCompare({700, 1100, 300, layout, mk::DType::BFloat16, 3, hook, 256, mk::GemmEpilogue::TmaStore}, seed++);
      runAndCompare({1024, 2048, 512, layout, mk::DType::BFloat16, 7, hook, 0, mk::GemmEpilogue::TmaStore}, seed++);
      runAndCompare({333, 777, 128, layout, mk::DType::BFloat16, 1, hook, 256, mk::GemmEpilogue::TmaStore}, seed++);
      runAndCompare({700, 1104, 300, layout, mk::DType::BFloat16, 3, hook, 256, mk::GemmEpilogue::TmaStore}, seed++);
      runAndCompare({700, 1100, 300, layout, mk::DType::BFloat16, 5, hook, 128, mk::GemmEpilogue::TmaStore}, seed++);
    }
  }
}

TEST_CASE("gemm tma-store: large problem matches cuBLASLt within the relative error bound") {
  mkbench::CublasLt lt;
  for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor})
    for (int64_t tileN : {128, 256})
      compareWithCublas(lt, layout, mk::DType::BFloat16, tileN, mk::GemmEpilogue::TmaStore);
}

TEST_CASE("gemm: bad input is rejected before launch") {
  Dev buf(1 << 20);
  char* base = static_cast<char*>(buf.p);
  const mk::GemmProblem good{64, 64, 64, base, 64, base, 64, mk::GemmLayout::RowMajor, base, 64, mk::DType::BFloat16};
  CHECK_NOTHROW(mk::GemmPlan(good, {}));
  auto throwsInvalid = [&](mk::GemmProblem p, mk::GemmConfig cfg) {
    try {
      mk::GemmPlan plan(p, cfg);
    } catch (const mk::Error& e) {
      return e.code() == mk::ErrorCode::InvalidArgument || e.code() == mk::ErrorCode::Unsupported;
    }
    return false;
  };
  mk::GemmProblem p = good;
  p.a = base + 2;  // 2-byte aligned only
  CHECK(throwsInvalid(p, {}));
  p = good;
  p.lda = 72;  // fine (multiple of 8)...
  CHECK_FALSE(throwsInvalid(p, {}));
  p.lda = 68;  // ... not a multiple of 8 elements
  CHECK(throwsInvalid(p, {}));
  p = good;
  p.m = 0;
  CHECK(throwsInvalid(p, {}));
  p = good;
  p.outDType = mk::DType::Float16;
  CHECK(throwsInvalid(p, {}));
  int sms = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  mk::GemmConfig cfg;
  cfg.ctas = sms + 1;
  CHECK(throwsInvalid(good, cfg));
  cfg.ctas = 0;
  cfg.tileN = 64;
  CHECK(throwsInvalid(good, cfg));
  cfg.tileN = 0;
  cfg.epilogue = static_cast<mk::GemmEpilogue>(7);
  CHECK(throwsInvalid(good, cfg));
  cfg.epilogue = mk::GemmEpilogue::TmaStore;
  CHECK_NOTHROW(mk::GemmPlan(good, cfg));
}

TEST_CASE("gemm split-K: the last piece of each tile sums the partials for both epilogues and every remainder") {
  uint64_t seed = 500;
  const int64_t shapes[][3] = {{257, 513, 1000}, {130, 260, 200}, {3, 5, 700}, {128, 256, 512}};
  for (int64_t splitK : {2, 3})
    for (int64_t tileN : {128, 256})
      for (const auto& s : shapes)
        for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor})
          for (auto epi : {mk::GemmEpilogue::Direct, mk::GemmEpilogue::TmaStore})
            runAndCompare({s[0], s[1], s[2], layout, mk::DType::BFloat16, 0, false, tileN, epi, splitK}, seed++);
  // fp32 output, and a split larger than the k-slices (K = 100: 2 slices, 8 asked, 2 run).
  runAndCompare(
      {257, 513, 1000, mk::GemmLayout::RowMajor, mk::DType::Float32, 0, false, 256, mk::GemmEpilogue::Direct, 4},
      seed++);
  runAndCompare(
      {200, 300, 100, mk::GemmLayout::ColMajor, mk::DType::Float32, 0, false, 128, mk::GemmEpilogue::Direct, 8},
      seed++);
}

TEST_CASE("gemm split-K: few CTAs and repeated runs reset the counters and call the hook once per tile") {
  uint64_t seed = 600;
  for (auto epi : {mk::GemmEpilogue::Direct, mk::GemmEpilogue::TmaStore}) {
    // 6 x 5 tiles x 2 pieces on 3 CTAs, three launches of the same plan.
    runAndCompare({700, 1100, 300, mk::GemmLayout::RowMajor, mk::DType::BFloat16, 3, true, 256, epi, 2, 3}, seed++);
    // one CTA runs every piece of every tile (the last piece of a tile is always its own).
    runAndCompare({333, 777, 640, mk::GemmLayout::ColMajor, mk::DType::BFloat16, 1, true, 128, epi, 4, 2}, seed++);
    // more pieces than CTAs per tile: 4 x 8 tiles x 3 pieces on 7 CTAs.
    runAndCompare({512, 1024, 1536, mk::GemmLayout::RowMajor, mk::DType::BFloat16, 7, true, 128, epi, 3, 2}, seed++);
  }
}

TEST_CASE("gemm stream-K: cut tiles are summed by their last piece for every remainder layout width and epilogue") {
  uint64_t seed = 700;
  // M, N, K not multiples of the tile; K of 1, 2, 3 slices and longer; 1 to 13 CTAs (13 > the k-iterations of
  // the small shapes: CTAs without work). The hook (every tile once per launch) on 7 and 13 CTAs, three
  // launches of the same plan (counters reset by the last piece) on 3 and 13.
  // N a multiple of 8 in four of them, so the TMA-store epilogue runs there (it falls back to direct otherwise).
  const int64_t shapes[][3] = {{3, 5, 7},      {130, 264, 72},   {257, 512, 136},
                               {200, 304, 65}, {129, 255, 1000}, {520, 696, 300}};
  struct Out {
    mk::DType dtype;
    mk::GemmEpilogue epilogue;
  };
  const Out outs[] = {{mk::DType::BFloat16, mk::GemmEpilogue::Direct},
                      {mk::DType::BFloat16, mk::GemmEpilogue::TmaStore},
                      {mk::DType::Float32, mk::GemmEpilogue::Direct}};
  for (int64_t ctas : {1, 3, 7, 13})
    for (int64_t tileN : {128, 256})
      for (const auto& s : shapes)
        for (auto layout : {mk::GemmLayout::RowMajor, mk::GemmLayout::ColMajor})
          for (const Out& o : outs) {
            Case c{s[0], s[1], s[2], layout, o.dtype, ctas, ctas >= 7, tileN, o.epilogue};
            c.runs = ctas == 3 || ctas == 13 ? 3 : 1;
            c.schedule = mk::GemmSchedule::StreamK;
            runAndCompare(c, seed++);
          }
}

TEST_CASE("gemm stream-K: the issue-6 skinny shape on 116 CTAs with the hook and repeated launches") {
  int sms = 0;
  MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
  REQUIRE(sms >= 116);
  uint64_t seed = 800;
  // 512 x 8192 x 1024 on 116 CTAs: the model's width (256 narrow tiles of 16 slices, 35-36 iterations per CTA)
  // and the wide tile forced (128 tiles, 17-18 iterations per CTA): every tile in 1-3 pieces.
  for (auto epi : {mk::GemmEpilogue::TmaStore, mk::GemmEpilogue::Direct})
    for (int64_t tileN : {0, 256}) {
      Case c{512, 8192, 1024, mk::GemmLayout::RowMajor, mk::DType::BFloat16, 116, true, tileN, epi};
      c.runs = 3;
      c.schedule = mk::GemmSchedule::StreamK;
      runAndCompare(c, seed++);
    }
  // The column-major B layout, stream-K forced. Auto declines this shape since 8d7091e: 16 k-slices per tile
  // are below its kIters >= 64 rule (short k-loops lost to whole tiles on the device; docs/gemm.md, "Stream-K")
  // and takes stream-K at K = 8192.
  Case c{512, 8192, 1024, mk::GemmLayout::ColMajor, mk::DType::BFloat16, 116, false, 0, mk::GemmEpilogue::TmaStore};
  c.schedule = mk::GemmSchedule::StreamK;
  CHECK(mk::gemmChooseSchedule(512, 8192, 1024, 116, 0, mk::GemmSchedule::Auto).schedule == mk::GemmSchedule::Tiles);
  CHECK(mk::gemmChooseSchedule(512, 8192, 8192, 116, 0, mk::GemmSchedule::Auto).schedule == mk::GemmSchedule::StreamK);
  runAndCompare(c, seed++);
}
