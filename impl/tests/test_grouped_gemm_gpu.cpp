// GPU tests of the grouped GEMM engine (mk/grouped_gemm.hpp): fresh random bf16 inputs, odd row counts (0, 1, 127,
// 129, 1000, counts past the bound), several group counts, both row layouts, both B layouts, bf16 and fp32 output,
// with and without the SwiGLU epilogue, both epilogue variants (direct, TMA store with the masked copy of blocks that
// cross a group's end), n and k that are not tile multiples; every element of C compared with a
// double-precision CPU reference of the same bf16 inputs, and every element outside the groups' rows and columns
// checked untouched.
#include <cuda_runtime_api.h>
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "mk/cuda_check.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/grouped_gemm.hpp"

using namespace mk;

namespace {

struct Case {
  std::vector<int32_t> counts;  // per group, as the device reads them (may be negative or past the bound)
  int64_t n, k, maxRows;
  GroupedRowLayout rows;
  GemmLayout layoutB;
  DType out;
  bool swiglu;
  int64_t ctas;  // 0: every SM
};

constexpr uint16_t kSentinelBf16 = 0x7FC1;  // a NaN no store produces (the engine rounds finite values)
constexpr uint32_t kSentinelF32 = 0x7FC00123u;

template <class T>
struct DeviceArray {
  T* ptr = nullptr;
  explicit DeviceArray(size_t count) { MK_CUDA_CHECK(cudaMalloc(reinterpret_cast<void**>(&ptr), count * sizeof(T))); }
  ~DeviceArray() { cudaFree(ptr); }
  DeviceArray(const DeviceArray&) = delete;
  DeviceArray& operator=(const DeviceArray&) = delete;
};

std::vector<uint16_t> randomBf16(size_t count, std::mt19937& rng) {
  std::uniform_real_distribution<float> u(-1.0f, 1.0f);
  std::vector<uint16_t> v(count);
  for (uint16_t& x : v) x = floatToBf16(u(rng));
  return v;
}

/// Rows of group g actually computed: the count clamped to [0, bound] as the kernel does (Strided: maxRows per
/// group; Packed: the rows left before maxRows), and the first row.
void groupRows(const Case& c, std::vector<int64_t>& start, std::vector<int64_t>& rows) {
  const auto groups = c.counts.size();
  start.assign(groups, 0);
  rows.assign(groups, 0);
  int64_t at = 0;
  for (size_t g = 0; g < groups; ++g) {
    const int64_t raw = std::max<int64_t>(c.counts[g], 0);
    if (c.rows == GroupedRowLayout::Strided) {
      start[g] = static_cast<int64_t>(g) * c.maxRows;
      rows[g] = std::min(raw, c.maxRows);
    } else {
      start[g] = std::min(at, c.maxRows);
      rows[g] = std::min(raw, c.maxRows - start[g]);
      at += std::min(raw, c.maxRows);
    }
  }
}

/// Every element of one run's C (`got`) against the double reference, and every element outside the groups' rows
/// and the output width still the sentinel.
void checkOutput(const Case& c, const GroupedGemmProblem& pr, const std::vector<uint16_t>& a,
                 const std::vector<std::vector<uint16_t>>& b, const std::vector<uint8_t>& sentinel,
                 const std::vector<uint8_t>& got) {
  const auto groups = static_cast<int64_t>(c.counts.size());
  const size_t elemBytes = c.out == DType::Float32 ? 4 : 2;
  const int64_t outCols = c.swiglu ? c.n / 2 : c.n;
  const int64_t totalRows = groupedGemmRows(pr);
  auto value = [&](int64_t row, int64_t col) {
    const size_t i = static_cast<size_t>(row * pr.ldc + col);
    if (elemBytes == 2) {
      uint16_t h = 0;
      std::memcpy(&h, &got[i * 2], 2);
      return static_cast<double>(bf16ToFloat(h));
    }
    float f = 0;
    std::memcpy(&f, &got[i * 4], 4);
    return static_cast<double>(f);
  };
  auto untouched = [&](int64_t row, int64_t col) {
    const size_t i = static_cast<size_t>(row * pr.ldc + col);
    return std::memcmp(&got[i * elemBytes], &sentinel[i * elemBytes], elemBytes) == 0;
  };
  auto bAt = [&](int64_t g, int64_t kk, int64_t col) {
    const auto& bg = b[static_cast<size_t>(g)];
    const size_t i = static_cast<size_t>(c.layoutB == GemmLayout::RowMajor ? kk * pr.ldb + col : col * pr.ldb + kk);
    return static_cast<double>(bf16ToFloat(bg[i]));
  };
  // Tolerance: the reference is exact to double rounding; the engine accumulates k products in fp32 (error at most
  // k x 2^-24 x sum |a b| for any summation order, the classic gamma_k bound, taken loosely as k x 2^-23) and rounds
  // once to the output type (half an ulp: 2^-9 relative for bf16, 2^-24 for fp32). SwiGLU propagates the two fp32
  // errors eg, eu through silu(g) u: |silu'(g)| <= 1.1 so |d| <= 1.1 |u| eg + |silu(g)| eu (+ eg eu), plus expf's
  // few ulps (2^-21 relative) before the final rounding.
  const double roundRel = elemBytes == 2 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -23);
  const double accRel = static_cast<double>(c.k) * std::ldexp(1.0, -23);
  std::vector<int64_t> start, rows;
  groupRows(c, start, rows);
  std::vector<char> rowOwned(static_cast<size_t>(totalRows), 0);
  uint64_t bad = 0, checked = 0;
  for (int64_t g = 0; g < groups; ++g) {
    for (int64_t r = start[g]; r < start[g] + rows[g]; ++r) {
      rowOwned[static_cast<size_t>(r)] = 1;
      const uint16_t* aRow = &a[static_cast<size_t>(r * pr.lda)];
      std::vector<double> acc(static_cast<size_t>(c.n)), mag(static_cast<size_t>(c.n));
      for (int64_t col = 0; col < c.n; ++col) {
        double s = 0, m = 0;
        for (int64_t kk = 0; kk < c.k; ++kk) {
          const double prod = static_cast<double>(bf16ToFloat(aRow[kk])) * bAt(g, kk, col);
          s += prod;
          m += std::fabs(prod);
        }
        acc[static_cast<size_t>(col)] = s;
        mag[static_cast<size_t>(col)] = m;
      }
      for (int64_t col = 0; col < outCols; ++col) {
        double want = 0, tol = 0;
        if (c.swiglu) {
          const double gate = acc[static_cast<size_t>(2 * col)], up = acc[static_cast<size_t>(2 * col + 1)];
          const double eg = accRel * mag[static_cast<size_t>(2 * col)],
                       eu = accRel * mag[static_cast<size_t>(2 * col + 1)];
          const double silu = gate / (1.0 + std::exp(-gate));
          want = silu * up;
          tol = 1.1 * std::fabs(up) * eg + std::fabs(silu) * eu + eg * eu + std::ldexp(std::fabs(want), -21) +
                roundRel * std::fabs(want);
        } else {
          want = acc[static_cast<size_t>(col)];
          tol = accRel * mag[static_cast<size_t>(col)] + roundRel * std::fabs(want);
        }
        const double have = value(r, col);
        ++checked;
        if (!(std::fabs(have - want) <= tol + 1e-30)) {
          if (bad < 8)
            MESSAGE("group " << g << " row " << r << " col " << col << ": got " << have << ", want " << want << " (tol "
                             << tol << ")");
          ++bad;
        }
      }
      for (int64_t col = outCols; col < pr.ldc; ++col)
        if (!untouched(r, col)) {
          if (bad < 8) MESSAGE("row " << r << " col " << col << " past the output width was written");
          ++bad;
        }
    }
  }
  // Rows no group owns (past a group's count, or past the packed sum) are never written.
  for (int64_t r = 0; r < totalRows; ++r) {
    if (rowOwned[static_cast<size_t>(r)]) continue;
    for (int64_t col = 0; col < pr.ldc; ++col)
      if (!untouched(r, col)) {
        if (bad < 8) MESSAGE("row " << r << " (no group's) col " << col << " was written");
        ++bad;
      }
  }
  CHECK_MESSAGE(bad == 0, bad << " of " << checked << " elements wrong or stray writes");
}

void runCase(const Case& c, uint32_t seed) {
  INFO("seed " << seed << ", groups " << c.counts.size() << ", n " << c.n << ", k " << c.k << ", maxRows " << c.maxRows
               << ", " << toString(c.rows) << ", B " << toString(c.layoutB) << ", out " << toString(c.out)
               << ", swiglu " << c.swiglu << ", ctas " << c.ctas);
  std::mt19937 rng(seed);
  const auto groups = static_cast<int64_t>(c.counts.size());
  GroupedGemmProblem pr;
  pr.groups = groups;
  pr.n = c.n;
  pr.k = c.k;
  pr.rowLayout = c.rows;
  pr.maxRows = c.maxRows;
  pr.layoutB = c.layoutB;
  pr.outDType = c.out;
  pr.swiglu = c.swiglu;
  pr.lda = (c.k + 7) / 8 * 8 + 8;  // padded rows: the engine must not read past k
  pr.ldb = c.layoutB == GemmLayout::RowMajor ? (c.n + 7) / 8 * 8 + 8 : (c.k + 7) / 8 * 8;
  const int64_t outCols = c.swiglu ? c.n / 2 : c.n;
  pr.ldc = (outCols + 7) / 8 * 8 + 8;  // columns past n (or n / 2) must stay untouched
  const int64_t totalRows = groupedGemmRows(pr);
  const int64_t bRowsStored = c.layoutB == GemmLayout::RowMajor ? c.k : c.n;

  const std::vector<uint16_t> a = randomBf16(static_cast<size_t>(totalRows * pr.lda), rng);
  std::vector<std::vector<uint16_t>> b(static_cast<size_t>(groups));
  for (auto& bg : b) bg = randomBf16(static_cast<size_t>(bRowsStored * pr.ldb), rng);
  const size_t elemBytes = c.out == DType::Float32 ? 4 : 2;
  const size_t cCount = static_cast<size_t>(totalRows * pr.ldc);

  DeviceArray<uint16_t> dA(a.size());
  std::vector<DeviceArray<uint16_t>*> dB;
  std::vector<const void*> bPtrs;
  for (auto& bg : b) {
    dB.push_back(new DeviceArray<uint16_t>(bg.size()));
    MK_CUDA_CHECK(cudaMemcpy(dB.back()->ptr, bg.data(), bg.size() * 2, cudaMemcpyHostToDevice));
    bPtrs.push_back(dB.back()->ptr);
  }
  DeviceArray<uint8_t> dC(cCount * elemBytes);
  DeviceArray<int32_t> dCounts(static_cast<size_t>(groups));
  MK_CUDA_CHECK(cudaMemcpy(dA.ptr, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(dCounts.ptr, c.counts.data(), c.counts.size() * 4, cudaMemcpyHostToDevice));
  std::vector<uint8_t> sentinel(cCount * elemBytes);
  for (size_t i = 0; i < cCount; ++i) {
    if (elemBytes == 2)
      std::memcpy(&sentinel[i * 2], &kSentinelBf16, 2);
    else
      std::memcpy(&sentinel[i * 4], &kSentinelF32, 4);
  }
  pr.rowCounts = dCounts.ptr;
  pr.a = dA.ptr;
  pr.b = bPtrs.data();
  pr.c = dC.ptr;
  // Both epilogues on the same inputs where TmaStore applies (bf16, no swiglu, n % 8 == 0); Direct alone elsewhere.
  std::vector<std::vector<uint8_t>> outputs;
  std::vector<GemmEpilogue> ran;
  std::vector<GemmEpilogue> variants{GemmEpilogue::Direct};
  GroupedGemmConfig tmaStore;
  tmaStore.epilogue = GemmEpilogue::TmaStore;
  if (groupedGemmEpilogue(pr, tmaStore) == GemmEpilogue::TmaStore) variants.push_back(GemmEpilogue::TmaStore);
  for (GemmEpilogue epi : variants) {
    GroupedGemmConfig cfg;
    cfg.ctas = c.ctas;
    cfg.epilogue = epi;
    REQUIRE(groupedGemmProblem(pr, cfg).empty());
    MK_CUDA_CHECK(cudaMemcpy(dC.ptr, sentinel.data(), sentinel.size(), cudaMemcpyHostToDevice));
    GroupedGemmPlan plan(pr, cfg);
    CHECK((plan.epilogue() == groupedGemmEpilogue(pr, cfg)));
    plan.run(nullptr);
    MK_CUDA_CHECK(cudaDeviceSynchronize());
    outputs.emplace_back(cCount * elemBytes);
    MK_CUDA_CHECK(cudaMemcpy(outputs.back().data(), dC.ptr, outputs.back().size(), cudaMemcpyDeviceToHost));
    ran.push_back(plan.epilogue());
  }
  for (auto* d : dB) delete d;
  for (size_t run = 0; run < outputs.size(); ++run) {
    INFO("epilogue " << toString(ran[run]));
    checkOutput(c, pr, a, b, sentinel, outputs[run]);
  }
}

uint32_t freshSeed() { return std::random_device{}(); }

}  // namespace

TEST_CASE("grouped gemm: odd row counts 0, 1, 127, 129, strided rows, bf16, row-major B") {
  runCase({{0, 1, 127, 129}, 256, 128, 200, GroupedRowLayout::Strided, GemmLayout::RowMajor, DType::BFloat16, false, 0},
          freshSeed());
  // n not a multiple of 8: the direct epilogue whatever is asked (a TMA store would write past n).
  runCase({{0, 1, 127, 129}, 250, 128, 200, GroupedRowLayout::Strided, GemmLayout::RowMajor, DType::BFloat16, false, 0},
          freshSeed());
}

TEST_CASE("grouped gemm: SwiGLU epilogue, odd row counts, n and k not tile multiples") {
  runCase(
      {{129, 0, 1, 127, 255}, 520, 200, 260, GroupedRowLayout::Strided, GemmLayout::RowMajor, DType::BFloat16, true, 0},
      freshSeed());
  // n / 2 odd: the last column pair half inside C.
  runCase({{3, 130}, 262, 72, 140, GroupedRowLayout::Strided, GemmLayout::ColMajor, DType::BFloat16, true, 0},
          freshSeed());
}

TEST_CASE("grouped gemm: packed rows (in-kernel prefix sums), column-major B, a group of 1000 rows") {
  runCase(
      {{1000, 0, 129, 1, 0}, 384, 256, 1200, GroupedRowLayout::Packed, GemmLayout::ColMajor, DType::BFloat16, false, 0},
      freshSeed());
  runCase(
      {{1000, 0, 129, 1, 0}, 384, 256, 1200, GroupedRowLayout::Packed, GemmLayout::ColMajor, DType::BFloat16, true, 0},
      freshSeed());
}

TEST_CASE("grouped gemm: fp32 output, with and without SwiGLU") {
  runCase({{17, 300, 0}, 264, 136, 300, GroupedRowLayout::Strided, GemmLayout::RowMajor, DType::Float32, false, 0},
          freshSeed());
  runCase({{17, 300, 0}, 264, 136, 300, GroupedRowLayout::Packed, GemmLayout::ColMajor, DType::Float32, true, 0},
          freshSeed());
}

TEST_CASE("grouped gemm: counts past the bound are clamped, negative counts read as 0, nothing else is written") {
  // Strided: 300 > maxRows 256 computes 256 rows; -5 computes none.
  runCase({{300, -5, 64}, 256, 64, 256, GroupedRowLayout::Strided, GemmLayout::RowMajor, DType::BFloat16, true, 0},
          freshSeed());
  // Packed: the sum 700 > maxRows 500: the second group gets the 200 rows left, the third none.
  runCase({{300, 400, 100}, 256, 64, 500, GroupedRowLayout::Packed, GemmLayout::RowMajor, DType::BFloat16, false, 0},
          freshSeed());
}

TEST_CASE("grouped gemm: random groups and counts, few CTAs (each walks many tiles of many groups)") {
  std::mt19937 rng(freshSeed());
  for (int trial = 0; trial < 4; ++trial) {
    std::uniform_int_distribution<int> groupsDist(1, 40), countDist(0, 300), ctasDist(1, 7);
    std::vector<int32_t> counts(static_cast<size_t>(groupsDist(rng)));
    int64_t maxCount = 1, sum = 0;
    for (int32_t& v : counts) {
      v = rng() % 4 == 0 ? 0 : countDist(rng);
      maxCount = std::max<int64_t>(maxCount, v);
      sum += v;
    }
    const bool packed = trial % 2 == 1;
    const bool swiglu = trial >= 2;
    const int64_t n = 256 + 8 * (rng() % 50);  // a multiple of 8: the TMA-store epilogue runs for the plain trials
    const int64_t k = 64 + rng() % 300;
    runCase({counts, n, k, packed ? std::max<int64_t>(sum, 1) : maxCount,
             packed ? GroupedRowLayout::Packed : GroupedRowLayout::Strided,
             trial % 3 == 0 ? GemmLayout::ColMajor : GemmLayout::RowMajor, DType::BFloat16, swiglu, ctasDist(rng)},
            static_cast<uint32_t>(rng()));
  }
}

TEST_CASE("grouped gemm: one plan, new counts each run (the runtime extent is read at every launch)") {
  const int64_t groups = 6, n = 256, k = 96, maxRows = 150;
  std::mt19937 rng(freshSeed());
  const std::vector<uint16_t> a = randomBf16(static_cast<size_t>(groups * maxRows * k), rng);
  const std::vector<uint16_t> w = randomBf16(static_cast<size_t>(groups * k * n), rng);
  DeviceArray<uint16_t> dA(a.size()), dW(w.size());
  DeviceArray<uint16_t> dC(static_cast<size_t>(groups * maxRows * n));
  DeviceArray<int32_t> dCounts(static_cast<size_t>(groups));
  MK_CUDA_CHECK(cudaMemcpy(dA.ptr, a.data(), a.size() * 2, cudaMemcpyHostToDevice));
  MK_CUDA_CHECK(cudaMemcpy(dW.ptr, w.data(), w.size() * 2, cudaMemcpyHostToDevice));
  std::vector<const void*> bPtrs;
  for (int64_t g = 0; g < groups; ++g) bPtrs.push_back(dW.ptr + g * k * n);  // one stacked tensor, a pointer per group
  GroupedGemmProblem pr;
  pr.groups = groups;
  pr.n = n;
  pr.k = k;
  pr.maxRows = maxRows;
  pr.rowCounts = dCounts.ptr;
  pr.a = dA.ptr;
  pr.lda = k;
  pr.b = bPtrs.data();
  pr.ldb = n;
  pr.c = dC.ptr;
  pr.ldc = n;
  GroupedGemmPlan plan(pr);
  for (int run = 0; run < 3; ++run) {
    std::vector<int32_t> counts(static_cast<size_t>(groups));
    for (int32_t& v : counts) v = static_cast<int32_t>(rng() % (maxRows + 1));
    MK_CUDA_CHECK(cudaMemcpy(dCounts.ptr, counts.data(), counts.size() * 4, cudaMemcpyHostToDevice));
    MK_CUDA_CHECK(cudaMemset(dC.ptr, 0xFF, static_cast<size_t>(groups * maxRows * n) * 2));
    plan.run(nullptr);
    MK_CUDA_CHECK(cudaDeviceSynchronize());
    std::vector<uint16_t> got(static_cast<size_t>(groups * maxRows * n));
    MK_CUDA_CHECK(cudaMemcpy(got.data(), dC.ptr, got.size() * 2, cudaMemcpyDeviceToHost));
    uint64_t bad = 0;
    for (int64_t g = 0; g < groups; ++g)
      for (int64_t r = 0; r < maxRows; ++r)
        for (int64_t col = 0; col < n; ++col) {
          const uint16_t have = got[static_cast<size_t>((g * maxRows + r) * n + col)];
          if (r >= counts[static_cast<size_t>(g)]) {
            bad += have != 0xFFFF;  // past the count: untouched
            continue;
          }
          double want = 0, mag = 0;
          for (int64_t kk = 0; kk < k; ++kk) {
            const double prod = static_cast<double>(bf16ToFloat(a[static_cast<size_t>((g * maxRows + r) * k + kk)])) *
                                bf16ToFloat(w[static_cast<size_t>((g * k + kk) * n + col)]);
            want += prod;
            mag += std::fabs(prod);
          }
          // As runCase: fp32 accumulation (k x 2^-23 x sum |ab|) and one bf16 rounding (2^-8 relative, loose).
          const double tol = static_cast<double>(k) * std::ldexp(mag, -23) + std::ldexp(std::fabs(want), -8);
          bad += !(std::fabs(static_cast<double>(bf16ToFloat(have)) - want) <= tol + 1e-30);
        }
    CHECK_MESSAGE(bad == 0, "run " << run << ": " << bad << " elements wrong");
  }
}
