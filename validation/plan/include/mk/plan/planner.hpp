// mkernel — the capacity planner: a workload on a cluster at every GPU count of a sweep, in every what-if variant
// (docs/planner.md). Lowers each step (mk::lowerStep), prices compute with the GEMM model and communication with
// the simulator (each distinct collective once), composes step times (step_model.hpp), and attaches to every
// number the confidence of its class of operation.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "mk/cost/profile_io.hpp"
#include "mk/plan/comm_pricer.hpp"
#include "mk/plan/confidence.hpp"
#include "mk/plan/fused.hpp"
#include "mk/plan/gemm_model.hpp"
#include "mk/plan/goodput.hpp"
#include "mk/plan/kernel_model.hpp"
#include "mk/plan/overlap_model.hpp"
#include "mk/plan/shard.hpp"
#include "mk/plan/step_check.hpp"
#include "mk/plan/step_model.hpp"
#include "mk/plan/what_if.hpp"
#include "mk/workload/memory.hpp"
#include "mk/workload/workload.hpp"

namespace mk::plan {

struct SearchResult;  // search.hpp

/// One layout at one GPU count, planned instead of the workload's own (the layout search, search.hpp): its
/// workload carries the layout and the training fields the search varies.
struct PlanItem {
  uint32_t gpus = 0;
  Workload workload;
};

/// What to plan.
struct PlanInputs {
  Workload workload;
  std::string cluster = kDefaultCluster;  ///< preset (grows to every GPU count) or topology file (a fixed size)
  std::vector<uint32_t> gpus;             ///< GPU counts, ascending
  std::string profilePath;                ///< mkernel.profile.v1 file; "" with datasheet = the cluster's datasheet
  bool datasheet = false;
  std::vector<WhatIf> whatIfs;
  double tokenBudget = 1e12;  ///< tokens, for GPU-hours
  std::string measuredDir;    ///< committed measurements (GEMM model, validation); "" = none
  /// Manifests of fused operators measured across nodes (fused_nodes_manifest.hpp): their error is the `fused`
  /// confidence class; "" = none
  std::string fusedValidationDir;
  std::string cacheDir;  ///< the validation's predictions kept between runs (prediction_cache.hpp); "" = none
  std::optional<double> gpuMemoryGB;  ///< per GPU; default from the GPU model (H100 80, H200 141)
  PricerSettings pricer;
  /// The work items this process plans (mk-plan --shard, shard.hpp); the others are infeasible "in shard k/n".
  ShardSpec shard;
  /// Planned instead of `workload` at every count of `gpus` when not empty (every count of an item in `gpus`).
  std::vector<PlanItem> items;
};

/// One communication of the critical stage at one scale.
struct CommUse {
  std::string name;  ///< CommOp::name
  Phase phase = Phase::Tp;
  CommTiming timing = CommTiming::Blocking;
  uint32_t timesPerStep = 0;  ///< runs per step on a GPU of the stage
  std::string priceKey;       ///< into PlanResult::prices
  UseConfidence confidence;
};

/// One kernel of the critical stage at one scale (every class of the census).
struct ComputeUse {
  std::string name;
  ComputeKind kind = ComputeKind::Gemm;
  KernelClass cls = KernelClass::Gemm;
  std::string kernel;  ///< the census's kernel name
  Pass pass = Pass::Forward;
  uint64_t m = 0, n = 0, k = 0, batch = 1;
  uint32_t timesPerStep = 0;
  double us = 0;      ///< one kernel
  double tflops = 0;  ///< achieved
  bool memoryBound = false;
  std::string source;  ///< KernelPrice::source: "kernel-model", "kernel-model: extrapolated", "gemm-model", "roofline:
                       ///< unmeasured"
};

/// A (GEMM, collective) pair of the critical stage that the fused variant runs as one operator.
struct FusedUse {
  FusedKind kind = FusedKind::GemmReduceScatter;
  std::string gemm, comm;  ///< ComputeOp::name, CommOp::name
  uint64_t m = 0, n = 0, k = 0;
  uint32_t timesPerStep = 0;
  double gemmUs = 0;     ///< the GEMM alone (one run)
  std::string priceKey;  ///< the collective alone, into PlanResult::prices
  double us = 0;         ///< the fused operator (one run); 0 when the fused variant has no price
  std::string source;    ///< the model that priced it (FusedOpPrice::source)
};

/// A fused block of the critical stage (mk::FusedBlock: moe-ffn, ring-attention): what it replaces and its price, or
/// why it stays layered in the fused variant.
struct FusedBlockUse {
  FusedBlockKind kind = FusedBlockKind::MoeFfn;
  Pass pass = Pass::Forward;
  bool mirror = false;                ///< the backward of the group, modelled from the forward operator
  std::vector<std::string> replaces;  ///< the kernels and exchanges it runs (ComputeOp / CommOp names)
  uint32_t timesPerStep = 0;          ///< runs per step on a GPU of the stage
  uint32_t ranks = 0;                 ///< the operator's ranks (the ep group, or the cp ring)
  double layeredComputeUs = 0;        ///< its kernels in the layered variant (one run)
  double layeredCommUs = 0;           ///< its exchanges in the layered variant (one run)
  bool priced = false;                ///< its operator gave a price (`us`)
  bool fused = false;                 ///< run as its operator: priced and faster than the layered kernels and
                                      ///< exchanges it replaces (else kept layered: `note` says why)
  double us = 0;                      ///< the operator (one run), when priced
  std::string source, split, note;    ///< FusedOpPrice::source and split; why not fused
};

/// A plan at one GPU count in one variant.
struct ScaleResult {
  uint32_t gpus = 0, nodes = 0;
  std::size_t item = 0;  ///< index into PlanInputs::items (0 without items)
  bool feasible = false;
  std::string reason;  ///< why not
  ResolvedLayout layout;
  StepBreakdown layered;
  bool fusedAvailable = false;
  StepBreakdown fused;
  std::string fusedNote;
  double tokensPerS = 0, mfu = 0, scalingEfficiency = 0, gpuHours = 0;
  bool hasNoise = false;
  NoiseResult noise;
  bool hasFailures = false;  ///< whether the variant gives failure keys (WhatIf::failures)
  GoodputResult failures;    ///< goodput under failures (goodput.hpp)
  MemoryEstimate memory;
  double memoryCapacity = 0;  ///< bytes per GPU, 0 = unknown
  std::vector<CommUse> comm;
  std::vector<ComputeUse> compute;
  std::vector<FusedUse> fusedOps;
  std::vector<FusedBlockUse> fusedBlocks;     ///< the critical stage's, priced or not (when the fused variant ran)
  std::map<std::string, std::string> bounds;  ///< phase ("compute", "tp", ...) -> what limits it
  /// Share of the step by class of operation (class id -> microseconds), each class's confidence in this use,
  /// and the resulting status.
  std::map<std::string, double> classUs;
  std::map<std::string, UseConfidence> classUse;
  /// Compute time of the step priced by a class no measurement covers (the roofline), and its share of the step's
  /// compute time (StepBreakdown::computeUs).
  double unmeasuredComputeUs = 0, unmeasuredComputeShare = 0;
  /// The critical stage's compute time per step split by what checked its prices (docs/planner.md, "Confidence"):
  /// kernels whole-step records of this GPU ran (PlanResult::steps), kernels with a kernel model of this GPU only,
  /// and the rest (extrapolated from another GPU, the GEMM model, the roofline). Shares of that compute time.
  double computeByStepRecords = 0, computeByKernelRecords = 0, computeUnchecked = 0;
  /// Kernels of any stage without a finite positive price ("stage 1: loss"): empty in every plan (a test says so).
  std::vector<std::string> unpriced;
  Status status = Status::NotValidated;
  std::string statusNote;
};

/// One variant (the baseline or a what-if) over the sweep.
struct VariantResult {
  std::string name;  ///< "baseline" or the what-if text
  WhatIf whatIf;
  Topology nodeType;  ///< the cluster's node type and fabric in this variant (node count per scale)
  Profile profile;
  std::vector<ScaleResult> scales;
};

/// Wall-clock statistics (kept out of plan.json: they differ from run to run).
struct RunStats {
  double wallS = 0, validationS = 0, simulationS = 0;
  std::size_t simulations = 0, requests = 0, distinct = 0;
  std::size_t validationPredictions = 0, validationFromCache = 0;  ///< the validation's, and its cache hits
  double simulatedWallS = 0;                                       ///< sum of the simulations' own wall times
};

/// The whole plan.
struct PlanResult {
  PlanInputs inputs;
  Topology cluster;  ///< as given (node count of the file, or 1 for a preset)
  bool clusterIsFile = false;
  Profile profile;
  ProfileProvenance provenance;
  std::string profileNote;  ///< how the profile was obtained
  std::optional<GemmModel> gemm;
  std::string gemmNote;    ///< which records, or why none
  KernelModels kernels;    ///< every kernel model of the measured folder, fitted once per run
  std::string kernelNote;  ///< which records, or why none
  OverlapModel overlap;    ///< compute beside communication, fitted once per run (kernel-overlap records)
  /// The layered overlap flags' slowdown of compute (layout.overlapSms on this GPU) and its source; empty when the
  /// layout overlaps nothing.
  std::string overlapNote;
  /// The measured training steps of the measured folder predicted by this planner (step_check.hpp); nullopt when
  /// the folder has none.
  std::optional<StepCheckResult> steps;
  ConfidenceTable confidence;
  std::string validationNote;
  std::vector<VariantResult> variants;
  std::map<std::string, CommPrice> prices;
  std::string fusedStatus;  ///< "available" or why not
  RunStats stats;
  std::shared_ptr<const SearchResult> search;  ///< mk-plan --search (search.hpp): the ranked layouts; null otherwise
};

/// The measurement files of directory `dir` (its top level only: archive/ holds engines that no longer exist), in
/// name order, appended to `files` (their file names to `names`); nothing for "" or a path that is no directory.
void loadMeasuredDir(const std::string& dir, std::vector<MeasurementFile>& files, std::vector<std::string>& names);

/// Plan. `progress` receives one-line progress messages (stderr in mk-plan). Throws Error(InvalidArgument /
/// NotFound / ParseError) for bad input (unknown cluster, a GPU count the cluster cannot hold, a profile file that
/// breaks its contract) and Error(Internal) when a simulation dies; a GPU count the layout cannot use is not an
/// error but an infeasible scale with its reason.
PlanResult runPlan(const PlanInputs& inputs, FusedOpPricer& fused,
                   const std::function<void(const std::string&)>& progress = {});

/// "64:8192" (powers of two from 64 to 8192), "64:8192:4" (x4), "8,64,1000" (a list), "512" (one count). Throws
/// Error(InvalidArgument) naming the text.
std::vector<uint32_t> parseGpuCounts(const std::string& text);

/// Memory of one GPU of the model `gpu` from its datasheet (bytes), 0 when unknown.
double gpuMemoryBytes(const std::string& gpu);

}  // namespace mk::plan
