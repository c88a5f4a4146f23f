// mkernel — the plan's headline and the numbers it quotes (headline.hpp).
#include <doctest/doctest.h>

#include <string>

#include "mk/plan/headline.hpp"
#include "mk/plan/plan_output.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

ConfidenceClass measured(const std::string& id, double medianPct) {
  ConfidenceClass c;
  c.id = id;
  ErrorStats e;
  e.n = 10;
  e.medianAbsPct = medianPct;
  c.error = e;
  return c;
}

/// A plan of one scale: 600 us of GEMMs (5 % median error), 300 us of exposed TP all-reduce (20 %), 100 us of
/// pipeline bubble (nothing measured).
PlanResult onePlan() {
  PlanResult p;
  p.inputs.workload.name = "w";
  p.inputs.cluster = "dgx-h100";
  p.inputs.tokenBudget = 1e12;
  p.gemm = GemmModel{};  // the terminal text names its model
  p.confidence.add(measured("compute.gemm", 5));
  p.confidence.add(measured("comm.nvlink.allreduce", 20));
  ConfidenceClass bubble;
  bubble.id = "model.pipeline";
  p.confidence.add(bubble);
  VariantResult v;
  v.name = "baseline";
  v.nodeType.node.gpu = "NVIDIA H100";
  ScaleResult s;
  s.gpus = 64;
  s.nodes = 8;
  s.feasible = true;
  s.layout.tp = 8;
  s.layout.pp = 2;
  s.layout.dp = 4;
  s.layout.microBatches = 16;
  s.layered.stepUs = 1000;
  s.layered.computeUs = 600;
  s.layered.tp.exposedUs = 300;
  s.layered.bubbleUs = 100;
  s.classUs = {{"compute.gemm", 600}, {"comm.nvlink.allreduce", 300}, {"model.pipeline", 100}};
  for (const auto& [id, us] : s.classUs) s.classUse[id] = p.confidence.forClass(id);
  s.tokensPerS = 1234567;
  s.gpuHours = 45678;
  s.bounds["compute"] = "tensor cores";
  s.memory.weights = 87.6e9;
  s.memoryCapacity = 80e9;
  v.scales.push_back(s);
  p.variants.push_back(v);
  return p;
}

}  // namespace

TEST_CASE("headline: the band weights each part's measured median error by its time, unmeasured parts apart") {
  const PlanResult p = onePlan();
  const StepBand b = stepBand(p, p.variants[0], p.variants[0].scales[0]);
  CHECK(b.pct == doctest::Approx((600 * 5 + 300 * 20) / 1000.0));  // 9 %
  CHECK(b.measuredShare == doctest::Approx(0.9));
  CHECK(formatBand(b) == "\u00b19.0 %");
  CHECK(formatBand(StepBand{}) == "not validated");
}

TEST_CASE("headline: the step's largest part bounds it, counts and memory read without exponents") {
  PlanResult p = onePlan();
  const Bottleneck bn = bottleneck(p.variants[0].scales[0]);
  CHECK(bn.part == "compute");
  CHECK(bn.share == doctest::Approx(0.6));
  CHECK(bn.why == "tensor cores");
  p.variants[0].scales[0].layered.bubbleUs = 700;
  CHECK(bottleneck(p.variants[0].scales[0]).part == "bubble");
  CHECK(formatCount(812) == "812");
  CHECK(formatCount(60310) == "60.31k");
  CHECK(formatCount(1234567) == "1.235M");
  CHECK(formatCount(999999) == "1M");
  CHECK(formatCount(1e12) == "1T");
  CHECK(formatMemoryOf(87.6e9, 80e9) == "87.6 GB of 80 GB per GPU");
}

TEST_CASE("headline: one sentence with the layout, band, tokens/s, GPU-hours, bound, fusing and the memory") {
  PlanResult p = onePlan();
  ScaleResult& s = p.variants[0].scales[0];
  s.fusedAvailable = true;
  s.fused.stepUs = 800;
  const std::string h = planHeadline(p);
  CHECK(h.find("layout planned tp 8 pp 2 dp 4") != std::string::npos);
  CHECK(h.find("step 1 ms \u00b19.0 % (90 % of the step measured)") != std::string::npos);
  CHECK(h.find("1.235M tokens/s, 45.68k GPU-hours for 1T tokens") != std::string::npos);
  CHECK(h.find("bound by compute (60 % of the step: tensor cores)") != std::string::npos);
  CHECK(h.find("1.25x") != std::string::npos);
  CHECK(h.find("does NOT fit: 87.6 GB of 80 GB per GPU") != std::string::npos);
  // The terminal prints it first, plan.json carries it, and neither has a number in exponent form.
  const std::string text = formatPlanText(p);
  CHECK(text.rfind("headline: w on 64 x NVIDIA H100", 0) == 0);
  CHECK(text.find("does not fit: 87.6 GB of 80 GB per GPU") != std::string::npos);
  CHECK(text.find("e+0") == std::string::npos);
  s.feasible = false;
  CHECK(planHeadline(p).find("no GPU count of the sweep is feasible") != std::string::npos);
}
