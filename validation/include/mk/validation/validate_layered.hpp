// mkernel — validation of the layered baseline: every `impl: nccl` collective record predicted with the nccl-*
// family under "nccl auto" (mk/algorithms/nccl.hpp), the second line of mk-validate (docs/validation.md).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/io/measurement.hpp"
#include "mk/validation/validate.hpp"

namespace mk {

/// One `impl: nccl` record and its prediction.
struct LayeredRow {
  std::string file;
  std::size_t index = 0;  ///< record index in its file
  std::string op;
  uint64_t bytes = 0;
  uint32_t ranks = 0;  ///< GPUs of the record
  double measuredUs = 0;
  std::string choice;          ///< what "nccl auto" picked: "nccl-ring/ll", ...
  uint32_t launchesPerOp = 1;  ///< kernels the timing thread launched per op (the GPUs it drove)
  double gpuUs = 0;            ///< the simulator's time of the chosen schedule under layeredProfile
  double predictedUs = 0;      ///< layeredOpUs(gpuUs, profile, launchesPerOp)
  double errPct = 0;
};

/// The outcome over every file.
struct LayeredValidation {
  std::vector<LayeredRow> rows;
  std::size_t ignored = 0;  ///< nccl records of ops without a layered generator
  ErrorStats stats;
};

/// Kernels one timing thread launched per op in `f`: the GPUs of the run when one process drove them all (no
/// "processes" in its system block), else the GPUs per process. Throws Error(InvalidArgument) naming `name` when
/// "gpus" is missing or not a positive integer.
uint32_t launchesPerOp(const MeasurementFile& f, const std::string& name);

/// Predict every `impl: nccl` allreduce / allgather / reducescatter record of `files` on `cluster` (a preset or a
/// topology file): the nccl-* algorithm and protocol chooseLayered() picks under `profile`, simulated under
/// layeredProfile(), plus the host's launches (layeredOpUs). `jobs` predictions run at once; `cache` (optional)
/// keeps them between runs (prediction_cache.hpp).
LayeredValidation validateLayered(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                                  const std::string& cluster, const Profile& profile, unsigned jobs,
                                  PredictionCache* cache = nullptr);

}  // namespace mk
