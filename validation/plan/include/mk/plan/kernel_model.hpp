// mkernel — the planner's compute model per kernel class and GPU, fitted on our own kernel records (issue 32 item 3;
// docs/planner.md, "Compute").
//
//   t = c0 + flops / R + bytes / B          (the loss: t = c0 + rows / r + bytes / B)
//
// per (GPU model, class, variant, dtype, pass): the variant is the census's kernel name for the classes whose
// kernels differ (rmsnorm / layernorm, swiglu / gelu, cast-fp8 / amax, permute / unpermute, ...), "" for GEMMs and
// attention; the dtype is the GEMM's (bfloat16, float8_e4m3), "" for the others. c0 (fixed cost: launch, prologue,
// the last wave's tail, a chain of eager kernels), R (sustained rate) and B (effective bandwidth, fitted: not the
// datasheet) are all >= 0 and fitted by weighted least squares on relative error (weights 1 / t^2), exactly, by
// solving every face of the non-negative orthant (three parameters: seven small systems). A term fitted to 0 is
// absent (R or B infinite). The sum, not the max, of the two terms: a kernel is never perfectly overlapped, and the
// sum keeps the fit linear, so each leave-one-shape-out fit is the whole fit's normal equations less one shape's.
//
// Its confidence is the error of predicting each measured shape by the model fitted without it (leave one shape
// out): a kernel of a shape never measured is what the planner prices.
#pragma once

#include <cstddef>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "mk/plan/gemm_model.hpp"
#include "mk/validation/kernel_records.hpp"

namespace mk::plan {

/// What a model is fitted per.
struct KernelKey {
  std::string gpu;  ///< the preset's GPU model ("NVIDIA H100"), from the file's system.gpu
  KernelClass cls = KernelClass::Gemm;
  std::string variant;  ///< the kernel's name for classes with several kernels, "" for gemm and attention
  std::string dtype;    ///< GEMMs only ("bfloat16", "float8_e4m3"); "" otherwise
  std::string pass;     ///< "forward", "backward", "step"; "*" for the fit over every pass (fallback)
  auto tie() const { return std::tie(gpu, cls, variant, dtype, pass); }
  bool operator<(const KernelKey& o) const { return tie() < o.tie(); }
  std::string text() const;  ///< "gemm bfloat16 backward", "norm rmsnorm forward"
};

/// Options of a fit.
struct KernelFitOptions {
  /// GEMMs: the FLOPs term counts whole waves of tiles (waveTileM x waveTileN output tiles, ceil(tiles / sms)
  /// waves of sms tiles each). 0: off. Measured on the H100 records: it does not improve the leave-one-shape-out
  /// error (docs/planner.md), so the planner leaves it off.
  uint32_t waveTileM = 0, waveTileN = 0, sms = 0;
};

/// One fitted model.
struct KernelModel {
  KernelKey key;
  double overheadUs = 0;  ///< c0
  double tflops = 0;      ///< R; 0 = no FLOPs term
  /// The loss (rowTermClass): its FLOPs are a fixed multiple of its bytes, so its second term is a latency per row
  /// (the softmax kernels run one block per row) in rows per microsecond instead of R; 0 = no such term.
  double rowsPerUs = 0;
  double bandwidthGBs = 0;            ///< B; 0 = no bytes term
  double peakTflops = 0, hbmGBs = 0;  ///< the measured GPU's datasheet dense bf16 peak and HBM (to extrapolate)
  KernelFitOptions options;
  std::size_t records = 0, shapes = 0;
  std::vector<std::string> files;
  ErrorStats inSample, leaveOneShapeOut;
  std::vector<double> insampleErrPct, losoErrPct;  ///< signed, one per record
};

/// The errors of a class on one GPU: every record of the class predicted by its (variant, dtype, pass) model.
struct KernelClassErrors {
  std::size_t records = 0, shapes = 0;
  ErrorStats inSample, leaveOneShapeOut;
};

/// The GPU model of the topology presets a file's system.gpu names ("NVIDIA H100 80GB HBM3" -> "NVIDIA H100"):
/// the longest preset GPU name that is the whole string or its prefix before a space; the string itself otherwise.
std::string presetGpuName(const std::string& fileGpu);

/// Fit one model on `records` (all of one key). Throws Error(InvalidArgument) with fewer than 2 distinct shapes.
KernelModel fitKernelModel(const std::vector<KernelRecord>& records, const KernelKey& key,
                           const KernelFitOptions& options = {});

/// Whether a class's second term is a latency per row (tokens) rather than its FLOPs: the loss.
bool rowTermClass(KernelClass cls) noexcept;

/// The model's time of one kernel with `flops` and `bytes` on the GPU it was measured on (m, n, batch: a GEMM's
/// output tiles, used only with the wave option; rows: the tokens of a rowTermClass kernel).
double predictKernelUs(const KernelModel& model, double flops, double bytes, uint64_t m = 0, uint64_t n = 0,
                       uint64_t batch = 1, uint64_t rows = 0);

/// Every model of a set of measurement files, fitted once.
class KernelModels {
 public:
  /// Read (and check: kernelRecords throws naming the file, record and field) every kernel record of `files`,
  /// then fit every key with at least 2 shapes.
  static KernelModels fit(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                          const KernelFitOptions& options = {});

  /// How a census kernel is priced: the model of its GPU, else of another GPU (extrapolated), else none.
  struct Match {
    const KernelModel* model = nullptr;
    bool extrapolated = false;
  };
  Match find(const ComputeOp& op, const std::string& gpu) const;
  /// Whether any record of `cls` exists (on any GPU).
  bool hasClass(KernelClass cls) const;
  /// The class's errors per GPU model.
  std::map<std::string, KernelClassErrors> classErrors(KernelClass cls) const;

  const std::map<KernelKey, KernelModel>& models() const noexcept { return models_; }
  std::size_t records() const noexcept { return records_; }
  const std::vector<std::string>& files() const noexcept { return files_; }

 private:
  std::map<KernelKey, KernelModel> models_;
  std::map<std::pair<std::string, KernelClass>, KernelClassErrors> classErrors_;
  std::size_t records_ = 0;
  std::vector<std::string> files_;
};

/// A census kernel's price and where it comes from.
struct KernelPrice : ComputePrice {
  std::string source;  ///< "kernel-model", "kernel-model: extrapolated", "gemm-model", "roofline: unmeasured"
};

/// Every kernel of the census: the kernel model of `node`'s GPU (source "kernel-model"), else another GPU's scaled
/// by the datasheet peak and HBM ratios ("kernel-model: extrapolated"), else, where no record of the kernel's class
/// exists, the GEMM model for GEMMs and attention ("gemm-model") and the roofline for the others ("roofline:
/// unmeasured").
KernelPrice priceCompute(const GemmModel& gemm, const KernelModels& kernels, const ComputeOp& op, const NodeSpec& node);

}  // namespace mk::plan
