// Tests of the kernel models (issue 32 item 3): a fit recovers known parameters (rate, fixed cost and the
// memory-bound term), the committed H100 kernel records give a model per class whose leave-one-shape-out errors are
// printed and held by gates set from the run, plans price from them and say so, and bad records are refused.
#include <doctest/doctest.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/plan/kernel_model.hpp"
#include "mk/plan/plan_output.hpp"
#include "mk/plan/planner.hpp"

using namespace mk;
using namespace mk::plan;
namespace fs = std::filesystem;

namespace {

const char* kH100File = "2026-12-06-h100-fc289df-kernels.json";
// The FP8 cast class, measured in a later run (Transformer Engine's cast-transpose).
const char* kH100CastFile = "2026-12-06-h100-ff5ec45-kernels-cast.json";

/// Llama 3 8B cut to 2 layers, one micro-batch of one sequence, 2 per step: a small plan on one GPU.
Workload twoLayerLlama() {
  Workload w = workloadPreset("llama3-8b");
  w.layout = ParallelLayout{};
  w.layout.zero = 0;
  w.model.layers = 2;
  w.training.microBatch = 1;
  w.training.globalBatch = 2;
  return w;
}

/// The committed H100 kernel files copied into `dir`.
void copyH100Files(const std::filesystem::path& dir) {
  for (const char* f : {kH100File, kH100CastFile})
    std::filesystem::copy_file(std::filesystem::path(MK_MEASURED_DIR) / f, dir / f,
                               std::filesystem::copy_options::overwrite_existing);
}

/// Norm-like records made by t = c0 + flops / R + bytes / B: small ones dominated by c0, large ones by bytes, and a
/// few with a heavy FLOPs term, so that all three parameters are identified.
std::vector<KernelRecord> synthetic(double c0, double tflops, double gbs) {
  std::vector<KernelRecord> out;
  const double sizes[][2] = {{1e3, 1e5}, {1e6, 4e6}, {3e9, 2e7}, {1e8, 1e9}, {5e10, 3e8}, {2e7, 2e8}, {1e11, 1e9}};
  std::size_t i = 0;
  for (const auto& s : sizes) {
    KernelRecord r;
    r.cls = KernelClass::Norm;
    r.kernel = "rmsnorm";
    r.flops = s[0];
    r.bytes = s[1];
    r.timeUs = c0 + r.flops / (tflops * 1e6) + r.bytes / (gbs * 1e3);
    r.shape = "shape " + std::to_string(i);
    r.file = "synthetic";
    r.index = i++;
    out.push_back(r);
    r.timeUs *= 1.001;  // a second, slightly slower run of the same shape
    out.push_back(r);
  }
  return out;
}

MeasurementFile h100() { return loadMeasurementFile(std::string(MK_MEASURED_DIR) + "/" + kH100File); }

std::string refused(const MeasurementFile& f) {
  try {
    KernelModels::fit({f}, {"bad.json"});
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("kernel model: a fit on data made by a known model recovers c0, R and the effective bandwidth") {
  const KernelKey key{"test GPU", KernelClass::Norm, "rmsnorm", "", "forward"};
  const KernelModel m = fitKernelModel(synthetic(6.0, 40, 2500), key);
  CHECK(m.overheadUs == doctest::Approx(6.0).epsilon(0.01));
  CHECK(m.tflops == doctest::Approx(40).epsilon(0.01));
  CHECK(m.bandwidthGBs == doctest::Approx(2500).epsilon(0.01));
  CHECK(m.shapes == 7);
  CHECK(m.records == 14);
  CHECK(m.leaveOneShapeOut.maxAbsPct < 0.5);
  // No FLOPs term in the data: R comes out absent (0), not negative.
  const KernelModel mem = fitKernelModel(synthetic(3.0, 1e12, 1000), key);
  CHECK(mem.tflops == 0);
  CHECK(mem.bandwidthGBs == doctest::Approx(1000).epsilon(0.01));
  CHECK(predictKernelUs(mem, 0, 1e9) == doctest::Approx(3.0 + 1e3).epsilon(0.01));
  // One shape: nothing to judge a prediction by.
  auto one = synthetic(6, 40, 2500);
  one.resize(2);
  CHECK_THROWS_AS(fitKernelModel(one, key), Error);
}

TEST_CASE("kernel model: the committed H100 records give a model per class within the gates") {
  const KernelModels km = KernelModels::fit(
      {h100(), loadMeasurementFile(std::string(MK_MEASURED_DIR) + "/" + kH100CastFile)}, {kH100File, kH100CastFile});
  CHECK(km.records() == 1837);
  // Gates: set just above what this fit achieves on the committed files (2026-12-06, the fc289df and ff5ec45 runs;
  // docs/results.md); never loosened to pass.
  struct Gate {
    KernelClass cls;
    double losoMedian, losoMax;
  };
  const Gate gates[] = {
      {KernelClass::Gemm, 6, 69},        {KernelClass::Attention, 6, 32.5}, {KernelClass::Norm, 6, 27},
      {KernelClass::Activation, 1, 7.5}, {KernelClass::Rotary, 1.5, 10},    {KernelClass::Residual, 1, 3.5},
      {KernelClass::Loss, 1.5, 23},      {KernelClass::Embedding, 4.5, 34}, {KernelClass::Optimizer, 2.5, 46.5},
      {KernelClass::GradNorm, 6, 23},    {KernelClass::Cast, 4, 27},        {KernelClass::Router, 5.5, 39},
      {KernelClass::Permute, 3.5, 39.5},
  };
  for (const Gate& g : gates) {
    CAPTURE(toString(g.cls));
    const auto errs = km.classErrors(g.cls);
    REQUIRE(errs.count("NVIDIA H100"));
    const KernelClassErrors& e = errs.at("NVIDIA H100");
    std::printf(
        "kernel model H100 %-10s records %4zu shapes %4zu in-sample median %5.1f %% max %6.1f %%  "
        "leave-one-shape-out median %5.1f %% max %6.1f %%\n",
        toString(g.cls), e.records, e.shapes, e.inSample.medianAbsPct, e.inSample.maxAbsPct,
        e.leaveOneShapeOut.medianAbsPct, e.leaveOneShapeOut.maxAbsPct);
    CHECK(e.leaveOneShapeOut.medianAbsPct < g.losoMedian);
    CHECK(e.leaveOneShapeOut.maxAbsPct < g.losoMax);
  }
  for (const auto& [key, m] : km.models())
    std::printf("kernel model %-40s c0 %7.2f us  R %7.0f TFLOP/s  B %6.0f GB/s  LOSO median %5.1f %%\n",
                key.text().c_str(), m.overheadUs, m.tflops, m.bandwidthGBs, m.leaveOneShapeOut.medianAbsPct);
}

TEST_CASE("kernel model: wave quantisation of GEMM tiles is measured, and left off where it does not help") {
  MeasurementFile f = h100();
  // Only the GEMMs: the other classes ignore the option.
  std::vector<MeasurementRecord> gemms;
  for (const auto& r : f.records)
    if (r.extra.count("class") && r.extra.at("class") == "\"gemm\"") gemms.push_back(r);
  f.records = gemms;
  KernelFitOptions waves;
  waves.waveTileM = 128;
  waves.waveTileN = 256;
  waves.sms = 132;  // H100 SXM
  const KernelModels plain = KernelModels::fit({f}, {kH100File}),
                     quantised = KernelModels::fit({f}, {kH100File}, waves);
  const ErrorStats a = plain.classErrors(KernelClass::Gemm).at("NVIDIA H100").leaveOneShapeOut;
  const ErrorStats b = quantised.classErrors(KernelClass::Gemm).at("NVIDIA H100").leaveOneShapeOut;
  std::printf(
      "kernel model H100 gemm leave-one-shape-out: plain median %.2f %% max %.1f %%; 128x256 waves over 132 SMs "
      "median %.2f %% max %.1f %%\n",
      a.medianAbsPct, a.maxAbsPct, b.medianAbsPct, b.maxAbsPct);
  // What keeps the planner's choice (no waves) honest: if quantisation ever wins, this fails and the choice is
  // revisited.
  CHECK(b.medianAbsPct > a.medianAbsPct);
}

TEST_CASE("kernel model: a kernel record the census does not know is refused, naming file, record and field") {
  const MeasurementFile good = h100();
  MeasurementFile f;
  f.system = good.system;
  f.records = {good.records.at(0), good.records.at(0)};
  f.records[1].extra["class"] = "\"softmax\"";
  CHECK(refused(f).find("bad.json: records[1].class: 'softmax' is not a class of the kernel census") !=
        std::string::npos);
  f.records[1] = good.records.at(0);
  f.records[1].dtype = "int4";
  CHECK(refused(f).find("bad.json: records[1].dtype: 'int4'") != std::string::npos);
  f.records[1] = good.records.at(0);
  f.records[1].extra.erase("k");
  CHECK(refused(f).find("bad.json: records[1].k: missing (a gemm record needs m, n, k, batch)") != std::string::npos);
  f.records[1] = good.records.at(0);
  f.records[1].extra["pass"] = "\"sideways\"";
  CHECK(refused(f).find("bad.json: records[1].pass:") != std::string::npos);
}

TEST_CASE("kernel model: a dgx-h100 plan prices every kernel from the H100 kernel models and says so") {
  Workload w = twoLayerLlama();
  // Only the kernel file: no collective to validate, nothing else changes the compute.
  const fs::path dir = fs::path(MK_TEST_CACHE_DIR).parent_path() / "kernel-model-test";
  fs::create_directories(dir / "h100");
  copyH100Files(dir / "h100");
  PlanInputs in;
  in.workload = w;
  in.cluster = "dgx-h100";
  in.gpus = {1};
  in.measuredDir = (dir / "h100").string();
  in.cacheDir = "";
  auto fused = makeFusedOpPricer();
  const PlanResult p = runPlan(in, *fused);
  const ScaleResult& s = p.variants.front().scales.front();
  REQUIRE(s.feasible);
  CHECK(s.unpriced.empty());
  CHECK(s.unmeasuredComputeUs == 0);
  // Every kernel from its model.
  for (const ComputeUse& c : s.compute) {
    CAPTURE(c.name);
    CHECK(c.source == "kernel-model");
  }
  for (const auto& [id, u] : s.classUse)
    if (id.rfind("compute.", 0) == 0) CHECK(u.status == Status::Validated);
  const nlohmann::json j = nlohmann::json::parse(planToJson(p, "test"));
  CHECK(j["variants"][0]["scales"][0]["compute"][0]["source"] == "kernel-model");
  CHECK(j["confidence"]["classes"]["compute.norm"]["error_by_gpu"].contains("NVIDIA H100"));
  CHECK(j["kernel_models"]["models"].size() == p.kernels.models().size());

  // The same records for a dgx-h200 plan: extrapolated by the datasheet ratios, and marked.
  in.cluster = "dgx-h200";
  const PlanResult q = runPlan(in, *fused);
  for (const ComputeUse& c : q.variants.front().scales.front().compute) CHECK(c.source == "kernel-model: extrapolated");
  CHECK(q.confidence.forKernelClass(KernelClass::Norm, "NVIDIA H200").status == Status::Extrapolated);

  // A class with no record stays marked: the file without its norm records.
  MeasurementFile f = loadMeasurementFile((dir / "h100" / kH100File).string());
  std::vector<MeasurementRecord> kept;
  for (const auto& r : f.records)
    if (r.extra.at("class") != "\"norm\"") kept.push_back(r);
  f.records = kept;
  fs::create_directories(dir / "no-norm");
  std::ofstream(dir / "no-norm" / kH100File) << measurementFileToJson(f);
  in.cluster = "dgx-h100";
  in.measuredDir = (dir / "no-norm").string();
  const PlanResult r = runPlan(in, *fused);
  const ScaleResult& t = r.variants.front().scales.front();
  for (const ComputeUse& c : t.compute) {
    CAPTURE(c.name);
    CHECK(c.source == (c.cls == KernelClass::Norm ? "roofline: unmeasured" : "kernel-model"));
  }
  CHECK(t.unmeasuredComputeUs > 0);
  CHECK(t.classUse.at("compute.norm").status == Status::NotValidated);
}

TEST_CASE("kernel model: an fp8 dgx-h100 plan prices FP8 GEMMs from their own records, faster than bf16") {
  Workload w = twoLayerLlama();
  const fs::path dir = fs::path(MK_TEST_CACHE_DIR).parent_path() / "kernel-model-fp8-test";
  fs::create_directories(dir);
  copyH100Files(dir);
  PlanInputs in;
  in.workload = w;
  in.cluster = "dgx-h100";
  in.gpus = {1};
  in.measuredDir = dir.string();
  in.cacheDir = "";
  auto fused = makeFusedOpPricer();
  const PlanResult bf = runPlan(in, *fused);
  in.workload.training.fp8 = true;
  const PlanResult f8 = runPlan(in, *fused);
  const ScaleResult &sb = bf.variants.front().scales.front(), &sf = f8.variants.front().scales.front();
  REQUIRE(sf.feasible);
  CHECK(sf.unpriced.empty());
  auto use = [](const ScaleResult& s, const std::string& name) {
    for (const ComputeUse& c : s.compute)
      if (c.name == name) return c;
    FAIL("no kernel " << name);
    return ComputeUse{};
  };
  // Large GEMMs (8192 x 28672 x 4096) run at about twice the rate: the time roughly halves.
  for (const char* name : {"mlp-up", "mlp-up.dgrad", "mlp-up.wgrad", "mlp-down"}) {
    CAPTURE(name);
    const ComputeUse b = use(sb, name), f = use(sf, name);
    CHECK(f.source == "kernel-model");
    CHECK(f.us / b.us > 0.4);
    CHECK(f.us / b.us < 0.7);
  }
  CHECK(use(sf, "lm-head").us == use(sb, "lm-head").us);  // bf16 in both
  CHECK(use(sf, "mlp-up.cast").source == "kernel-model");
  CHECK(use(sf, "mlp-up.cast").us > 0);
  CHECK(sf.layered.computeClassUs[static_cast<int>(KernelClass::Cast)] > 0);
  CHECK(sb.layered.computeClassUs[static_cast<int>(KernelClass::Cast)] == 0);
  // The layers' GEMMs in all (the LM head, in bf16, is half of this 2-layer model's GEMM time).
  auto layerGemmUs = [](const ScaleResult& s) {
    double us = 0;
    for (const ComputeUse& c : s.compute)
      if (c.cls == KernelClass::Gemm && c.name.rfind("lm-head", 0) != 0) us += c.us * c.timesPerStep;
    return us;
  };
  CHECK(layerGemmUs(sf) < 0.7 * layerGemmUs(sb));
  CHECK(sf.layered.computeGemmUs < sb.layered.computeGemmUs);
  CHECK(sf.layered.computeUs < sb.layered.computeUs);

  // A GPU without FP8 tensor cores: refused before any work, naming the field.
  in.cluster = "a100-8x200";
  try {
    runPlan(in, *fused);
    FAIL("an fp8 plan on A100 was not refused");
  } catch (const Error& e) {
    CHECK(e.code() == ErrorCode::InvalidArgument);
    CHECK(std::string(e.what()).find("training.dtype: fp8 needs a GPU with FP8 tensor cores") != std::string::npos);
    CHECK(std::string(e.what()).find("NVIDIA A100 has none") != std::string::npos);
  }
}

TEST_CASE("kernel model: the loss is fitted per softmax regime, with a latency per row") {
  // PyTorch's rule (SoftMax.cu): a row under 48 KiB less 128 bytes of scratch, a whole number of 16-byte vectors.
  CHECK(softmaxRowInSharedMemory(16032, 2));
  CHECK(softmaxRowInSharedMemory(24504, 2));
  CHECK_FALSE(softmaxRowInSharedMemory(24512, 2));
  CHECK_FALSE(softmaxRowInSharedMemory(32000, 2));
  CHECK_FALSE(softmaxRowInSharedMemory(8001, 2));  // not a whole number of vectors
  CHECK(softmaxRowInSharedMemory(12248, 4));
  CHECK_FALSE(softmaxRowInSharedMemory(12256, 4));
  const KernelModels km = KernelModels::fit({h100()}, {kH100File});
  int loss = 0;
  for (const auto& [key, m] : km.models()) {
    if (key.cls != KernelClass::Loss) continue;
    ++loss;
    CAPTURE(key.text());
    CHECK((key.variant == "cross-entropy row-in-smem" || key.variant == "cross-entropy row-in-hbm"));
    CHECK(m.tflops == 0);  // its FLOPs are a fixed multiple of its bytes: a row term instead
  }
  CHECK(loss == 6);  // two regimes x (forward, backward, every pass)
  // A census loss op finds the model of its own regime.
  ComputeOp op;
  op.cls = KernelClass::Loss;
  op.kind = ComputeKind::Other;
  op.kernel = "cross-entropy";
  op.pass = Pass::Forward;
  op.tokens = 8192;
  for (const uint64_t vocab : {16032u, 128256u}) {
    op.vocab = vocab;
    const KernelModels::Match match = km.find(op, "NVIDIA H100");
    REQUIRE(match.model);
    CHECK(match.model->key.variant == (vocab == 16032 ? "cross-entropy row-in-smem" : "cross-entropy row-in-hbm"));
  }
}
