// Goodput under failures (goodput.hpp): the Young-Daly optimum, the first-order ETTR against its closed form,
// failure rates by domain, the spare pool, "unknown" for missing inputs, and the what-if keys' bad values.
#include <doctest/doctest.h>

#include <cmath>
#include <string>

#include "mk/error.hpp"
#include "mk/plan/goodput.hpp"
#include "mk/plan/what_if.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

FailureScale job16k() {
  FailureScale j;
  j.gpus = 16384;
  j.nodes = 2048;
  j.gpusPerNode = 8;
  j.checkpointBytesPerGpu = 40e9;
  j.tokensPerS = 2e6;
  j.tokenBudget = 15e12;
  return j;
}

std::string errorOf(const std::string& whatIf) {
  try {
    parseWhatIf(whatIf);
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.message();
  }
  return "(accepted)";
}

}  // namespace

TEST_CASE("goodput: the Young-Daly interval maximises the first-order ETTR") {
  const double write = 120, mtbf = 3 * 3600, restart = 600;
  const double t = youngDalyIntervalS(write, mtbf);
  CHECK(t == doctest::Approx(std::sqrt(2 * write * mtbf)));
  const double best = firstOrderEttr(write, t, restart, mtbf);
  for (double f : {0.5, 0.9, 0.99, 1.01, 1.1, 2.0}) CHECK(firstOrderEttr(write, t * f, restart, mtbf) < best);
  // At the optimum the two overheads are equal: W / T* = T* / (2 M).
  CHECK(write / t == doctest::Approx(t / (2 * mtbf)));
}

TEST_CASE("goodput: ETTR, goodput and time to train follow the closed form") {
  const WhatIf w = parseWhatIf("mtbf=gpu:50000h,restart=1min:4min:8min:2min,checkpoint=90s");
  REQUIRE(w.failures.any());
  CHECK(*w.failures.restartS == doctest::Approx(15 * 60));
  const FailureScale j = job16k();
  const GoodputResult g = estimateGoodput(w.failures, j);
  const double m = 50000.0 * 3600 / 16384, wr = 90, r = 900;
  CHECK(g.jobMtbfS == doctest::Approx(m));
  CHECK(g.failuresPerHour * 24 == doctest::Approx(16384 * 24 / 50000.0));
  REQUIRE(g.intervalS);
  CHECK(g.youngDaly);
  const double t = std::sqrt(2 * wr * m);
  CHECK(*g.intervalS == doctest::Approx(t));
  REQUIRE(g.ettr);
  CHECK(*g.ettr == doctest::Approx(1 - (wr / t + (t / 2 + r) / m)));
  CHECK(*g.lostPerFailureS == doctest::Approx(t / 2 + r));
  CHECK(*g.goodputTokensPerS == doctest::Approx(j.tokensPerS * *g.ettr));
  CHECK(*g.trainS == doctest::Approx(j.tokenBudget / (j.tokensPerS * *g.ettr)));
  CHECK(g.unknown.empty());

  // A given interval is used as given.
  const GoodputResult h = estimateGoodput(parseWhatIf("mtbf=gpu:50000h,restart=15min,checkpoint=90s,"
                                                      "ckptinterval=1h")
                                              .failures,
                                          j);
  CHECK_FALSE(h.youngDaly);
  CHECK(*h.ettr == doctest::Approx(1 - (wr / 3600 + (1800 + r) / m)));
  CHECK(*h.ettr < *g.ettr);
}

TEST_CASE("goodput: failure domains add their rates, a rack's failure counts once per rack") {
  const FailureScale j = job16k();  // 2048 nodes: 114 racks of 18 (the last one partial)
  const GoodputResult g =
      estimateGoodput(parseWhatIf("mtbf=gpu:80000h,mtbf=node:20000h,mtbf=rack:10000h,rack=18").failures, j);
  CHECK(g.racks == 114);
  CHECK(g.failuresPerHour == doctest::Approx(16384 / 80000.0 + 2048 / 20000.0 + 114 / 10000.0));
  // Only the domains given: mtbf=node: alone has no GPU term.
  const GoodputResult n = estimateGoodput(parseWhatIf("mtbf=node:20000h").failures, j);
  CHECK(n.failuresPerHour == doctest::Approx(2048 / 20000.0));
}

TEST_CASE("goodput: missing inputs are unknown, the MTBF defaults to the published rate") {
  const FailureScale j = job16k();
  const GoodputResult g = estimateGoodput(parseWhatIf("restart=10min").failures, j);
  CHECK(g.jobMtbfS == doctest::Approx(kDefaultGpuMtbfH * 3600 / 16384));
  CHECK(g.mtbfSource.find("Llama 3") != std::string::npos);
  CHECK_FALSE(g.writeS);
  CHECK_FALSE(g.intervalS);
  CHECK_FALSE(g.ettr);
  CHECK_FALSE(g.goodputTokensPerS);
  CHECK(g.unknown.find("ckptbw=") != std::string::npos);
  const std::string table = formatGoodputTable({{j.gpus, &g}});
  CHECK(table.find("unknown") != std::string::npos);

  const GoodputResult r = estimateGoodput(parseWhatIf("ckptbw=node:32").failures, j);
  REQUIRE(r.writeS);
  CHECK(*r.writeS == doctest::Approx(40e9 * 8 / 32e9));  // the node's 8 GPUs share its bandwidth
  CHECK_FALSE(r.ettr);
  CHECK(r.unknown.find("restart=") != std::string::npos);
  const GoodputResult p = estimateGoodput(parseWhatIf("ckptbw=gpu:4").failures, j);
  CHECK(*p.writeS == doctest::Approx(40e9 / 4e9));
  // checkpoint=SIZE replaces the memory model's bytes per GPU; without ckptbw= its write time is unknown.
  const GoodputResult z = estimateGoodput(parseWhatIf("checkpoint=16GiB,ckptbw=gpu:4").failures, j);
  CHECK(z.checkpointBytesPerGpu == doctest::Approx(16.0 * (1ull << 30)));
  CHECK(*z.writeS == doctest::Approx(16.0 * (1ull << 30) / 4e9));
  const GoodputResult zu = estimateGoodput(parseWhatIf("checkpoint=16GiB,restart=1min").failures, j);
  CHECK_FALSE(zu.writeS);
  CHECK(zu.unknown.find("a size needs ckptbw=") != std::string::npos);
}

TEST_CASE("goodput: a failure without a spare waits for the repair") {
  const FailureScale j = job16k();
  // No spare at all: every failure waits the whole repair.
  const GoodputResult none =
      estimateGoodput(parseWhatIf("restart=10min,checkpoint=1min,spares=0,repair=1h").failures, j);
  CHECK(none.noSpareProbability == doctest::Approx(1));
  CHECK(*none.waitS == doctest::Approx(3600));
  // One spare: the failure waits when any node is still away, P = 1 - exp(-rate x repair) (M/G/inf).
  const GoodputResult one =
      estimateGoodput(parseWhatIf("restart=10min,checkpoint=1min,spares=1,repair=1h").failures, j);
  const double mu = 16384 / kDefaultGpuMtbfH;
  CHECK(one.noSpareProbability == doctest::Approx(1 - std::exp(-mu)));
  // Many spares: no wait left; no spares= at all: a replacement is always there.
  const GoodputResult many =
      estimateGoodput(parseWhatIf("restart=10min,checkpoint=1min,spares=64,repair=1h").failures, j);
  CHECK(*many.waitS < 1e-6);
  const GoodputResult always = estimateGoodput(parseWhatIf("restart=10min,checkpoint=1min").failures, j);
  CHECK(*always.waitS == 0);
  CHECK(*always.ettr == doctest::Approx(*many.ettr));
  CHECK(*none.ettr > 0);
  CHECK(*none.ettr < *one.ettr);
  // spares= without repair=: the wait is unknown, so is the ETTR.
  const GoodputResult unknown = estimateGoodput(parseWhatIf("restart=10min,checkpoint=1min,spares=4").failures, j);
  CHECK_FALSE(unknown.ettr);
  CHECK(unknown.unknown.find("repair=") != std::string::npos);
}

TEST_CASE("goodput: bad values of the failure keys name the key") {
  CHECK(errorOf("mtbf=gpu:0h").find("mtbf must be a duration > 0") != std::string::npos);
  CHECK(errorOf("mtbf=gpu:-5h").find("mtbf must be a duration > 0") != std::string::npos);
  CHECK(errorOf("mtbf=gpu:5000y").find("mtbf: unknown unit 'y'") != std::string::npos);
  CHECK(errorOf("mtbf=gpu:5000").find("mtbf: unknown unit ''") != std::string::npos);
  CHECK(errorOf("mtbf=disk:5000h").find("mtbf must be gpu:, node: or rack:") != std::string::npos);
  CHECK(errorOf("mtbf=rack:5000h").find("mtbf=rack: needs rack=N") != std::string::npos);
  CHECK(errorOf("restart=-1s").find("restart must be a duration >= 0") != std::string::npos);
  CHECK(errorOf("restart=1min:2min").find("restart must be one duration or four") != std::string::npos);
  CHECK(errorOf("spares=-1").find("spares must be a whole number") != std::string::npos);
  CHECK(errorOf("spares=1.5").find("spares must be a whole number") != std::string::npos);
  CHECK(errorOf("ckptbw=0").find("ckptbw must be in (0,") != std::string::npos);
  CHECK(errorOf("checkpoint=1min,ckptbw=10").find("exclude each other") != std::string::npos);
  CHECK(errorOf("checkpoint=40Gb").find("checkpoint must be a write time (90s, 2min) or the bytes per GPU") !=
        std::string::npos);
  CHECK(errorOf("restart=0s") == "(accepted)");
  CHECK(errorOf("mtbf=gpu:1.5e4h,mtbf=node:2d,restart=90s,spares=0,repair=4h") == "(accepted)");
}
