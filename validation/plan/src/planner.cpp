// mkernel — the capacity planner: sweep x variants -> lowered steps -> prices -> step times (planner.hpp).
#include "mk/plan/planner.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <set>
#include <sstream>

#include "mk/error.hpp"
#include "mk/util/size.hpp"
#include "mk/validation/prediction_cache.hpp"
#include "mk/validation/validate_layered.hpp"
#include "planner_internal.hpp"

namespace mk::plan {

using detail::attributeClasses;
using detail::describeBounds;
using detail::describeCriticalStage;
using detail::Pending;
using detail::prepareScale;

namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

[[noreturn]] void bad(const std::string& msg) { throw Error(ErrorCode::InvalidArgument, msg); }

/// The GEMM model from the records of the cluster's GPU, else of the GPU with the most records.
void fitCompute(PlanResult& out, const std::vector<MeasurementFile>& files, const std::vector<std::string>& names) {
  out.gemm = fitGemmModelFor(files, names, out.cluster.node.gpu);
  if (!out.gemm) {
    out.gemmNote = "no GEMM records (impl cublas, op gemm) in " +
                   (out.inputs.measuredDir.empty() ? std::string("(no --measured directory)") : out.inputs.measuredDir);
    return;
  }
  out.gemmNote = "fitted on " + std::to_string(out.gemm->samples.size()) + " cuBLAS records of " + out.gemm->gpu;
}

/// The simulator's errors on the committed collectives of this project's engine, with the plan's profile.
std::optional<ValidationResult> validateCollectives(PlanResult& out, const Profile& measured,
                                                    const std::vector<MeasurementFile>& files,
                                                    const std::vector<std::string>& names, std::string& gpu,
                                                    std::optional<LayeredValidation>& layered) {
  std::vector<MeasurementFile> sel;
  std::vector<std::string> selNames;
  for (std::size_t i = 0; i < files.size(); ++i) {
    bool any = false;
    for (const auto& r : files[i].records) any = any || isValidatedRecord(r);
    if (any) {
      sel.push_back(files[i]);
      selNames.push_back(names[i]);
    }
  }
  if (sel.empty()) {
    out.validationNote = "no committed collective measurement of this project's engine";
    return std::nullopt;
  }
  checkProfileIndependence(out.provenance, out.inputs.profilePath, sel, selNames);
  ValidationOptions vo;
  vo.jobs = out.inputs.pricer.jobs;
  vo.skipBad = true;
  PredictionCache cache(out.inputs.cacheDir);
  vo.cache = &cache;
  // The records' own machine: the profile as measured (applied to its own datasheet: unchanged), not as
  // applied to the planned cluster.
  ValidationResult res = validateMeasurements(sel, selNames, measured, vo);
  out.stats.validationPredictions = res.simulations;
  out.stats.validationFromCache = res.fromCache;
  gpu = loadTopology(res.cluster).node.gpu;
  out.validationNote = std::to_string(res.rows.size()) + " records of " + std::to_string(sel.size()) + " files on " +
                       res.cluster + ": median |error| " + formatNumber(res.sim.medianAbsPct, 3) + " %";
  // The plan's collectives are the layered baseline's: their confidence is the layered model's own error on the
  // committed impl: nccl records (mk-validate's nccl line), not our engine's.
  LayeredValidation lv = validateLayered(files, names, res.cluster, measured, vo.jobs, &cache);
  if (!lv.rows.empty()) {
    out.validationNote += "; layered baseline (NCCL's model): " + std::to_string(lv.rows.size()) +
                          " impl: nccl records, median |error| " + formatNumber(lv.stats.medianAbsPct, 3) + " %";
    layered = std::move(lv);
  }
  return res;
}

uint32_t nodesFor(uint32_t gpus, uint32_t perNode) { return (gpus + perNode - 1) / perNode; }

}  // namespace

double gpuMemoryBytes(const std::string& gpu) {
  if (gpu == "NVIDIA H100") return 80e9;   // H100 SXM5 datasheet: 80 GB HBM3
  if (gpu == "NVIDIA H200") return 141e9;  // H200 SXM datasheet: 141 GB HBM3e
  return 0;
}

std::vector<uint32_t> parseGpuCounts(const std::string& text) {
  auto num = [&](const std::string& s) -> uint32_t {
    std::size_t used = 0;
    unsigned long long v = 0;
    try {
      v = std::stoull(s, &used);
    } catch (...) {
      used = 0;
    }
    if (used != s.size() || s.empty() || s[0] == '-' || v == 0 || v > 1u << 24)
      bad("--gpus '" + text + "': '" + s + "' is not a GPU count from 1 to 16777216");
    return static_cast<uint32_t>(v);
  };
  std::vector<uint32_t> out;
  if (text.find(':') != std::string::npos) {
    std::vector<std::string> parts;
    std::stringstream ss(text);
    std::string p;
    while (std::getline(ss, p, ':')) parts.push_back(p);
    if (parts.size() < 2 || parts.size() > 3) bad("--gpus '" + text + "': expected MIN:MAX[:FACTOR]");
    const uint32_t lo = num(parts[0]), hi = num(parts[1]);
    const uint32_t factor = parts.size() == 3 ? num(parts[2]) : 2;
    if (lo > hi) bad("--gpus '" + text + "': MIN is larger than MAX");
    if (factor < 2) bad("--gpus '" + text + "': FACTOR must be >= 2");
    for (uint64_t g = lo; g <= hi; g *= factor) out.push_back(static_cast<uint32_t>(g));
  } else {
    std::stringstream ss(text);
    std::string p;
    while (std::getline(ss, p, ',')) out.push_back(num(p));
    if (out.empty()) bad("--gpus '" + text + "': no GPU count");
    std::sort(out.begin(), out.end());
    out.erase(std::unique(out.begin(), out.end()), out.end());
  }
  return out;
}

void loadMeasuredDir(const std::string& dir, std::vector<MeasurementFile>& files, std::vector<std::string>& names) {
  std::error_code ec;
  if (dir.empty() || !fs::is_directory(dir, ec)) return;
  std::vector<std::string> paths;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.is_regular_file() && e.path().extension() == ".json") paths.push_back(e.path().string());
  std::sort(paths.begin(), paths.end());
  for (const auto& p : paths) {
    files.push_back(loadMeasurementFile(p));
    names.push_back(fs::path(p).filename().string());
  }
}

PlanResult runPlan(const PlanInputs& in, FusedOpPricer& fusedPricer,
                   const std::function<void(const std::string&)>& progress) {
  const auto t0 = Clock::now();
  auto say = [&](const std::string& s) {
    if (progress) progress(s);
  };
  PlanResult out;
  out.inputs = in;
  validateWorkload(in.workload);
  if (in.gpus.empty()) bad("no GPU count to plan (--gpus)");
  // 1 PB per GPU: far above any datasheet; beyond it (or at 0, or negative) the memory check means nothing.
  if (in.gpuMemoryGB && !(*in.gpuMemoryGB > 0 && *in.gpuMemoryGB <= 1e6))
    bad("--gpu-memory must be in (0, 1000000] GB (got " + formatNumber(*in.gpuMemoryGB) + ")");
  // 1e18 tokens: a million times today's largest runs; beyond it GPU-hours stop being finite ("1e300T" was inf).
  if (!(in.tokenBudget > 0 && in.tokenBudget <= 1e18))
    bad("--token-budget must be in (0, 1e18] tokens (got " + formatNumber(in.tokenBudget) + ")");

  // ---- the cluster and its capacity ----
  std::error_code ec;
  out.clusterIsFile = fs::is_regular_file(in.cluster, ec);
  out.cluster = loadTopology(in.cluster);
  const uint64_t capacity = out.clusterIsFile || out.cluster.node.nics == 0
                                ? uint64_t{out.cluster.nodes} * out.cluster.node.gpus
                                : uint64_t{1} << 32;
  if (in.workload.training.fp8 && !(out.cluster.node.fp8Tflops > 0))
    bad("training.dtype: fp8 needs a GPU with FP8 tensor cores (Hopper or newer); " + out.cluster.node.gpu +
        " has none");
  for (uint32_t g : in.gpus)
    if (g > capacity)
      bad("--gpus " + std::to_string(g) + ": cluster '" + in.cluster + "' has " + std::to_string(capacity) + " GPUs (" +
          std::to_string(out.cluster.nodes) + " nodes x " + std::to_string(out.cluster.node.gpus) +
          (out.cluster.node.nics == 0 ? ", no NICs to add nodes" : "") + ")");

  // ---- the profile ----
  Profile measuredProfile;
  if (!in.profilePath.empty()) {
    // Its efficiencies on the machine it was measured on, applied to this cluster's datasheet rates.
    measuredProfile = loadProfile(in.profilePath, &out.provenance);
    out.profile = profileOnCluster(measuredProfile, profileMachine(out.provenance, out.cluster), out.cluster);
    out.profileNote = "profile " + in.profilePath + ": " + out.profile.source;
  } else {
    out.profile = measuredProfile = defaultProfile(out.cluster);
    out.provenance.tool = "defaultProfile";
    out.provenance.system = out.cluster.name;
    out.profileNote = "datasheet defaults of " + out.cluster.name + " (uncalibrated)";
  }

  // ---- the variants: checked before any long work ----
  std::vector<WhatIf> variants{WhatIf{}};
  variants.front().name = "baseline";
  variants.insert(variants.end(), in.whatIfs.begin(), in.whatIfs.end());
  std::vector<Topology> nodeTypes;
  std::vector<Profile> profiles;
  for (const WhatIf& w : variants) {
    nodeTypes.push_back(out.cluster);
    profiles.push_back(out.profile);
    applyWhatIf(w, nodeTypes.back(), profiles.back());
  }

  // ---- what the measurements say: the GEMM model and the collectives' validation ----
  std::vector<MeasurementFile> files;
  std::vector<std::string> names;
  loadMeasuredDir(in.measuredDir, files, names);
  fitCompute(out, files, names);
  // Once per run: every GPU count and variant prices from these fits.
  out.kernels = KernelModels::fit(files, names);
  out.kernelNote = out.kernels.models().empty()
                       ? "no kernel records (op kernel) in " +
                             (in.measuredDir.empty() ? std::string("(no --measured directory)") : in.measuredDir)
                       : std::to_string(out.kernels.models().size()) + " kernel models fitted on " +
                             std::to_string(out.kernels.records()) + " kernel records of " +
                             std::to_string(out.kernels.files().size()) + " files";
  out.overlap = OverlapModel::fit(files, names);
  // The slowdown of compute beside communication under a layout's overlap flags (1: it overlaps nothing).
  auto overlapOf = [&](const ParallelLayout& l, std::string& note) {
    if (l.tpCommOverlap || l.overlapMoeA2a || (l.overlapPpComm && l.schedule == PipelineSchedule::Interleaved)) {
      if (out.cluster.node.sms == 0) {
        note = "overlap: " + out.cluster.node.gpu +
               " has no SM count (node.sms): compute beside "
               "communication is priced at full speed";
      } else {
        const OverlapSlowdown sd = out.overlap.slowdown(out.cluster.node.gpu, out.cluster.node.sms, l.overlapSms);
        note = "overlap: compute beside a " + std::to_string(l.overlapSms) + "-SM communication kernel x" +
               formatNumber(sd.factor, 3) + ", " + sd.source;
        return sd.factor;
      }
    }
    return 1.0;
  };
  const double overlapSlowdown = overlapOf(in.workload.layout, out.overlapNote);
  // The scales: every GPU count of the workload, or the items.
  const std::size_t scaleCount = in.items.empty() ? in.gpus.size() : in.items.size();
  auto workloadOf = [&](std::size_t i) -> const Workload& {
    return in.items.empty() ? in.workload : in.items[i].workload;
  };
  auto overlapAt = [&](std::size_t i) {
    std::string note;
    return in.items.empty() ? overlapSlowdown : overlapOf(in.items[i].workload.layout, note);
  };
  try {  // the measured training steps, predicted with these models: the compute side's whole-step check
    out.steps = checkSteps(files, names, out.kernels);
  } catch (const Error& e) {
    if (e.code() != ErrorCode::NotFound) throw;
  }
  if (!out.gemm) {
    // No records: the profile's single GEMM rate, with no per-shape efficiency and no confidence.
    out.gemm = gemmModelAtRate(out.cluster.node, out.profile.gemmTflops);
    out.gemmNote += "; GEMMs priced at the profile's gemmTflops (" + formatNumber(out.gemm->tflops, 4) + " TFLOP/s)";
  }
  const auto tv = Clock::now();
  std::optional<ValidationResult> validation;
  std::optional<LayeredValidation> layeredValidation;
  std::string validationGpu;
  if (!files.empty()) {
    say("validating the simulator on the committed collective measurements");
    validation = validateCollectives(out, measuredProfile, files, names, validationGpu, layeredValidation);
    say("validation: " + std::to_string(out.stats.validationPredictions) + " distinct predictions, " +
        std::to_string(out.stats.validationFromCache) + " of them from the cache");
  } else {
    out.validationNote = "no measurement directory (--measured)";
  }
  out.stats.validationS = since(tv);
  out.confidence = buildConfidence(out.gemm->samples.empty() ? nullptr : &*out.gemm,
                                   validation ? &*validation : nullptr, validationGpu, out.validationNote, &out.kernels,
                                   out.cluster.node.gpu, layeredValidation ? &*layeredValidation : nullptr);
  out.fusedStatus = fusedPricer.available() ? "available" : fusedPricer.unavailableReason();

  // ---- pass 1: lower every scale of every variant and request its prices ----
  CommPricer pricer(in.pricer);
  std::vector<std::vector<Pending>> pending(variants.size());
  for (std::size_t v = 0; v < variants.size(); ++v) {
    VariantResult vr;
    vr.name = variants[v].name;
    vr.whatIf = variants[v];
    vr.nodeType = nodeTypes[v];
    vr.profile = profiles[v];
    pending[v].resize(scaleCount);
    for (std::size_t i = 0; i < scaleCount; ++i) {
      ScaleResult sr;
      sr.gpus = in.items.empty() ? in.gpus[i] : in.items[i].gpus;
      sr.item = in.items.empty() ? 0 : i;
      sr.nodes = nodesFor(sr.gpus, vr.nodeType.node.gpus);
      Pending& pd = pending[v][i];
      if (const std::size_t item = v * pending[v].size() + i; !ownsItem(in.shard, item)) {
        sr.reason = "planned by shard " + std::to_string(item % in.shard.count) + "/" + std::to_string(in.shard.count) +
                    " (mk-plan merge joins the shards)";
        vr.scales.push_back(std::move(sr));
        continue;
      }
      prepareScale(sr, pd, workloadOf(i), vr, out, pricer, fusedPricer.available());
      vr.scales.push_back(std::move(sr));
    }
    out.variants.push_back(std::move(vr));
  }

  // ---- the simulations: every distinct collective once ----
  const auto ts = Clock::now();
  say("simulating " + std::to_string(pricer.distinct()) + " distinct collectives (" +
      std::to_string(pricer.requests()) + " uses, " + std::to_string(pricer.plannedSteps()) + " steps)");
  pricer.runAll();
  out.stats.simulationS = since(ts);
  out.stats.simulations = pricer.simulations();
  out.stats.requests = pricer.requests();
  out.stats.distinct = pricer.distinct();

  // ---- pass 2: step times ----
  for (std::size_t v = 0; v < out.variants.size(); ++v) {
    VariantResult& vr = out.variants[v];
    double basePerGpu = 0;
    for (std::size_t i = 0; i < vr.scales.size(); ++i) {
      ScaleResult& sr = vr.scales[i];
      if (!sr.feasible) continue;
      Pending& pd = pending[v][i];
      std::vector<StagePrices> prices(pd.step.stages.size());
      for (std::size_t s = 0; s < prices.size(); ++s) {
        prices[s].computeUs = pd.computeUs[s];
        prices[s].overlapSlowdown = overlapAt(i);
        for (const std::string* key : pd.keys[s]) {
          const CommPrice& cp = pricer.price(*key);
          prices[s].commUs.push_back(cp.us);
          if (!out.prices.count(*key)) {
            out.prices[*key] = cp;
            out.stats.simulatedWallS += cp.wallS;
          }
        }
      }
      const Workload& wl = workloadOf(i);
      sr.layered = composeStep(wl, pd.step, prices);

      // The fused variant: every (GEMM, collective) pair priced by the fused operators' model.
      if (!fusedPricer.available()) {
        sr.fusedNote = out.fusedStatus;
      } else {
        try {
          for (std::size_t s = 0; s < prices.size(); ++s) {
            const StageLowering& st = pd.step.stages[s];
            for (const FusedCandidate& f : st.fused) {
              FusedOpRequest rq;
              rq.kind = f.kind;
              rq.gemm = st.compute[f.compute];
              rq.comm = st.comm[f.comm];
              rq.placement = placeConcurrent(st.groups[rq.comm.groups], pd.cluster);
              rq.cluster = &pd.cluster;
              rq.profile = &vr.profile;
              rq.gemmUs = prices[s].computeUs[f.compute];
              prices[s].fusedUs.push_back(fusedPricer.price(rq).us);
            }
          }
          sr.fused = composeStep(wl, pd.step, prices);
          sr.fusedAvailable = true;
        } catch (const Error& e) {
          sr.fusedNote = "fused: " + e.message();
        }
      }

      const double stepS = sr.layered.stepUs * 1e-6;
      sr.tokensPerS = static_cast<double>(pd.step.tokensPerStep) / stepS;
      sr.mfu = pd.step.modelFlopsPerStep / (stepS * sr.gpus * pd.cluster.node.bf16Tflops * 1e12);
      sr.gpuHours = in.tokenBudget / sr.tokensPerS * sr.gpus / 3600.0;
      const double perGpu = sr.tokensPerS / sr.gpus;
      if (basePerGpu == 0) basePerGpu = perGpu;
      sr.scalingEfficiency = perGpu / basePerGpu;
      if (vr.whatIf.noise.any()) {
        sr.hasNoise = true;
        sr.noise = applyNoise(vr.whatIf.noise, sr.gpus, sr.layered.stepUs, sr.layered.criticalComputeUs);
      }
      sr.memory = estimateMemory(wl, pd.step);
      sr.memoryCapacity = in.gpuMemoryGB ? *in.gpuMemoryGB * 1e9 : gpuMemoryBytes(pd.cluster.node.gpu);
      if (vr.whatIf.failures.any()) {
        sr.hasFailures = true;
        sr.failures = estimateGoodput(vr.whatIf.failures,
                                      {sr.gpus, sr.nodes, pd.cluster.node.gpus, sr.memory.weights + sr.memory.optimizer,
                                       sr.tokensPerS, in.tokenBudget});
      }

      describeCriticalStage(sr, out, pd, pricer);
      attributeClasses(sr, out, pd);
      describeBounds(sr, out, pd);
    }
  }
  out.stats.wallS = since(t0);
  return out;
}

}  // namespace mk::plan
