// mkernel — how much slower compute runs while a communication kernel runs beside it on the same GPU (issue 34,
// item 4; docs/planner.md, "Overlap").
//
// A collective overlapped with a GEMM (Megatron-LM's userbuffers, NCCL on a second stream) holds c SMs of the S a
// GPU has and moves its bytes through the same HBM. The model:
//
//   slowdown(c) = (1 + f0) S / (S - phi c)
//
// phi is the SMs' worth of GEMM throughput each communication CTA takes (1: the CTA's SM is lost and nothing
// else); f0 the cost of anything running beside the GEMM at all (a persistent GEMM waits for its slowest SM, and an
// SM shared with a communication CTA is slower; HBM and L2 are shared). Both are fitted per GPU model on our own
// records (op "kernel-overlap", validation/tools/overlap_bench.py), with the error of predicting each measured GEMM
// shape from the other shapes' records (leave one shape out). A GPU with no records takes another GPU's fit (said
// so), or phi = 1, f0 = 0 (the SM share) where no GPU has records.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include "mk/io/measurement.hpp"
#include "mk/validation/validate.hpp"

namespace mk::plan {

/// One GPU model's fit.
struct OverlapFit {
  std::string gpu;  ///< the preset's GPU model (presetGpuName of the files' system.gpu)
  uint32_t sms = 0;
  double phi = 1;  ///< SMs of GEMM throughput one communication CTA costs
  double f0 = 0;   ///< the slowdown of anything beside the GEMM, on top of the SMs it holds
  std::size_t records = 0, shapes = 0;
  std::string comm;                ///< the communication kernel the fitted records ran beside (their comm_kernel)
  std::size_t standInRecords = 0;  ///< the copy stand-in's records of this GPU left out (a real kernel's exist)
  ErrorStats inSample, leaveOneShapeOut;  ///< of the GEMM's time beside the communication
  std::vector<std::string> files;
};

/// The slowdown of compute beside a communication kernel, and where it comes from.
struct OverlapSlowdown {
  double factor = 1;   ///< compute time beside the communication / alone (>= 1)
  std::string source;  ///< "measured beside mkernel-resident (NVIDIA H100)", "extrapolated from NVIDIA H100 ...", or
                       ///< "SM share (no kernel-overlap records)"
};

class OverlapModel {
 public:
  /// Fit every GPU model's phi from the "kernel-overlap" records of `files` (other records are ignored). Throws
  /// Error(ParseError) naming the file, the record and the field for a record without m, n, k, comm_ctas,
  /// alone_us or a system.sms, or with values out of range.
  static OverlapModel fit(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names);

  /// Compute beside a communication kernel holding `commSms` SMs on a GPU of `gpuSms` SMs: the GPU's own fit,
  /// else another GPU's phi, else phi = 1. commSms must be below gpuSms (InvalidArgument otherwise).
  OverlapSlowdown slowdown(const std::string& gpu, uint32_t gpuSms, uint32_t commSms) const;

  const std::vector<OverlapFit>& fits() const { return fits_; }

 private:
  std::vector<OverlapFit> fits_;
};

}  // namespace mk::plan
