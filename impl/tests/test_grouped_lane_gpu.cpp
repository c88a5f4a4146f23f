// GroupedGemm steps on the resident kernel's compute lane (a MoE layer's expert GEMMs, lowering/grouped_gemm_step.cpp,
// runGroupedGemmStep): every group's rows read from an int32 count array when the step starts, compared element-wise
// with a double-precision reference on fresh random data; rows past a group's count keep their sentinel. One rank.
#include <doctest/doctest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "compute_lane_test_util.hpp"
#include "engine_test_util.hpp"
#include "mk/communicator.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

#if MK_TEST_MIN_GPUS < 2

namespace {

using mk::DType;
using mk::Schedule;
using mk::Step;
using mk::StepKind;
using mkt::computeConfig;
using mkt::roundUp8;
using mkt::Watchdog;

/// G groups of one shape: A (G blocks of m x k rows, lda), B (G blocks, row-major k x n or column-major n x k), C (G
/// blocks of m rows, n or n / 2 with SwiGLU, ldc with 8 padding columns), the rows of group g in counts[g].
struct Grouped {
  uint32_t groups = 1, m = 0, n = 0, k = 0;
  bool colB = false, swiglu = false, counted = true;
  DType out = DType::BFloat16;
  uint32_t lda() const { return roundUp8(k); }
  uint32_t ldb() const { return colB ? roundUp8(k) : roundUp8(n); }
  uint32_t width() const { return swiglu ? n / 2 : n; }
  uint32_t ldc() const { return roundUp8(width()) + 8; }
  uint64_t aBlock() const { return uint64_t{m} * lda(); }
  uint64_t bBlock() const { return uint64_t{colB ? n : k} * ldb(); }
  uint64_t abCount() const { return groups * (aBlock() + bBlock()); }  // A blocks, then B blocks
  uint64_t cCount() const { return uint64_t{groups} * m * ldc(); }
  std::string describe() const {
    return std::to_string(groups) + " x " + std::to_string(m) + "x" + std::to_string(n) + "x" + std::to_string(k) +
           (colB ? " B col" : " B row") + (out == DType::BFloat16 ? " bf16" : " f32") + (swiglu ? " swiglu" : "") +
           (counted ? " counted" : " static");
  }
};

mk::BufferDecl decl(const char* name, DType dt, mk::BufferKind kind, uint64_t count) {
  mk::BufferDecl d;
  d.name = name;
  d.dtype = dt;
  d.kind = kind;
  d.count = {count};
  return d;
}

/// One rank, one compute lane with one GroupedGemm step; buffers ab (Input, bf16), counts (Input, int32, G rows
/// counts: the groups' sourced extents), c (Output).
Schedule groupedSchedule(const Grouped& p) {
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.buffers = {decl("ab", DType::BFloat16, mk::BufferKind::Input, p.abCount()),
               decl("counts", DType::Int32, mk::BufferKind::Input, p.groups),
               decl("c", p.out, mk::BufferKind::Output, p.cCount())};
  for (uint32_t g = 0; g < p.groups; ++g) {
    mk::GemmShape sh;
    sh.m = p.m;
    sh.n = p.n;
    sh.k = p.k;
    sh.lda = p.lda();
    sh.ldb = p.ldb();
    sh.ldc = p.ldc();
    if (p.counted) {
      mk::ExtentDecl e;
      e.name = "rows" + std::to_string(g);
      e.bound = p.m;
      e.expected = p.m / 2.0;
      e.sourceBuffer = 1;
      e.sourceElement = g;
      sh.extent = static_cast<uint32_t>(s.extents.size());
      s.extents.push_back(e);
    }
    s.gemms.push_back(sh);
  }
  Step st;
  st.kind = StepKind::GroupedGemm;
  st.count = p.groups;
  st.aux = 0;
  st.flags = static_cast<uint8_t>((p.colB ? mk::kStepBColMajor : 0) | (p.swiglu ? mk::kStepSwiGLU : 0));
  st.a = mk::bufRef(0, 0, 0);
  st.b = mk::bufRef(0, 0, p.groups * p.aBlock());
  st.dst = mk::bufRef(0, 2, 0);
  mk::Lane lane;
  lane.role = mk::LaneRole::Compute;
  lane.ctas = 1000;
  lane.steps.push_back(st);
  s.lanes = {{lane}};
  s.info.op = "custom";
  s.info.algo = "grouped-gemm";
  mk::fillCostAttributes(s);
  return s;
}

/// Fresh bf16 values in [-1, 1) for every A and B block (padding 0).
std::vector<float> randomAB(const Grouped& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> v(p.abCount(), 0.f);
  std::vector<uint8_t> tmp(2);
  auto bf = [&] {
    mk::storeElement(DType::BFloat16, tmp.data(), 0, uni(rng));
    return mk::loadElement(DType::BFloat16, tmp.data(), 0);
  };
  for (uint64_t row = 0; row < uint64_t{p.groups} * p.m; ++row)
    for (uint32_t kk = 0; kk < p.k; ++kk) v[row * p.lda() + kk] = bf();
  const uint32_t rows = p.colB ? p.n : p.k, cols = p.colB ? p.k : p.n;
  for (uint32_t g = 0; g < p.groups; ++g)
    for (uint32_t i = 0; i < rows; ++i)
      for (uint32_t j = 0; j < cols; ++j) v[p.groups * p.aBlock() + g * p.bBlock() + uint64_t{i} * p.ldb() + j] = bf();
  return v;
}

/// Compare C with the double reference: rows below counts[g] of group g (clamped to [0, m]) against A_g x B_g (or
/// its SwiGLU), with the bound of checkC in test_compute_lane_gpu.cpp (bf16 output: relative 2^-8; fp32 sums: 2 k
/// 2^-24 sum |a b|; SwiGLU: each sum's error carried through silu(g) x u); every other element (rows past the count,
/// padding columns) must keep the 0xFF sentinel (a NaN). Returns the mismatches.
uint64_t checkGrouped(const Grouped& p, const std::vector<float>& ab, const std::vector<int32_t>& counts,
                      const std::vector<uint8_t>& got) {
  const double uOut = p.out == DType::BFloat16 ? std::ldexp(1.0, -8) : std::ldexp(1.0, -22);
  const double gamma = 2.0 * p.k * std::ldexp(1.0, -24);
  auto dot = [&](uint32_t g, uint32_t i, uint32_t j, double* sumAbs) {
    double s = 0, a = 0;
    for (uint32_t kk = 0; kk < p.k; ++kk) {
      const double x = ab[(uint64_t{g} * p.m + i) * p.lda() + kk];
      const uint64_t bAt =
          p.groups * p.aBlock() + g * p.bBlock() + (p.colB ? uint64_t{j} * p.ldb() + kk : uint64_t{kk} * p.ldb() + j);
      s += x * ab[bAt];
      a += std::fabs(x * ab[bAt]);
    }
    *sumAbs = a;
    return s;
  };
  uint64_t bad = 0;
  for (uint32_t g = 0; g < p.groups; ++g) {
    const int64_t rows = std::min<int64_t>(std::max<int32_t>(counts[g], 0), p.m);
    for (uint32_t i = 0; i < p.m; ++i)
      for (uint32_t j = 0; j < p.ldc(); ++j) {
        const uint64_t at = (uint64_t{g} * p.m + i) * p.ldc() + j;
        const float v = mk::loadElement(p.out, got.data(), at);
        bool ok = false;
        double want = 0, tol = 0;
        if (i >= rows || j >= p.width()) {
          ok = std::isnan(v);
        } else if (!p.swiglu) {
          double sa = 0;
          want = dot(g, i, j, &sa);
          tol = uOut * std::fabs(want) + gamma * sa + 1e-30;
          ok = std::isfinite(v) && std::fabs(double(v) - want) <= tol;
        } else {
          double sg = 0, su = 0;
          const double gate = dot(g, i, 2 * j, &sg), up = dot(g, i, 2 * j + 1, &su);
          const double silu = gate / (1.0 + std::exp(-gate));
          want = silu * up;
          tol = uOut * std::fabs(want) + 1.1 * std::fabs(up) * gamma * sg + std::fabs(silu) * gamma * su +
                1e-6 * std::fabs(want) + 1e-30;
          ok = std::isfinite(v) && std::fabs(double(v) - want) <= tol;
        }
        if (!ok) {
          if (bad < 3) {
            CAPTURE(p.describe());
            CAPTURE(g);
            CAPTURE(i);
            CAPTURE(j);
            CAPTURE(v);
            CAPTURE(want);
            CAPTURE(tol);
            CHECK(ok);
          }
          ++bad;
        }
      }
  }
  return bad;
}

/// Run `p` through comms[0] once per entry of `countSets` on the same buffers (one cached program, the counts
/// rewritten between ops) and check each result.
void runGrouped(std::vector<mk::Communicator>& comms, const Grouped& p, const std::vector<std::vector<int32_t>>& sets,
                uint64_t seed) {
  const Schedule s = groupedSchedule(p);
  mk::validate(s);
  const int dev = comms[0].device();
  mkt::Streams streams(comms);
  const std::vector<float> abHost = randomAB(p, seed);
  const auto abBytes = mkt::toBytes(DType::BFloat16, abHost);
  mkt::DeviceBuffer ab(dev, abBytes.size()), counts(dev, p.groups * sizeof(int32_t)),
      c(dev, p.cCount() * mk::dtypeSize(p.out));
  ab.upload(abBytes.data(), abBytes.size());
  for (const std::vector<int32_t>& set : sets) {
    REQUIRE(set.size() == p.groups);
    counts.upload(set.data(), set.size() * sizeof(int32_t));
    c.fill(0xFF);
    Watchdog::progress("execute " + p.describe());
    comms[0].execute(s, {ab.get(), counts.get()}, {c.get()}, streams.s[0]);
    comms[0].synchronize();
    streams.sync(comms);
    std::vector<uint8_t> got(p.cCount() * mk::dtypeSize(p.out));
    c.download(got.data(), got.size());
    // A static step runs every group at its bound whatever the count buffer holds.
    const std::vector<int32_t> rows = p.counted ? set : std::vector<int32_t>(p.groups, static_cast<int32_t>(p.m));
    CHECK(checkGrouped(p, abHost, rows, got) == 0);
  }
}

}  // namespace

TEST_CASE("grouped lane: GroupedGemm steps with runtime rows match a double reference, counts changed per op") {
  Watchdog dog("grouped lane: GroupedGemm steps with runtime rows", 120);
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  std::mt19937_64 rng(39);
  uint64_t seed = 3900;
  // Remainders everywhere: m not a multiple of 128, n of 256, k of 64; counts 0, 1, the bound, past it, negative.
  const uint32_t shapes[][4] = {{4, 200, 264, 72}, {3, 129, 512, 128}, {8, 64, 136, 1024}, {1, 300, 24, 8}};
  for (const auto& sh : shapes)
    for (const bool colB : {false, true})
      for (const DType out : {DType::BFloat16, DType::Float32}) {
        Grouped p;
        p.groups = sh[0];
        p.m = sh[1];
        p.n = sh[2];
        p.k = sh[3];
        p.colB = colB;
        p.out = out;
        std::vector<std::vector<int32_t>> sets(2, std::vector<int32_t>(p.groups));
        std::uniform_int_distribution<int32_t> any(0, static_cast<int32_t>(p.m));
        for (auto& set : sets)
          for (auto& v : set) v = any(rng);
        sets[0][0] = static_cast<int32_t>(p.m);
        if (p.groups > 1) sets[1][1] = 0;
        if (p.groups > 2) sets[1][2] = -5;                              // reads as 0
        if (p.groups > 3) sets[0][3] = static_cast<int32_t>(p.m) + 77;  // clamped to the bound
        CAPTURE(p.describe());
        runGrouped(comms, p, sets, seed++);
      }
}

TEST_CASE("grouped lane: SwiGLU in the epilogue and a step without runtime rows") {
  Watchdog dog("grouped lane: SwiGLU and static rows", 120);
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  for (const DType out : {DType::BFloat16, DType::Float32}) {
    Grouped p;
    p.groups = 5;
    p.m = 160;
    p.n = 520;  // F 260: the last bf16 pair half inside C
    p.k = 200;
    p.swiglu = true;
    p.out = out;
    CAPTURE(p.describe());
    runGrouped(comms, p, {{160, 0, 1, 97, 130}, {3, 160, 129, 0, 64}}, 3950 + static_cast<int>(out));
  }
  Grouped st;
  st.groups = 3;
  st.m = 136;
  st.n = 256;
  st.k = 96;
  st.counted = false;
  CAPTURE(st.describe());
  runGrouped(comms, st, {{0, 0, 0}}, 3960);
}

#endif  // MK_TEST_MIN_GPUS < 2
