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
#include "mk/validation/validate_fused_nodes.hpp"
#include "mk/validation/validate_layered.hpp"
#include "planner_internal.hpp"

namespace mk::plan {

using detail::Pending;
using detail::prepareScale;
using detail::priceScale;

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

namespace {

/// One run of the planner: the state its stages share. runPlan calls the stages in order; each reads what the
/// earlier ones left here and in the result.
class PlanRun {
 public:
  PlanRun(const PlanInputs& in, FusedOpPricer& fused, const std::function<void(const std::string&)>& progress)
      : in_(in), fused_(fused), progress_(progress), pricer_(in.pricer) {
    out_.inputs = in;
  }

  /// The inputs no stage reads from a file: refused before anything is loaded.
  void checkInputs() const {
    validateWorkload(in_.workload);
    if (in_.gpus.empty()) bad("no GPU count to plan (--gpus)");
    // 1 PB per GPU: far above any datasheet; beyond it (or at 0, or negative) the memory check means nothing.
    if (in_.gpuMemoryGB && !(*in_.gpuMemoryGB > 0 && *in_.gpuMemoryGB <= 1e6))
      bad("--gpu-memory must be in (0, 1000000] GB (got " + formatNumber(*in_.gpuMemoryGB) + ")");
    // 1e18 tokens: a million times today's largest runs; beyond it GPU-hours stop being finite ("1e300T" was inf).
    if (!(in_.tokenBudget > 0 && in_.tokenBudget <= 1e18))
      bad("--token-budget must be in (0, 1e18] tokens (got " + formatNumber(in_.tokenBudget) + ")");
  }

  // ---- the cluster and its capacity ----
  void loadCluster() {
    std::error_code ec;
    out_.clusterIsFile = fs::is_regular_file(in_.cluster, ec);
    out_.cluster = loadTopology(in_.cluster);
    const Topology& c = out_.cluster;
    const uint64_t capacity =
        out_.clusterIsFile || c.node.nics == 0 ? uint64_t{c.nodes} * c.node.gpus : uint64_t{1} << 32;
    if (in_.workload.training.fp8 && !(c.node.fp8Tflops > 0))
      bad("training.dtype: fp8 needs a GPU with FP8 tensor cores (Hopper or newer); " + c.node.gpu + " has none");
    for (uint32_t g : in_.gpus)
      if (g > capacity)
        bad("--gpus " + std::to_string(g) + ": cluster '" + in_.cluster + "' has " + std::to_string(capacity) +
            " GPUs (" + std::to_string(c.nodes) + " nodes x " + std::to_string(c.node.gpus) +
            (c.node.nics == 0 ? ", no NICs to add nodes" : "") + ")");
  }

  // ---- the profile ----
  void chooseProfile() {
    if (!in_.profilePath.empty()) {
      // Its efficiencies on the machine it was measured on, applied to this cluster's datasheet rates.
      measuredProfile_ = loadProfile(in_.profilePath, &out_.provenance);
      out_.profile = profileOnCluster(measuredProfile_, profileMachine(out_.provenance, out_.cluster), out_.cluster);
      out_.profileNote = "profile " + in_.profilePath + ": " + out_.profile.source;
    } else {
      out_.profile = measuredProfile_ = defaultProfile(out_.cluster);
      out_.provenance.tool = "defaultProfile";
      out_.provenance.system = out_.cluster.name;
      out_.profileNote = "datasheet defaults of " + out_.cluster.name + " (uncalibrated)";
    }
  }

  // ---- the variants: checked before any long work ----
  void buildVariants() {
    variants_.push_back(WhatIf{});
    variants_.front().name = "baseline";
    variants_.insert(variants_.end(), in_.whatIfs.begin(), in_.whatIfs.end());
    for (const WhatIf& w : variants_) {
      nodeTypes_.push_back(out_.cluster);
      profiles_.push_back(out_.profile);
      applyWhatIf(w, nodeTypes_.back(), profiles_.back());
    }
  }

  // ---- what the measurements say: the GEMM model and the collectives' validation ----
  /// The compute side: the GEMM, kernel and overlap models and the measured steps' check, fitted once per run
  /// (every GPU count and variant prices from these fits).
  void fitModels() {
    loadMeasuredDir(in_.measuredDir, files_, names_);
    fitCompute(out_, files_, names_);
    out_.kernels = KernelModels::fit(files_, names_);
    out_.kernelNote = out_.kernels.models().empty()
                          ? "no kernel records (op kernel) in " +
                                (in_.measuredDir.empty() ? std::string("(no --measured directory)") : in_.measuredDir)
                          : std::to_string(out_.kernels.models().size()) + " kernel models fitted on " +
                                std::to_string(out_.kernels.records()) + " kernel records of " +
                                std::to_string(out_.kernels.files().size()) + " files";
    out_.overlap = OverlapModel::fit(files_, names_);
    overlapSlowdown_ = overlapOf(in_.workload.layout, out_.overlapNote);
    try {  // the measured training steps, predicted with these models: the compute side's whole-step check
      out_.steps = checkSteps(files_, names_, out_.kernels);
    } catch (const Error& e) {
      if (e.code() != ErrorCode::NotFound) throw;
    }
    if (!out_.gemm) {
      // No records: the profile's single GEMM rate, with no per-shape efficiency and no confidence.
      out_.gemm = gemmModelAtRate(out_.cluster.node, out_.profile.gemmTflops);
      out_.gemmNote +=
          "; GEMMs priced at the profile's gemmTflops (" + formatNumber(out_.gemm->tflops, 4) + " TFLOP/s)";
    }
  }

  /// The communication side: the simulator validated on the committed collectives, then every class's confidence.
  void validateModels() {
    const auto tv = Clock::now();
    // The fused operators across nodes: every manifest of --fused-validation, through its chain (mk-validate
    // --fused-nodes). First, before any progress line: a broken manifest, calibration or record file is bad input,
    // one line naming the file; a record the model cannot price is listed in the class.
    std::vector<FusedNodesValidation> fusedNodes;
    for (const std::string& manifest : findFusedNodesManifests(in_.fusedValidationDir)) {
      ValidationOptions vo;
      vo.jobs = in_.pricer.jobs;
      vo.skipBad = true;
      PredictionCache cache(in_.cacheDir);
      vo.cache = &cache;
      fusedNodes.push_back(validateFusedNodes(manifest, vo));
    }
    for (const FusedNodesValidation& v : fusedNodes)
      say("fused operators across nodes: " + std::to_string(v.fused.rows.size()) + " records of " + v.manifest.dir);
    std::optional<ValidationResult> validation;
    std::optional<LayeredValidation> layered;
    std::string validationGpu;
    if (!files_.empty()) {
      say("validating the simulator on the committed collective measurements");
      validation = validateCollectives(out_, measuredProfile_, files_, names_, validationGpu, layered);
      say("validation: " + std::to_string(out_.stats.validationPredictions) + " distinct predictions, " +
          std::to_string(out_.stats.validationFromCache) + " of them from the cache");
    } else {
      out_.validationNote = "no measurement directory (--measured)";
    }
    out_.stats.validationS = since(tv);
    out_.confidence = buildConfidence(out_.gemm->samples.empty() ? nullptr : &*out_.gemm,
                                      validation ? &*validation : nullptr, validationGpu, out_.validationNote,
                                      &out_.kernels, out_.cluster.node.gpu, layered ? &*layered : nullptr, &fusedNodes);
    out_.fusedStatus = fused_.available() ? "available" : fused_.unavailableReason();
  }

  // ---- pass 1: lower every scale of every variant and request its prices ----
  void lowerScales() {
    const std::size_t scaleCount = in_.items.empty() ? in_.gpus.size() : in_.items.size();
    pending_.resize(variants_.size());
    for (std::size_t v = 0; v < variants_.size(); ++v) {
      VariantResult vr;
      vr.name = variants_[v].name;
      vr.whatIf = variants_[v];
      vr.nodeType = nodeTypes_[v];
      vr.profile = profiles_[v];
      pending_[v].resize(scaleCount);
      for (std::size_t i = 0; i < scaleCount; ++i) {
        ScaleResult sr;
        sr.gpus = in_.items.empty() ? in_.gpus[i] : in_.items[i].gpus;
        sr.item = in_.items.empty() ? 0 : i;
        sr.nodes = nodesFor(sr.gpus, vr.nodeType.node.gpus);
        if (const std::size_t item = v * scaleCount + i; !ownsItem(in_.shard, item)) {
          sr.reason = "planned by shard " + std::to_string(item % in_.shard.count) + "/" +
                      std::to_string(in_.shard.count) + " (mk-plan merge joins the shards)";
        } else {
          prepareScale(sr, pending_[v][i], workloadOf(i), vr, out_, pricer_, fused_.available());
        }
        vr.scales.push_back(std::move(sr));
      }
      out_.variants.push_back(std::move(vr));
    }
  }

  // ---- the simulations: every distinct collective once ----
  void simulate() {
    const auto ts = Clock::now();
    say("simulating " + std::to_string(pricer_.distinct()) + " distinct collectives (" +
        std::to_string(pricer_.requests()) + " uses, " + std::to_string(pricer_.plannedSteps()) + " steps)");
    pricer_.runAll();
    out_.stats.simulationS = since(ts);
    out_.stats.simulations = pricer_.simulations();
    out_.stats.requests = pricer_.requests();
    out_.stats.distinct = pricer_.distinct();
  }

  // ---- pass 2: step times ----
  void priceScales() {
    for (std::size_t v = 0; v < out_.variants.size(); ++v) {
      VariantResult& vr = out_.variants[v];
      double basePerGpu = 0;
      for (std::size_t i = 0; i < vr.scales.size(); ++i) {
        ScaleResult& sr = vr.scales[i];
        if (!sr.feasible) continue;
        priceScale(sr, pending_[v][i], workloadOf(i), vr, out_, pricer_, fused_, overlapAt(i));
        const double perGpu = sr.tokensPerS / sr.gpus;
        if (basePerGpu == 0) basePerGpu = perGpu;
        sr.scalingEfficiency = perGpu / basePerGpu;
      }
    }
  }

  PlanResult& result() noexcept { return out_; }

 private:
  void say(const std::string& s) const {
    if (progress_) progress_(s);
  }
  /// The slowdown of compute beside communication under a layout's overlap flags (1: it overlaps nothing).
  double overlapOf(const ParallelLayout& l, std::string& note) const {
    if (l.tpCommOverlap || l.overlapMoeA2a || (l.overlapPpComm && l.schedule == PipelineSchedule::Interleaved)) {
      const NodeSpec& node = out_.cluster.node;
      if (node.sms == 0) {
        note = "overlap: " + node.gpu +
               " has no SM count (node.sms): compute beside "
               "communication is priced at full speed";
      } else {
        const OverlapSlowdown sd = out_.overlap.slowdown(node.gpu, node.sms, l.overlapSms);
        note = "overlap: compute beside a " + std::to_string(l.overlapSms) + "-SM communication kernel x" +
               formatNumber(sd.factor, 3) + ", " + sd.source;
        return sd.factor;
      }
    }
    return 1.0;
  }
  /// The scales: every GPU count of the workload, or the items.
  const Workload& workloadOf(std::size_t i) const { return in_.items.empty() ? in_.workload : in_.items[i].workload; }
  double overlapAt(std::size_t i) const {
    std::string note;
    return in_.items.empty() ? overlapSlowdown_ : overlapOf(in_.items[i].workload.layout, note);
  }

  const PlanInputs& in_;
  FusedOpPricer& fused_;
  const std::function<void(const std::string&)>& progress_;
  PlanResult out_;
  Profile measuredProfile_;  ///< the profile on the machine it was measured on (the validation's)
  std::vector<WhatIf> variants_;
  std::vector<Topology> nodeTypes_;  ///< [variant]
  std::vector<Profile> profiles_;    ///< [variant]
  std::vector<MeasurementFile> files_;
  std::vector<std::string> names_;
  double overlapSlowdown_ = 1.0;  ///< the workload's own layout's (overlapOf)
  CommPricer pricer_;
  std::vector<std::vector<Pending>> pending_;  ///< [variant][scale]
};

}  // namespace

PlanResult runPlan(const PlanInputs& in, FusedOpPricer& fusedPricer,
                   const std::function<void(const std::string&)>& progress) {
  const auto t0 = Clock::now();
  PlanRun run(in, fusedPricer, progress);
  run.checkInputs();
  run.loadCluster();
  run.chooseProfile();
  run.buildVariants();
  run.fitModels();
  run.validateModels();
  run.lowerScales();
  run.simulate();
  run.priceScales();
  PlanResult& out = run.result();
  out.stats.wallS = since(t0);
  return std::move(out);
}

}  // namespace mk::plan
