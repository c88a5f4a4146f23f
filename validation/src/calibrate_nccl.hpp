// mkernel — NCCL's host path per op, fitted from our own impl "nccl" records (docs/algorithms-nccl.md).
//
// NCCL's multi-rank cost per op and GPU beyond its one-rank path (nccl.groupGpuUs: plan, kernel launch, stream
// ordering) is not measurable on one GPU. Where mk-calibrate is given our committed impl "nccl" records, it is
// fitted from ONE op's small-size plateau (reduce-scatter, where the host sets the pace), so that the other
// ops' records stay held out of the fit.
#pragma once

#include <cstdint>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/io/measurement.hpp"
#include "mk/validation/calibrate.hpp"

namespace mk {

/// The op whose impl "nccl" records fit nccl.groupGpuUs; the other ops are held out.
inline constexpr const char* kNcclHostFitOp = "reducescatter";
/// Sizes up to which an op's time is the host's path (the modelled GPU side stays below it there).
inline constexpr uint64_t kNcclHostPlateauBytes = 64 * 1024;

/// Kernels one timing thread launched per op in `f` (declared for mk-validate in validate_layered.hpp, defined
/// here so that mk-calibrate's fit reads the same rule).
uint32_t launchesPerOp(const MeasurementFile& f, const std::string& name);

/// Sets nccl.groupGpuUs to the median over the kNcclHostFitOp impl "nccl" records of >= 2 ranks and <=
/// kNcclHostPlateauBytes of time / launchesPerOp, less nccl.hostOpUs, and returns its report line; nullopt (and
/// `nccl` unchanged) without such records. Throws Error(InvalidArgument) when that median is below hostOpUs.
std::optional<ParameterFit> fitNcclGroupGpuUs(const std::vector<MeasurementFile>& files,
                                              const std::vector<std::string>& names, LayeredCosts& nccl);

}  // namespace mk
