// Compute lanes (CommConfig::computeLanes): Gemm steps inside the resident kernel, alone and mixed with
// Put / Signal / Wait / Copy, compared element-wise with a double-precision reference on fresh random data;
// the collectives through a compute-capable communicator. Built twice: the 1-GPU cases (label gpu) and,
// with MK_TEST_MIN_GPUS=2, the 2-GPU cases (label multigpu).
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "compute_lane_test_util.hpp"
#include "engine_test_util.hpp"
#include "mk/communicator.hpp"
#include "mk/error.hpp"
#include "mk/exec/numeric.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

namespace {

using mk::BufRef;
using mk::DType;
using mk::Schedule;
using mk::Step;
using mk::StepKind;
using mkt::computeConfig;
using mkt::roundUp8;
using mkt::Watchdog;

BufRef ref(uint32_t rank, uint16_t buffer, uint64_t offset) { return mk::bufRef(rank, buffer, offset); }

/// One GEMM problem of the tests: C (m x n, ldc) [+]= A (m x k, lda) x B (row: k x n, ldb; col: n x k).
struct Problem {
  uint32_t m = 0, n = 0, k = 0;
  bool colB = false;
  DType out = DType::BFloat16;
  bool accumulate = false;
  uint32_t lda() const { return roundUp8(k); }
  uint32_t ldb() const { return colB ? roundUp8(k) : roundUp8(n); }
  uint32_t ldc() const { return roundUp8(n) + 8; }  // 8+ padding columns that must keep their sentinel
  uint64_t aCount() const { return uint64_t{m} * lda(); }
  uint64_t bCount() const { return colB ? uint64_t{n} * ldb() : uint64_t{k} * ldb(); }
  uint64_t abCount() const { return aCount() + bCount(); }  // A then B in one bf16 Input buffer
  uint64_t cCount() const { return uint64_t{m} * ldc(); }
  mk::GemmShape shape() const {
    mk::GemmShape g;
    g.m = m;
    g.n = n;
    g.k = k;
    g.lda = lda();
    g.ldb = ldb();
    g.ldc = ldc();
    return g;
  }
};

mk::BufferDecl decl(const char* name, DType dt, mk::BufferKind kind, uint64_t count, uint32_t nRanks) {
  mk::BufferDecl d;
  d.name = name;
  d.dtype = dt;
  d.kind = kind;
  d.count.assign(nRanks, count);
  return d;
}

/// Gemm step of problem `p`: A then B at element `abOffset` of buffer abBuf, C at element `cOffset` of cBuf.
Step gemmStep(const Problem& p, uint32_t rank, uint16_t abBuf, uint16_t cBuf, uint32_t aux, uint64_t abOffset = 0,
              uint64_t cOffset = 0) {
  Step st;
  st.kind = StepKind::Gemm;
  st.aux = aux;
  st.flags = static_cast<uint8_t>((p.colB ? mk::kStepBColMajor : 0) | (p.accumulate ? mk::kStepAccumulate : 0));
  st.dst = ref(rank, cBuf, cOffset);
  st.a = ref(rank, abBuf, abOffset);
  st.b = ref(rank, abBuf, abOffset + p.aCount());
  return st;
}

/// One rank, one compute lane with one Gemm step: buffers ab (Input) and c (Output).
[[maybe_unused]] Schedule singleGemm(const Problem& p) {
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.buffers = {decl("ab", DType::BFloat16, mk::BufferKind::Input, p.abCount(), 1),
               decl("c", p.out, mk::BufferKind::Output, p.cCount(), 1)};
  s.gemms = {p.shape()};
  mk::Lane lane;
  lane.role = mk::LaneRole::Compute;
  lane.ctas = 1000;
  lane.steps.push_back(gemmStep(p, 0, 0, 1, 0));
  s.lanes = {{lane}};
  s.info.op = "custom";
  s.info.algo = "gemm";
  mk::fillCostAttributes(s);
  return s;
}

/// The fused pattern on 2 ranks: rank r computes its tile into scratch c, Puts it into the peer's scratch
/// recv with a signal and copies it to out[0, m ldc); a second lane waits for the peer's tile and copies it to
/// out[m ldc, 2 m ldc).
[[maybe_unused]] Schedule fusedGemmPut(const Problem& p) {
  Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  s.nFlags = 1;
  s.buffers = {decl("ab", DType::BFloat16, mk::BufferKind::Input, p.abCount(), 2),
               decl("c", p.out, mk::BufferKind::Scratch, p.cCount(), 2),
               decl("recv", p.out, mk::BufferKind::Scratch, p.cCount(), 2),
               decl("out", p.out, mk::BufferKind::Output, 2 * p.cCount(), 2)};
  s.gemms = {p.shape()};
  s.lanes.resize(2);
  for (uint32_t r = 0; r < 2; ++r) {
    const uint32_t peer = 1 - r;
    mk::Lane compute, receiver;
    compute.role = mk::LaneRole::Compute;
    compute.ctas = 1000;
    compute.steps.push_back(gemmStep(p, r, 0, 1, 0));
    Step put;
    put.kind = StepKind::Put;
    put.dst = ref(peer, 2, 0);
    put.a = ref(r, 1, 0);
    put.count = p.cCount();
    put.flags = mk::kStepSignal;
    put.flag = mk::FlagRef{peer, 0};
    put.value = 1;
    compute.steps.push_back(put);
    Step own;
    own.kind = StepKind::Copy;
    own.dst = ref(r, 3, 0);
    own.a = ref(r, 1, 0);
    own.count = p.cCount();
    compute.steps.push_back(own);
    receiver.role = mk::LaneRole::Intra;
    Step wait;
    wait.kind = StepKind::Wait;
    wait.flag = mk::FlagRef{r, 0};
    wait.value = 1;
    receiver.steps.push_back(wait);
    Step theirs;
    theirs.kind = StepKind::Copy;
    theirs.dst = ref(r, 3, p.cCount());
    theirs.a = ref(r, 2, 0);
    theirs.count = p.cCount();
    receiver.steps.push_back(theirs);
    s.lanes[r] = {compute, receiver};
  }
  s.info.op = "custom";
  s.info.algo = "gemm-put";
  mk::fillCostAttributes(s);
  return s;
}

/// Fresh random bf16 values in [-1, 1) for A and B (one seed per call); the padding stays 0.
std::vector<float> randomAB(const Problem& p, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> uni(-1.f, 1.f);
  std::vector<float> v(p.abCount(), 0.f);
  std::vector<uint8_t> tmp(2);
  auto bf = [&] {
    mk::storeElement(DType::BFloat16, tmp.data(), 0, uni(rng));
    return mk::loadElement(DType::BFloat16, tmp.data(), 0);
  };
  for (uint32_t i = 0; i < p.m; ++i)
    for (uint32_t kk = 0; kk < p.k; ++kk) v[uint64_t{i} * p.lda() + kk] = bf();
  const uint32_t rows = p.colB ? p.n : p.k, cols = p.colB ? p.k : p.n;
  for (uint32_t i = 0; i < rows; ++i)
    for (uint32_t j = 0; j < cols; ++j) v[p.aCount() + uint64_t{i} * p.ldb() + j] = bf();
  return v;
}

/// Compare C (m x n inside ldc) with the double reference A x B (+ the old C when accumulating). Bound per
/// element: u_out |ref| + 2 k 2^-24 sum |a||b| + the old value's rounding (the two fp32 sums differ only in
/// order; bf16 output rounds once, relative 2^-9, 2^-8 allowed). Padding columns must hold `sentinel`
/// bits. Returns the mismatches (CHECKs report the first few).
uint64_t checkC(const Problem& p, const std::vector<float>& ab, const std::vector<float>& oldC,
                const std::vector<uint8_t>& got, const std::string& what) {
  const double uOut = p.out == DType::BFloat16 ? std::ldexp(1.0, -8) : 0.0;
  const double gamma = 2.0 * p.k * std::ldexp(1.0, -24);
  uint64_t bad = 0;
  std::vector<uint8_t> sentinel(4, 0xFF);
  for (uint32_t i = 0; i < p.m; ++i)
    for (uint32_t j = 0; j < p.ldc(); ++j) {
      const uint64_t at = uint64_t{i} * p.ldc() + j;
      const float g = mk::loadElement(p.out, got.data(), at);
      bool ok = false;
      double want = 0, tol = 0;
      if (j >= p.n) {
        ok = std::isnan(g);  // the 0xFF sentinel is a NaN in both dtypes
      } else {
        double sumAbs = 0;
        for (uint32_t kk = 0; kk < p.k; ++kk) {
          const double a = ab[uint64_t{i} * p.lda() + kk];
          const double b =
              p.colB ? ab[p.aCount() + uint64_t{j} * p.ldb() + kk] : ab[p.aCount() + uint64_t{kk} * p.ldb() + j];
          want += a * b;
          sumAbs += std::fabs(a * b);
        }
        if (p.accumulate) {
          want += oldC[at];
          sumAbs += std::fabs(oldC[at]);
        }
        tol = uOut * std::fabs(want) + gamma * sumAbs + 1e-30;
        ok = std::isfinite(g) && std::fabs(double(g) - want) <= tol;
      }
      if (!ok) {
        if (bad < 3) {
          CAPTURE(what);
          CAPTURE(i);
          CAPTURE(j);
          CAPTURE(g);
          CAPTURE(want);
          CAPTURE(tol);
          CHECK(ok);
        }
        ++bad;
      }
    }
  return bad;
}

std::string describe(const Problem& p) {
  return std::to_string(p.m) + "x" + std::to_string(p.n) + "x" + std::to_string(p.k) + (p.colB ? " B col" : " B row") +
         (p.out == DType::BFloat16 ? " bf16" : " f32") + (p.accumulate ? " C+=" : "");
}

/// Run `problems` as single-Gemm schedules through comms[0] (1 rank), grouped back to back when `group`,
/// each on its own fresh buffers, and check every result.
[[maybe_unused]] void runSingle(std::vector<mk::Communicator>& comms, const std::vector<Problem>& problems,
                                uint64_t seed, bool group) {
  const int dev = comms[0].device();
  mkt::Streams streams(comms);
  struct Run {
    std::unique_ptr<mkt::DeviceBuffer> ab, c;
    std::vector<float> abHost, oldC;
  };
  std::vector<Run> runs(problems.size());
  for (size_t i = 0; i < problems.size(); ++i) {
    const Problem& p = problems[i];
    Run& r = runs[i];
    r.abHost = randomAB(p, seed + i);
    const auto abBytes = mkt::toBytes(DType::BFloat16, r.abHost);
    r.ab = std::make_unique<mkt::DeviceBuffer>(dev, abBytes.size());
    r.ab->upload(abBytes.data(), abBytes.size());
    r.c = std::make_unique<mkt::DeviceBuffer>(dev, p.cCount() * mk::dtypeSize(p.out));
    r.c->fill(0xFF);
    if (p.accumulate) {
      r.oldC = mkt::randomValues(p.out, p.cCount(), seed * 7 + i, false);
      for (uint32_t row = 0; row < p.m; ++row)
        for (uint32_t col = p.n; col < p.ldc(); ++col) r.oldC[uint64_t{row} * p.ldc() + col] = NAN;
      const auto cBytes = mkt::toBytes(p.out, r.oldC);
      r.c->upload(cBytes.data(), cBytes.size());
    }
  }
  {
    std::unique_ptr<mkt::GroupGuard> g;
    if (group) g = std::make_unique<mkt::GroupGuard>();
    for (size_t i = 0; i < problems.size(); ++i) {
      const Schedule s = singleGemm(problems[i]);
      mk::validate(s);
      Watchdog::progress("execute " + describe(problems[i]));
      comms[0].execute(s, runs[i].ab->get(), runs[i].c->get(), streams.s[0]);
    }
  }
  Watchdog::progress("synchronize after " + std::to_string(problems.size()) + " op(s), the last " +
                     describe(problems.back()));
  streams.sync(comms);
  comms[0].synchronize();
  for (size_t i = 0; i < problems.size(); ++i) {
    const Problem& p = problems[i];
    std::vector<uint8_t> got(p.cCount() * mk::dtypeSize(p.out));
    runs[i].c->download(got.data(), got.size());
    CHECK(checkC(p, runs[i].abHost, runs[i].oldC, got, describe(p)) == 0);
  }
}

#if MK_TEST_MIN_GPUS < 2

TEST_CASE("compute lanes: Gemm steps match a double reference for remainders layouts and output types") {
  Watchdog dog("compute lanes: Gemm steps match a double reference for remainders layouts and output types", 90);
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  std::vector<Problem> problems;
  // Tile multiples, remainders in every dimension (m, n, k not multiples of 128 / 256 / 64), k = 8.
  const uint32_t shapes[][3] = {{128, 256, 64}, {300, 200, 100}, {1000, 520, 72}, {129, 1000, 8}, {512, 2048, 1024}};
  for (const auto& sh : shapes)
    for (bool colB : {false, true})
      for (DType out : {DType::BFloat16, DType::Float32}) {
        Problem p;
        p.m = sh[0];
        p.n = sh[1];
        p.k = sh[2];
        p.colB = colB;
        p.out = out;
        problems.push_back(p);
      }
  for (size_t i = 0; i < problems.size(); ++i) {
    CAPTURE(describe(problems[i]));
    runSingle(comms, {problems[i]}, 1000 + 17 * i, false);
  }
}

TEST_CASE("compute lanes: an accumulating Gemm step adds A times B to the old C") {
  Watchdog dog("compute lanes: an accumulating Gemm step adds A times B to the old C", 60);
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  for (DType out : {DType::BFloat16, DType::Float32})
    for (bool colB : {false, true}) {
      Problem p;
      p.m = 333;
      p.n = 264;
      p.k = 136;
      p.colB = colB;
      p.out = out;
      p.accumulate = true;
      CAPTURE(describe(p));
      runSingle(comms, {p}, 4242 + (colB ? 1 : 0) + (out == DType::Float32 ? 2 : 0), false);
    }
}

TEST_CASE("compute lanes: back-to-back Gemm ops in a group on fresh buffers each give the reference") {
  Watchdog dog("compute lanes: back-to-back Gemm ops in a group on fresh buffers each give the reference", 90);
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  std::vector<Problem> problems;
  for (uint32_t i = 0; i < 12; ++i) {
    Problem p;
    p.m = 256 + 40 * i;
    p.n = 384 - 16 * (i % 3);
    p.k = 64 + 24 * i;
    p.colB = i % 2 == 1;
    p.out = i % 3 == 2 ? DType::Float32 : DType::BFloat16;
    problems.push_back(p);
  }
  runSingle(comms, problems, 777, true);
  // The same schedules again on new buffers: cached programs, new tensor maps.
  runSingle(comms, problems, 778, true);
}

TEST_CASE("compute lanes: repeated ops on the same buffers reuse their tensor maps and stay exact") {
  Watchdog dog("compute lanes: repeated ops on the same buffers reuse their tensor maps and stay exact", 60);
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  Problem p;
  p.m = 640;
  p.n = 768;
  p.k = 320;
  const Schedule s = singleGemm(p);
  const int dev = comms[0].device();
  mkt::Streams streams(comms);
  const std::vector<float> ab = randomAB(p, 99);
  const auto abBytes = mkt::toBytes(DType::BFloat16, ab);
  mkt::DeviceBuffer abBuf(dev, abBytes.size()), cBuf(dev, p.cCount() * 2);
  abBuf.upload(abBytes.data(), abBytes.size());
  cBuf.fill(0xFF);
  {
    mkt::GroupGuard g;
    for (int i = 0; i < 50; ++i) comms[0].execute(s, abBuf.get(), cBuf.get(), streams.s[0]);
  }
  streams.sync(comms);
  comms[0].synchronize();
  std::vector<uint8_t> got(p.cCount() * 2);
  cBuf.download(got.data(), got.size());
  CHECK(checkC(p, ab, {}, got, describe(p)) == 0);
}

TEST_CASE("compute lanes: Gemm steps are refused without computeLanes and misaligned operands before launch") {
  Watchdog dog("compute lanes: Gemm steps are refused without computeLanes and misaligned operands before launch", 60);
  Problem p;
  p.m = 128;
  p.n = 128;
  p.k = 64;
  const Schedule s = singleGemm(p);
  mkt::DeviceBuffer ab(0, p.abCount() * 2 + 64), c(0, p.cCount() * 2 + 64);
  {
    auto plain = mk::Communicator::createLocal({0});
    mkt::Streams streams(plain);
    try {
      plain[0].execute(s, ab.get(), c.get(), streams.s[0]);
      FAIL("a Gemm step ran on a communicator without compute lanes");
    } catch (const mk::Error& e) {
      CHECK(e.code() == mk::ErrorCode::Unsupported);
      CHECK(std::string(e.what()).find("computeLanes") != std::string::npos);
    }
  }
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  mkt::Streams streams(comms);
  try {
    comms[0].execute(s, ab.get() + 8, c.get(), streams.s[0]);
    FAIL("a misaligned A was accepted");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("16-byte aligned") != std::string::npos);
    CHECK(std::string(e.what()).find("lane 0 step 0") != std::string::npos);
  }
  // The communicator is still usable: nothing was enqueued.
  runSingle(comms, {p}, 5, false);
  mk::CommConfig bad = computeConfig();
  bad.threadsPerCta = 256;
  CHECK_THROWS_AS(mk::Communicator::createLocal({0}, bad), mk::Error);
}

/// One rank, one lane with two Gemm steps run back to back by the same CTAs: p1 then p2, A and B of both in
/// the Input buffer (p2's at element abOffset2), C of both in the Output buffer (p2's at p1.cCount()).
Schedule twoGemms(const Problem& p1, const Problem& p2, uint64_t abOffset2) {
  Schedule s;
  s.nRanks = 1;
  s.nodeOf = {0};
  s.buffers = {decl("ab", DType::BFloat16, mk::BufferKind::Input, abOffset2 + p2.abCount(), 1),
               decl("c", DType::BFloat16, mk::BufferKind::Output, p1.cCount() + p2.cCount(), 1)};
  s.gemms = {p1.shape(), p2.shape()};
  mk::Lane lane;
  lane.role = mk::LaneRole::Compute;
  lane.ctas = 1000;
  lane.steps.push_back(gemmStep(p1, 0, 0, 1, 0));
  lane.steps.push_back(gemmStep(p2, 0, 0, 1, 1, abOffset2, p1.cCount()));
  s.lanes = {{lane}};
  s.info.op = "custom";
  s.info.algo = "two-gemms";
  mk::fillCostAttributes(s);
  return s;
}

TEST_CASE("compute lanes: two Gemm steps of different tile widths and epilogues share CTAs op after op") {
  Watchdog dog("compute lanes: two Gemm steps of different tile widths and epilogues share CTAs op after op", 90);
  // Six workers: each CTA runs several tiles of each step (the persistent loop, several phases per stage),
  // then the next step re-initialises its barriers and moves its registers again; 30 ops on the same buffers.
  mk::CommConfig cfg = computeConfig();
  cfg.workerCtas = 6;
  auto comms = mk::Communicator::createLocal({0}, cfg);
  Problem p1, p2;
  p1.m = 640;  // 40 tiles of 128 x 128 on 6 CTAs: the narrow tile, TMA-store epilogue (bf16, n % 8 == 0)
  p1.n = 1024;
  p1.k = 320;
  p2.m = 333;  // 9 narrow / 6 wide tiles: the wide tile, direct epilogue (n % 8 != 0), B column-major
  p2.n = 260;
  p2.k = 136;
  p2.colB = true;
  const uint64_t abOffset2 = (p1.abCount() + 7) / 8 * 8;
  const Schedule s = twoGemms(p1, p2, abOffset2);
  mk::validate(s);
  const int dev = comms[0].device();
  mkt::Streams streams(comms);
  const std::vector<float> ab1 = randomAB(p1, 71), ab2 = randomAB(p2, 72);
  std::vector<float> ab(abOffset2 + p2.abCount(), 0.f);
  std::copy(ab1.begin(), ab1.end(), ab.begin());
  std::copy(ab2.begin(), ab2.end(), ab.begin() + static_cast<std::ptrdiff_t>(abOffset2));
  const auto abBytes = mkt::toBytes(DType::BFloat16, ab);
  mkt::DeviceBuffer abBuf(dev, abBytes.size()), cBuf(dev, (p1.cCount() + p2.cCount()) * 2);
  abBuf.upload(abBytes.data(), abBytes.size());
  cBuf.fill(0xFF);
  {
    mkt::GroupGuard g;
    for (int i = 0; i < 30; ++i) {
      Watchdog::progress("two-Gemm op " + std::to_string(i) + " of 30");
      comms[0].execute(s, abBuf.get(), cBuf.get(), streams.s[0]);
    }
  }
  Watchdog::progress("synchronize the two-Gemm ops");
  streams.sync(comms);
  comms[0].synchronize();
  std::vector<uint8_t> got((p1.cCount() + p2.cCount()) * 2);
  cBuf.download(got.data(), got.size());
  const std::vector<uint8_t> c1(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(p1.cCount() * 2));
  const std::vector<uint8_t> c2(got.begin() + static_cast<std::ptrdiff_t>(p1.cCount() * 2), got.end());
  CHECK(checkC(p1, ab1, {}, c1, "first step " + describe(p1)) == 0);
  CHECK(checkC(p2, ab2, {}, c2, "second step " + describe(p2)) == 0);
}

TEST_CASE("compute lanes: many ops of a Gemm whose k-loop fits the stage ring all complete") {
  Watchdog dog("compute lanes: many ops of a Gemm whose k-loop fits the stage ring all complete", 90);
  // The 2-GPU test's shape (k = 200: 4 k-slices, one tile per CTA): the producer issues every load without
  // waiting and reaches the register hand-back first, the case where taking registers back too early left
  // the consumers without theirs. 200 ops on the same buffers, the last result checked.
  auto comms = mk::Communicator::createLocal({0}, computeConfig());
  Problem p;
  p.m = 700;
  p.n = 1104;
  p.k = 200;
  const Schedule s = singleGemm(p);
  const int dev = comms[0].device();
  mkt::Streams streams(comms);
  const std::vector<float> ab = randomAB(p, 202);
  const auto abBytes = mkt::toBytes(DType::BFloat16, ab);
  mkt::DeviceBuffer abBuf(dev, abBytes.size()), cBuf(dev, p.cCount() * 2);
  abBuf.upload(abBytes.data(), abBytes.size());
  cBuf.fill(0xFF);
  for (int group = 0; group < 4; ++group) {
    Watchdog::progress("group " + std::to_string(group) + " of 4 (50 ops each) of " + describe(p));
    mkt::GroupGuard g;
    for (int i = 0; i < 50; ++i) comms[0].execute(s, abBuf.get(), cBuf.get(), streams.s[0]);
  }
  Watchdog::progress("synchronize 200 ops of " + describe(p));
  streams.sync(comms);
  comms[0].synchronize();
  std::vector<uint8_t> got(p.cCount() * 2);
  cBuf.download(got.data(), got.size());
  CHECK(checkC(p, ab, {}, got, describe(p)) == 0);
}

#else  // 2-GPU cases

TEST_CASE("compute lanes: a Gemm tile Put with a signal to the peer and copied there matches on 2 GPUs") {
  Watchdog dog("compute lanes: a Gemm tile Put with a signal to the peer and copied there matches on 2 GPUs", 90);
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2), computeConfig());
  uint64_t seed = 31;
  for (DType out : {DType::BFloat16, DType::Float32})
    for (bool colB : {false, true}) {
      Problem p;
      p.m = 700;
      p.n = out == DType::BFloat16 ? 1100 : 520;
      p.k = 200;
      p.colB = colB;
      p.out = out;
      CAPTURE(describe(p));
      const Schedule s = fusedGemmPut(p);
      mk::validate(s);
      mkt::Streams streams(comms);
      std::vector<std::vector<float> > ab(2);
      std::vector<std::unique_ptr<mkt::DeviceBuffer> > abBuf(2), outBuf(2);
      for (uint32_t r = 0; r < 2; ++r) {
        ab[r] = randomAB(p, ++seed);
        const auto bytes = mkt::toBytes(DType::BFloat16, ab[r]);
        abBuf[r] = std::make_unique<mkt::DeviceBuffer>(comms[r].device(), bytes.size());
        abBuf[r]->upload(bytes.data(), bytes.size());
        outBuf[r] = std::make_unique<mkt::DeviceBuffer>(comms[r].device(), 2 * p.cCount() * mk::dtypeSize(p.out));
        outBuf[r]->fill(0xFF);
      }
      // Two ops back to back (the second on the same buffers: cached maps), then check.
      for (int rep = 0; rep < 2; ++rep) {
        Watchdog::progress("fused Gemm + Put op " + std::to_string(rep) + " of " + describe(p));
        mkt::GroupGuard g;
        for (uint32_t r = 0; r < 2; ++r) comms[r].execute(s, abBuf[r]->get(), outBuf[r]->get(), streams.s[r]);
      }
      Watchdog::progress("synchronize the fused ops of " + describe(p));
      streams.sync(comms);
      for (auto& c : comms) c.synchronize();
      for (uint32_t r = 0; r < 2; ++r) {
        std::vector<uint8_t> got(2 * p.cCount() * mk::dtypeSize(p.out));
        outBuf[r]->download(got.data(), got.size());
        const size_t half = p.cCount() * mk::dtypeSize(p.out);
        std::vector<uint8_t> own(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(half));
        std::vector<uint8_t> peer(got.begin() + static_cast<std::ptrdiff_t>(half), got.end());
        // The padding columns of C live in engine scratch (never written): compare the m x n part only.
        Problem inner = p;
        auto onlyInside = [&](std::vector<uint8_t>& v) {
          for (uint32_t i = 0; i < p.m; ++i)
            for (uint32_t j = p.n; j < p.ldc(); ++j) mk::storeElement(p.out, v.data(), uint64_t{i} * p.ldc() + j, NAN);
        };
        onlyInside(own);
        onlyInside(peer);
        CHECK(checkC(inner, ab[r], {}, own, "rank " + std::to_string(r) + " own tile " + describe(p)) == 0);
        CHECK(checkC(inner, ab[1 - r], {}, peer, "rank " + std::to_string(r) + " peer tile " + describe(p)) == 0);
      }
    }
}

TEST_CASE("compute lanes: every collective matches the reference through a compute-capable communicator") {
  Watchdog dog("compute lanes: every collective matches the reference through a compute-capable communicator", 240);
  // The collective sweep of test_collectives_gpu.cpp (mkt::runAndCheck) on a communicator created with
  // computeLanes: 384-thread CTAs, one per SM.
  auto comms = mk::Communicator::createLocal(mkt::firstDevices(2), computeConfig());
  uint64_t seed = 500;
  for (mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter, mk::CollOp::Broadcast,
                        mk::CollOp::AllToAll})
    for (DType dt : {DType::Float32, DType::BFloat16, DType::Float16})
      for (uint64_t count : {1ull, 1021ull, (1ull << 20) + 3})
        for (bool inPlace : {false, true}) {
          mk::CollectiveSpec spec;
          spec.op = op;
          spec.dtype = dt;
          spec.redop = mk::RedOp::Sum;
          spec.count = count;
          spec.root = op == mk::CollOp::Broadcast ? 1 : 0;
          CAPTURE(mk::toString(op));
          CAPTURE(mk::toString(dt));
          CAPTURE(count);
          CAPTURE(inPlace);
          Watchdog::progress(std::string(mk::toString(op)) + " " + mk::toString(dt) + " count " +
                             std::to_string(count) + (inPlace ? " in place" : " out of place"));
          CHECK(mkt::runAndCheck(comms, spec, inPlace, seed++) == 0);
        }
  // And a large one, chunked and pipelined (64 Mi float32 elements).
  mk::CollectiveSpec big;
  big.op = mk::CollOp::AllReduce;
  big.dtype = DType::Float32;
  big.count = 64ull << 20;
  Watchdog::progress("allreduce of 64 Mi float32");
  CHECK(mkt::runAndCheck(comms, big, false, 9) == 0);
}

#endif

}  // namespace
