// mkernel — the planner's compute model: the time of a GEMM (or a fused attention kernel) from its FLOPs and HBM
// bytes, fitted on our own GEMM measurements (docs/planner.md, "Compute").
//
//   t = c0 + max(flops / R, bytes / B)
//
// B is the GPU's datasheet HBM bandwidth (not fitted), R (the sustained tensor rate) and c0 (a fixed cost per
// kernel: launch, prologue, the last wave's tail) are fitted by weighted least squares on relative error over the
// committed cuBLAS records of validation/data/measured (impl "cublas", op "gemm"). Its confidence is the error of
// predicting each measured shape with the model fitted on all the other shapes (leave one shape out): a GEMM of
// a shape never measured is what the planner prices. On another GPU, R scales with the dense bf16 peak and B is
// that GPU's HBM bandwidth (marked "extrapolated").
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mk/io/measurement.hpp"
#include "mk/topology/topology.hpp"
#include "mk/validation/validate.hpp"
#include "mk/workload/lowering.hpp"

namespace mk::plan {

/// One measured GEMM: C[m x n] = A[m x k] B[k x n] in 16-bit, its median time.
struct GemmSample {
  uint64_t m = 0, n = 0, k = 0;
  double timeUs = 0;
  std::string file;  ///< where it came from
};

/// The fitted model.
struct GemmModel {
  std::string gpu;        ///< GPU model of the records ("NVIDIA H200")
  double peakTflops = 0;  ///< that GPU's dense bf16 peak (datasheet, from the topology presets)
  double hbmGBs = 0;      ///< that GPU's HBM bandwidth (datasheet): B
  double tflops = 0;      ///< R, fitted
  double overheadUs = 0;  ///< c0, fitted (>= 0)
  std::vector<GemmSample> samples;
  std::vector<std::string> files;  ///< measurement files the samples came from
  std::size_t shapes = 0;          ///< distinct (m, n, k)
  ErrorStats inSample;             ///< |error| of the fit on its own samples
  ErrorStats leaveOneShapeOut;     ///< |error| of each shape predicted by the fit on the others: the confidence
};

/// The samples of `files` (names parallel) with op "gemm", impl `impl`, 16-bit dtype and the given GPU in the
/// file's system block. Measured numbers are used as recorded.
std::vector<GemmSample> gemmSamples(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                                    const std::string& gpu, const std::string& impl = "cublas");

/// The GEMM model of `gpu` from its cuBLAS records in `files`, else of the GPU with the most records; nullopt when
/// no file has any.
std::optional<GemmModel> fitGemmModelFor(const std::vector<MeasurementFile>& files,
                                         const std::vector<std::string>& names, const std::string& gpu);

/// Fit R and c0 on `samples` for a GPU with `hbmGBs` and `peakTflops`. Throws Error(InvalidArgument) with fewer
/// than 2 distinct shapes (the leave-one-shape-out error needs a fit without each).
GemmModel fitGemmModel(const std::vector<GemmSample>& samples, const std::string& gpu, double peakTflops,
                       double hbmGBs);

/// The model's prediction for one kernel on `node`'s GPU: R scaled by node.bf16Tflops / peakTflops, B =
/// node.hbmGBs.
struct ComputePrice {
  double us = 0;
  bool memoryBound = false;  ///< the bytes term is larger than the FLOPs term
};
ComputePrice priceKernel(const GemmModel& model, double flops, double bytes, const NodeSpec& node);

/// A kernel of a class no model covers yet (ComputeKind::Other: norms, activations, the loss, the optimizer, ...):
/// the roofline t = c0 + bytes / B with the GEMM model's fixed cost c0 and node.hbmGBs. Marked "unmeasured" in
/// every report (docs/planner.md, "Kernel census").
ComputePrice priceUnmeasured(const GemmModel& model, double bytes, const NodeSpec& node);

/// Where a kernel's price comes from: "gemm-model" (GEMMs, attention) or "roofline: unmeasured".
const char* computePriceSource(const ComputeOp& op) noexcept;

/// Every kernel of the census: GEMMs and attention by the GEMM model, the other classes by priceUnmeasured.
inline ComputePrice priceCompute(const GemmModel& model, const ComputeOp& op, const NodeSpec& node) {
  if (op.kind == ComputeKind::Other) return priceUnmeasured(model, op.bytes, node);
  return priceKernel(model, op.flops, op.bytes, node);
}

/// The GEMM model where no file holds GEMM records (the one rule of the planner and of checkSteps): every GEMM at
/// one rate, `tflops` (the profile's gemmTflops), on `node`'s GPU with its HBM bandwidth, no fixed cost and no
/// samples (so no confidence). Throws Error(InvalidArgument) when tflops is not positive.
GemmModel gemmModelAtRate(const NodeSpec& node, double tflops);

/// The first topology preset with GPU model `gpu`; throws Error(NotFound) naming the GPU when no preset has it.
Topology presetTopologyOfGpu(const std::string& gpu);
/// The dense bf16 peak and HBM bandwidth of GPU model `gpu` from the topology presets (presetTopologyOfGpu's node).
NodeSpec presetNodeOfGpu(const std::string& gpu);

}  // namespace mk::plan
