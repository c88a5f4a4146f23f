// Tests of the step-time model on lowered steps with chosen prices: every formula of step_model.hpp checked
// against a hand computation.
#include <doctest/doctest.h>

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <vector>

#include "mk/error.hpp"
#include "mk/plan/step_model.hpp"
#include "mk/workload/lowering.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

/// Every compute kernel costs `compute` us, every communication of `phase` costs `comm` us (others 0).
std::vector<StagePrices> flatPrices(const StepLowering& s, double compute, double comm, Phase phase) {
  std::vector<StagePrices> out;
  for (const StageLowering& st : s.stages) {
    StagePrices p;
    p.computeUs.assign(st.compute.size(), compute);
    for (const CommOp& c : st.comm) p.commUs.push_back(c.phase == phase ? comm : 0.0);
    out.push_back(p);
  }
  return out;
}

double kernels(const StageLowering& st, Pass pass) {
  double n = 0;
  for (const ComputeOp& op : st.compute)
    if (op.pass == pass) n += op.times;
  return n;
}

double sumOfParts(const StepBreakdown& b) {
  return b.computeUs + b.tp.exposedUs + b.ep.exposedUs + b.pp.exposedUs + b.dp.exposedUs + b.cp.exposedUs + b.bubbleUs;
}

Workload small(uint32_t tp, uint32_t pp) {
  Workload w = workloadPreset("llama3-8b");
  w.training.globalBatch = 64;
  w.layout.tp = tp;
  w.layout.pp = pp;
  w.layout.zero = 0;
  return w;
}

}  // namespace

TEST_CASE("step model: without communication a step is micro-batches x the stage's compute") {
  const Workload w = small(1, 1);
  const StepLowering s = lowerStep(w, resolveLayout(w, 1));
  const StepBreakdown b = composeStep(w, s, flatPrices(s, 2.0, 0, Phase::Tp));
  const double perMb = 2.0 * (kernels(s.stages[0], Pass::Forward) + kernels(s.stages[0], Pass::Backward));
  // ... and once per step its optimizer step, the masters' copy into the parameters, the zeroing of the main
  // gradients and the gradient norm, after the last backward pass.
  const double perStep = 2.0 * kernels(s.stages[0], Pass::Step);
  CHECK(perStep == 8.0);
  CHECK(b.optimizerUs == doctest::Approx(perStep));
  CHECK(b.stepUs == doctest::Approx(64 * perMb + perStep));
  CHECK(b.computeUs == doctest::Approx(b.stepUs));
  CHECK(b.bubbleUs == 0);
  CHECK(b.criticalComputeUs == doctest::Approx(b.stepUs));
}

TEST_CASE("step model: the pipeline bubble is (p - 1) / v micro-batch times") {
  Workload w = small(1, 4);
  const StepLowering s = lowerStep(w, resolveLayout(w, 4));
  const StepBreakdown b = composeStep(w, s, flatPrices(s, 1.0, 0, Phase::Tp));
  // The slowest stage is the last (8 layers and the LM head).
  CHECK(b.criticalStage == 3);
  const double t = kernels(s.stages[3], Pass::Forward) + kernels(s.stages[3], Pass::Backward);
  CHECK(b.forwardUs + b.backwardUs == doctest::Approx(t));
  CHECK(b.bubbleUs == doctest::Approx(3 * t));
  // Stage 0 ends its last backward pass last; its four per-step kernels (1 us each) follow.
  CHECK(b.optimizerUs == doctest::Approx(kernels(s.stages[0], Pass::Step)));
  CHECK(b.stepUs == doctest::Approx((64 + 3) * t + 4));
  CHECK(sumOfParts(b) == doctest::Approx(b.stepUs));

  w.layout.schedule = PipelineSchedule::Interleaved;
  w.layout.virtualStages = 2;
  const StepLowering si = lowerStep(w, resolveLayout(w, 4));
  const StepBreakdown bi = composeStep(w, si, flatPrices(si, 1.0, 0, Phase::Tp));
  CHECK(bi.bubbleUs == doctest::Approx(1.5 * (bi.forwardUs + bi.backwardUs)));
}

TEST_CASE("step model: blocking tensor-parallel communication adds per micro-batch, fused hides it") {
  const Workload w = small(8, 1);
  const StepLowering s = lowerStep(w, resolveLayout(w, 8));
  const StepBreakdown layered = composeStep(w, s, flatPrices(s, 1.0, 5.0, Phase::Tp));
  double runs = 0;
  for (const CommOp& c : s.stages[0].comm)
    if (c.phase == Phase::Tp) runs += c.times;
  CHECK(layered.tp.exposedUs == doctest::Approx(64 * 5.0 * runs));
  CHECK(layered.tp.hiddenUs == 0);
  CHECK(sumOfParts(layered) == doctest::Approx(layered.stepUs));

  // A fused operator that takes exactly its GEMM's time hides all of its collective.
  auto prices = flatPrices(s, 1.0, 5.0, Phase::Tp);
  prices[0].fusedUs.assign(s.stages[0].fused.size(), 1.0);
  const StepBreakdown fused = composeStep(w, s, prices);
  CHECK(fused.tp.exposedUs == doctest::Approx(0));
  CHECK(fused.tp.hiddenUs == doctest::Approx(layered.tp.exposedUs));
  CHECK(fused.stepUs == doctest::Approx(layered.stepUs - layered.tp.exposedUs));
  // One that takes GEMM + 2 us exposes 2 us per run.
  prices[0].fusedUs.assign(s.stages[0].fused.size(), 3.0);
  const StepBreakdown partly = composeStep(w, s, prices);
  CHECK(partly.tp.exposedUs == doctest::Approx(64 * 2.0 * runs));
  CHECK(partly.tp.hiddenUs == doctest::Approx(64 * 3.0 * runs));
  CHECK(sumOfParts(partly) == doctest::Approx(partly.stepUs));
}

TEST_CASE("step model: gradient buckets overlap the last backward pass, the last one is always exposed") {
  Workload w = small(8, 1);
  const StepLowering s = lowerStep(w, resolveLayout(w, 64));  // dp 8
  uint32_t buckets = 0;
  for (const CommOp& c : s.stages[0].comm)
    if (c.timing == CommTiming::GradBucket) buckets += c.times;
  REQUIRE(buckets > 2);
  const double back = kernels(s.stages[0], Pass::Backward) * 1.0;
  // Short buckets: each is done before the next is ready, only the last runs past the backward pass.
  const double d = 0.5 * back / buckets;
  const StepBreakdown b = composeStep(w, s, flatPrices(s, 1.0, d, Phase::Dp));
  CHECK(b.dp.exposedUs == doctest::Approx(d));
  CHECK(b.dp.hiddenUs == doctest::Approx((buckets - 1) * d));
  // Long buckets: they queue; the tail is everything minus what fits after the first is ready.
  const double D = 2.0 * back / buckets;
  const StepBreakdown q = composeStep(w, s, flatPrices(s, 1.0, D, Phase::Dp));
  CHECK(q.dp.exposedUs == doctest::Approx(back / buckets + buckets * D - back));
  // Without overlap every bucket waits for the end of the backward pass.
  w.layout.overlapGradReduce = false;
  const StepBreakdown n = composeStep(w, s, flatPrices(s, 1.0, d, Phase::Dp));
  CHECK(n.dp.exposedUs == doctest::Approx(buckets * d));
  CHECK(sumOfParts(n) == doctest::Approx(n.stepUs));
}

TEST_CASE("step model: a hundred million gradient buckets compose in constant memory and time") {
  // Issue 40: a vocabulary of 2^40 made one double per bucket, gigabytes, and exited 0. Runs of equal buckets
  // give the same tail as bucket by bucket (the case above), from the same formulas.
  Workload w = small(8, 1);
  w.model.vocab = uint64_t{1} << 40;
  const StepLowering s = lowerStep(w, resolveLayout(w, 64));
  uint64_t buckets = 0;
  for (const CommOp& c : s.stages[0].comm)
    if (c.timing == CommTiming::GradBucket) buckets += c.times;
  REQUIRE(buckets > 100000000);
  const double back = kernels(s.stages[0], Pass::Backward) * 1.0;
  const std::clock_t t0 = std::clock();  // processor time: a loaded CI machine stretches the wall clock
  const double d = 0.5 * back / static_cast<double>(buckets);
  const StepBreakdown b = composeStep(w, s, flatPrices(s, 1.0, d, Phase::Dp));
  CHECK(b.dp.exposedUs == doctest::Approx(d));
  CHECK(b.dp.hiddenUs == doctest::Approx(static_cast<double>(buckets - 1) * d));
  const double D = 2.0 * back / static_cast<double>(buckets);
  const StepBreakdown q = composeStep(w, s, flatPrices(s, 1.0, D, Phase::Dp));
  CHECK(q.dp.exposedUs ==
        doctest::Approx(back / static_cast<double>(buckets) + static_cast<double>(buckets) * D - back));
  // One double per bucket was 0.8 GB and seconds here; the runs take microseconds (1 s: room for a sanitizer).
  CHECK(static_cast<double>(std::clock() - t0) / CLOCKS_PER_SEC < 1.0);
}

TEST_CASE("step model: ZeRO 1 gathers parameters after the step, overlapped with the next forward when asked") {
  Workload w = small(8, 1);
  w.layout.zero = 1;
  const StepLowering s = lowerStep(w, resolveLayout(w, 64));
  std::vector<StagePrices> prices = flatPrices(s, 1.0, 0, Phase::Dp);
  double gathers = 0;
  for (std::size_t i = 0; i < s.stages[0].comm.size(); ++i)
    if (s.stages[0].comm[i].timing == CommTiming::ParamGather) {
      prices[0].commUs[i] = 3.0;
      gathers += s.stages[0].comm[i].times;
    }
  const StepBreakdown b = composeStep(w, s, prices);
  CHECK(b.dp.exposedUs == doctest::Approx(3.0 * gathers));
  w.layout.overlapParamGather = true;
  const StepBreakdown o = composeStep(w, s, prices);
  CHECK(o.dp.exposedUs == doctest::Approx(std::max(0.0, 3.0 * gathers - o.forwardUs)));
  CHECK_THROWS(composeStep(w, s, {}));
}

TEST_CASE("step model: context parallelism's K/V ring hides behind (cp - 1) / cp of the attention") {
  Workload w = small(1, 1);
  w.layout.cp = 4;  // p2p: 3 ring steps per layer and pass
  const StepLowering s = lowerStep(w, resolveLayout(w, 4));
  const double m = s.layout.microBatches, layers = 32, attention = layers * 1.0;  // one attention kernel a layer
  for (double send : {1.0, 0.1}) {
    CAPTURE(send);
    const StepBreakdown b = composeStep(w, s, flatPrices(s, 1.0, send, Phase::Cp));
    const double ring = 3 * layers * send;  // per pass and micro-batch
    const double exposed = std::max(0.0, ring - 0.75 * attention);
    CHECK(b.cp.exposedUs == doctest::Approx(m * 2 * exposed));
    CHECK(b.cp.hiddenUs == doctest::Approx(m * 2 * (ring - exposed)));
  }
  // all-gather CP is not overlapped: every gather and reduce-scatter is on the critical path.
  w.layout.cpCommType = CpCommType::AllGather;
  const StepLowering g = lowerStep(w, resolveLayout(w, 4));
  const StepBreakdown bg = composeStep(w, g, flatPrices(g, 1.0, 1.0, Phase::Cp));
  CHECK(bg.cp.exposedUs == doctest::Approx(m * 3 * layers));
  CHECK(bg.cp.hiddenUs == 0);
}

namespace {

/// beside(): the communication beside compute that runs `slow` times slower meanwhile (step_model.cpp).
double besideUs(double compute, double comm, double slow) {
  return comm >= compute * slow ? comm : compute + comm * (1 - 1 / slow);
}

}  // namespace

TEST_CASE("step model: tpCommOverlap prices each GEMM and collective as userbuffers' chunked pipeline") {
  Workload w = small(8, 1);
  w.layout.tpCommOverlap = true;
  const StepLowering s = lowerStep(w, resolveLayout(w, 8));
  for (const double comm : {5.0, 0.5}) {
    auto prices = flatPrices(s, 1.0, comm, Phase::Tp);
    prices[0].overlapSlowdown = 1.2;
    const StepBreakdown b = composeStep(w, s, prices);
    double exposed = 0, hidden = 0;
    for (const FusedCandidate& f : s.stages[0].fused) {
      const double g = 1.0 * s.stages[0].compute[f.compute].times, c = comm * s.stages[0].comm[f.comm].times;
      const double e = besideUs(g, c, 1.2) + std::min(g, c) / 8 - g;
      exposed += e;
      hidden += c - e;
    }
    CHECK(b.tp.exposedUs == doctest::Approx(64 * exposed));
    CHECK(b.tp.hiddenUs == doctest::Approx(64 * hidden));
    CHECK(sumOfParts(b) == doctest::Approx(b.stepUs));
  }
  // Megatron-LM refuses --tp-comm-overlap without sequence parallelism; so does the workload.
  w.layout.sp = false;
  CHECK_THROWS_WITH_AS(validateWorkload(w), doctest::Contains("layout.tpCommOverlap needs layout.sp"), Error);
}

TEST_CASE("step model: overlapPpComm hides the interleaved schedule's sends behind the slowed compute") {
  Workload w = small(1, 4);
  w.layout.schedule = PipelineSchedule::Interleaved;
  w.layout.virtualStages = 2;
  w.layout.overlapPpComm = false;
  const StepLowering s = lowerStep(w, resolveLayout(w, 4));
  auto prices = flatPrices(s, 1.0, 0.001, Phase::Pp);
  const StepBreakdown off = composeStep(w, s, prices);
  REQUIRE(off.pp.exposedUs > 0);
  w.layout.overlapPpComm = true;
  for (auto& p : prices) p.overlapSlowdown = 1.5;
  const StepBreakdown on = composeStep(w, s, prices);
  // Sends shorter than the pass: a third of each (1 - 1 / 1.5) is the compute's slowdown while they run.
  CHECK(on.pp.exposedUs == doctest::Approx(off.pp.exposedUs / 3));
  CHECK(on.pp.hiddenUs == doctest::Approx(off.pp.exposedUs * 2 / 3));
  // The 1F1B schedule keeps its sends blocking, as Megatron-LM's overlap_p2p_comm applies to interleaving only.
  w.layout.schedule = PipelineSchedule::OneFOneB;
  w.layout.virtualStages = 1;
  const StepLowering s1 = lowerStep(w, resolveLayout(w, 4));
  const StepBreakdown plain = composeStep(w, s1, flatPrices(s1, 1.0, 0.001, Phase::Pp));
  CHECK(plain.pp.hiddenUs == 0);
}

TEST_CASE("step model: overlapMoeA2a hides the all-to-alls behind the other micro-batch's compute") {
  Workload w = workloadPreset("mixtral-8x22b");
  w.model.layers = 2;
  w.layout = ParallelLayout{};
  w.layout.ep = 2;
  w.layout.zero = 0;
  w.training.microBatch = 1;
  w.training.globalBatch = 4;
  const StepLowering s = lowerStep(w, resolveLayout(w, 2));
  const StepBreakdown off = composeStep(w, s, flatPrices(s, 1.0, 1e6, Phase::Ep));
  REQUIRE(off.ep.exposedUs > 0);
  w.layout.overlapMoeA2a = true;
  auto prices = flatPrices(s, 1.0, 1e6, Phase::Ep);
  prices[0].overlapSlowdown = 1.1;
  const StepBreakdown on = composeStep(w, s, prices);
  // All-to-alls far longer than the compute: the compute hides under them, the step is the communication.
  const double computeMb = (on.computeUs - on.optimizerUs) / s.layout.microBatches;
  CHECK(on.ep.exposedUs == doctest::Approx(off.ep.exposedUs - s.layout.microBatches * computeMb));
  CHECK(on.ep.hiddenUs == doctest::Approx(s.layout.microBatches * computeMb));
  CHECK(sumOfParts(on) == doctest::Approx(on.stepUs));
}
