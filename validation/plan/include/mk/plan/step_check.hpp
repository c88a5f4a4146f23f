// mkernel — the planner against measured training steps (docs/planner.md, "Checked against real steps").
//
// validation/tools/step_bench.py times whole training steps (forward, backward, optimizer) of a few layers of a
// preset on one GPU and records each as "op": "step" with the workload it ran. checkSteps() prices every such
// workload as mk-plan does on one GPU of that GPU's preset node (the same lowering, kernel and GEMM models,
// priceCompute and composeStep; one GPU has no communication) and returns measured against predicted. The CI
// gate on the committed records holds the median and the largest |error|.
#pragma once

#include <cstddef>
#include <map>
#include <set>
#include <string>
#include <vector>

#include "mk/io/measurement.hpp"
#include "mk/plan/kernel_model.hpp"
#include "mk/validation/validate.hpp"

namespace mk::plan {

/// One step record, measured and predicted.
struct StepCheck {
  std::string file;        ///< measurement file name
  std::size_t record = 0;  ///< index in its records
  std::string gpu;         ///< the file's system.gpu
  std::string workload;    ///< the workload's name
  std::string dtype;       ///< training.dtype as the workload gives it (bfloat16, fp8, ...)
  uint64_t seq = 0, microBatch = 0, microBatches = 0;
  double measuredUs = 0, predictedUs = 0;
  double errorPct = 0;  ///< signed: (predicted / measured - 1) x 100
  /// The step's kernels priced without a kernel model of this GPU (names, comma-separated); "" = none.
  std::string unmodelled;
};

struct StepCheckResult {
  std::vector<StepCheck> checks;
  ErrorStats error;        ///< over checks' errorPct
  std::string kernelNote;  ///< what the kernel models were fitted on
  /// Per GPU (the preset name, presetGpuName): the error over its records, and the kernels (stepKernelKey) the
  /// records' steps ran, which a plan on that GPU counts as validated by whole-step records.
  std::map<std::string, ErrorStats> errorByGpu;
  std::map<std::string, std::set<std::string>> kernelsByGpu;
};

/// "class kernel dtype" of a census kernel: what a step record covers (GEMMs by dtype, the others by kernel).
std::string stepKernelKey(const ComputeOp& op);

/// Every "op": "step" record of `files` (names parallel) predicted with the kernel models fitted on the kernel
/// records of the same files and the GEMM model of the record's GPU. Throws Error(InvalidArgument) naming the file,
/// the record and the field for a record whose workload does not parse, asks more than one GPU or runs on a GPU no
/// preset knows; Error(NotFound) when no file has a step record.
StepCheckResult checkSteps(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names);
/// The same with kernel models already fitted on `files` (mk-plan fits them once per run).
StepCheckResult checkSteps(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                           const KernelModels& kernels);

/// The table mk-plan --check-steps prints: one line per record, then the summary line.
std::string stepCheckText(const StepCheckResult& r);

}  // namespace mk::plan
