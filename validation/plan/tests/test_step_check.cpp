// mkernel — the planner against the committed training-step records (step_check.hpp; issue 32, item 5).
#include <doctest/doctest.h>

#include <set>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/plan/fused.hpp"
#include "mk/plan/planner.hpp"
#include "mk/plan/step_check.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

// The gate on the committed step records (median and largest |error|), set from the run that recorded them.
constexpr double kStepGateMedianPct = 3.2;
constexpr double kStepGateMaxPct = 9.0;

/// `fn` throws Error(InvalidArgument) whose message contains `part`.
template <typename Fn>
void refused(Fn fn, const char* part) {
  try {
    fn();
    FAIL("no error; expected one containing '" << part << "'");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK_MESSAGE(e.message().find(part) != std::string::npos, e.message());
  }
}

/// A file of one step record on `gpu` running `workloadJson`.
MeasurementFile stepFile(const std::string& gpu, const std::string& workloadJson) {
  MeasurementFile f;
  f.schema = "mkernel.measurement.v1";
  f.system["gpu"] = "\"" + gpu + "\"";
  MeasurementRecord r;
  r.op = "step";
  r.impl = "torch";
  r.dtype = "bfloat16";
  r.ranks = 1;
  r.timeUs = 1e5;
  r.iters = 5;
  r.stat = "median";
  r.extra["workload"] = workloadJson;
  f.records.push_back(r);
  return f;
}

const char* kTiny =
    R"({"schema": "mkernel.workload.v1", "name": "tiny", "model": {"layers": 2, "hidden": 256, "ffn": 512,
        "heads": 4, "kvHeads": 2, "vocab": 1000}, "training": {"seq": 128, "microBatch": 1, "globalBatch": 2,
        "dtype": "%s", "gradAccumFusion": false}, "layout": {"tp": 1, "pp": 1, "dp": 1}})";

std::string tiny(const char* dtype) {
  std::string s = kTiny;
  s.replace(s.find("%s"), 2, dtype);
  return s;
}

}  // namespace

TEST_CASE("step check: the committed training steps are predicted within the gate") {
  std::vector<MeasurementFile> files;
  std::vector<std::string> names;
  loadMeasuredDir(MK_MEASURED_DIR, files, names);
  const StepCheckResult r = checkSteps(files, names);
  MESSAGE(stepCheckText(r));
  std::set<std::string> kinds;
  for (const StepCheck& c : r.checks) {
    kinds.insert(c.dtype);
    kinds.insert(c.workload.find("mixtral") != std::string::npos ? "moe" : "dense");
    kinds.insert(c.gpu);
    // Every kernel of every step from a kernel model of the record's GPU.
    CHECK_MESSAGE(c.unmodelled.empty(), (c.workload + ": " + c.unmodelled));
  }
  CHECK(r.checks.size() >= 12);
  for (const char* k : {"bfloat16", "fp8", "dense", "moe"}) CHECK_MESSAGE(kinds.count(k), std::string(k));
  // The gate, set from the committed run (docs/results.md, "Training steps"): tightened when the model earns it.
  CHECK(r.error.medianAbsPct <= kStepGateMedianPct);
  CHECK(r.error.maxAbsPct <= kStepGateMaxPct);
}

TEST_CASE("step check: a step record the planner cannot price is refused, naming the record and field") {
  const std::vector<std::string> names{"steps.json"};
  // A workload that parses is predicted, whatever its GPU's records (the datasheet profile where none).
  const StepCheckResult ok = checkSteps({stepFile("NVIDIA H100 80GB HBM3", tiny("bfloat16"))}, names);
  REQUIRE(ok.checks.size() == 1);
  CHECK(ok.checks[0].predictedUs > 0);
  CHECK(ok.checks[0].microBatches == 2);
  refused([&] { checkSteps({stepFile("NVIDIA H100 80GB HBM3", R"({"model": 3})")}, names); },
          "steps.json: records[0].workload: ");
  refused([&] { checkSteps({stepFile("NVIDIA A100", tiny("fp8"))}, names); },
          "records[0].workload.training.dtype: fp8");
  MeasurementFile noWorkload = stepFile("NVIDIA H100 80GB HBM3", "");
  noWorkload.records[0].extra.clear();
  refused([&] { checkSteps({noWorkload}, names); }, "records[0].workload: missing");
  // A workload for more GPUs than one.
  std::string tp2 = tiny("bfloat16");
  tp2.replace(tp2.find(R"("tp": 1)"), 7, R"("tp": 2)");
  refused([&] { checkSteps({stepFile("NVIDIA H100 80GB HBM3", tp2)}, names); }, "records[0].workload: ");
  try {
    checkSteps({MeasurementFile{}}, names);
    FAIL("no error for files without step records");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::NotFound);
  }
}

TEST_CASE("step check: without GEMM records the GEMMs go at the profile's gemmTflops, as the planner prices them") {
  // One rule with one home (gemmModelAtRate): the step check of a record with no GEMM or kernel records and a
  // one-GPU plan of the same workload on the GPU's preset without measurements predict the same step.
  const StepCheckResult r = checkSteps({stepFile("NVIDIA H100 80GB HBM3", tiny("bfloat16"))}, {"steps.json"});
  REQUIRE(r.checks.size() == 1);
  PlanInputs in;
  in.workload = workloadFromJson(tiny("bfloat16"));
  in.cluster = "dgx-h100";
  in.gpus = {1};
  in.measuredDir = "";
  in.cacheDir = "";
  auto fused = makeFusedOpPricer();
  const PlanResult p = runPlan(in, *fused);
  REQUIRE(p.gemm);
  CHECK(p.gemm->tflops < p.gemm->peakTflops);  // the profile's rate, not the datasheet peak
  REQUIRE(p.variants.front().scales.front().feasible);
  CHECK(r.checks[0].predictedUs == doctest::Approx(p.variants.front().scales.front().layered.stepUs).epsilon(1e-12));
}
