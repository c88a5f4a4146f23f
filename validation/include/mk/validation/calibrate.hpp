// mkernel — fit the hardware profile (mk::Profile) from micro-benchmark measurement records (docs/calibration.md).
//
// Honesty rule: only the calibration records below are fitted. Collective records (allreduce, allgather, ...)
// are what the profile later predicts, so fitting on them would make the validation circular: they are counted
// and ignored.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/io/measurement.hpp"

namespace mk {

/// The calibration record vocabulary: records with "impl":"mkernel" and one of these "op"s. Every record
/// carries `bytes` (payload per message) and `time_us` (median time per message); gemm and attention also "flops".
inline constexpr const char* kCalibPutNvlink = "calib-put-nvlink";    ///< Put to a same-node peer -> nvlink
inline constexpr const char* kCalibPutNetwork = "calib-put-network";  ///< ProxyPut across nodes -> network
inline constexpr const char* kCalibCopyLocal = "calib-copy-local";    ///< Copy inside one GPU -> local
inline constexpr const char* kCalibReduce = "calib-reduce";           ///< Reduce, bytes = output -> reduceGBs
inline constexpr const char* kCalibFlag = "calib-flag";               ///< Signal -> Wait over NVLink -> flagUs
inline constexpr const char* kCalibFlagLocal = "calib-flag-local";  ///< Signal -> Wait, lanes of one GPU -> localFlagUs
/// Streamed Puts to a same-node peer (one signal each, one wait at the end): the lane's time per Put ->
/// putIssueUs (the intercept of its alpha-beta fit; the bandwidth stays calib-put-nvlink's).
inline constexpr const char* kCalibPutStream = "calib-put-stream";
inline constexpr const char* kCalibDispatch = "calib-dispatch";  ///< per-op intercept, puts into peers' output
/// Per-op intercept of the same put pattern writing into the peers' scratch -> dispatchUs; with it,
/// peerUserUs = calib-dispatch - calib-dispatch-scratch (what an op whose peers touch user buffers pays more).
inline constexpr const char* kCalibDispatchScratch = "calib-dispatch-scratch";
inline constexpr const char* kCalibProxy = "calib-proxy";  ///< extra per ProxyPut -> proxyUs
inline constexpr const char* kCalibGemm = "calib-gemm";    ///< bf16 GEMM, needs "flops" -> gemmTflops
/// One bf16 attention-forward call (the engine's attention on all SMs), needs "flops" (4 B Hq D per unmasked
/// query-key pair) -> attentionTflops; its shape extras (batch, q_heads, ..., sms) are read by nobody here.
inline constexpr const char* kCalibAttention = "calib-attention";

/// One-way ping-pong puts (into the peer's output), per message: the time from a Put's start until the waiting
/// peer's lane moves on, with nothing else on either lane. When calib-put-stream gives waitUs too, its latency
/// regime is the Put's visibility: nvlink.alphaUs (less userPutUs). The bytes and the ramp stay calib-put-nvlink's
/// (both directions at once, as every 2-GPU collective uses the link).
inline constexpr const char* kCalibPutNvlinkOneWay = "calib-put-nvlink-oneway";
/// Recorded by `mk-bench calibrate-network` for the report, not fitted: one-way ping-pong ProxyPuts (the network
/// class is fitted from calib-put-network, both directions at once, as the collectives use it).
inline constexpr const char* kCalibPutNetworkOneWay = "calib-put-network-oneway";
/// Both-ways puts into the peers' scratch, per message: with calib-put-nvlink at the same sizes ->
/// userPutUs (the median difference), and nvlink.alphaUs becomes the scratch Put's (their intercepts are
/// calib-dispatch-scratch, recorded separately).
inline constexpr const char* kCalibPutNvlinkScratch = "calib-put-nvlink-scratch";
/// Recorded, not fitted: the per-op time of ops without steps (dispatchUs is fitted from calib-dispatch, the
/// intercept of ops whose ranks interact; docs/calibration.md says why they differ).
inline constexpr const char* kCalibEmptyOp = "calib-empty-op";

/// True for the fitted ops above (the exact spelling; other "calib-" ops, except the recorded-only ones, are
/// an error in calibrate()).
bool isCalibrationOp(const std::string& op) noexcept;
/// True for calibration ops that are recorded but never fitted (kCalibPutNetworkOneWay, kCalibEmptyOp).
bool isRecordedOnlyCalibrationOp(const std::string& op) noexcept;

/// One measured point of a linear fit: x (bytes, or flops for gemm) and the time it took.
struct CalibPoint {
  double x = 0;
  double timeUs = 0;
};

/// Result of fitting t = alphaUs + bytes / (bwGBs * 1e3) (bytes per us = GB/s * 1e3).
struct AlphaBetaFit {
  double alphaUs = 0;
  double bwGBs = 0;
  std::vector<double> residuals;  ///< relative: (model - measured) / measured, in input order
  double r2 = 0;                  ///< weighted R^2 (weights 1/t^2, the same weights the fit minimises)
  double maxRelResidual = 0;      ///< max |residual|
  std::size_t n = 0;              ///< points used
};

/// Weighted relative least squares fit of t = alpha + x / (bw * 1e3). Throws Error(InvalidArgument) naming
/// `parameter` for fewer than 2 distinct x, a non-positive or non-finite time, or a fit whose alpha is
/// negative or whose bandwidth is not positive and finite.
AlphaBetaFit fitAlphaBeta(const std::vector<CalibPoint>& points, const std::string& parameter = "alpha-beta");

/// Result of fitRamp: a latency, the large-size bandwidth and the ramp between (mk::LinkCost's fields).
struct RampFit {
  bool fitted = false;        ///< false: too few points in the latency or the bandwidth regime (keep the line)
  LinkCost link;              ///< alphaUs, bwGBs and ramp
  double maxRelResidual = 0;  ///< max |model - measured| / measured over every point
  std::size_t latencyPoints = 0, bandwidthPoints = 0, rampPoints = 0;
};

/// Fit t = alpha + x / (bw * fraction(x) * 1e3) to the points, given their alpha-beta fit `line`: alpha is
/// `alphaUs` when given, else the median of t - x / line.bw over the latency regime (x / line.bw below 1 % of t);
/// bw the slope of an alpha-beta fit over the bandwidth regime (x / line.bw above 80 % of t; its intercept is
/// not kept); the ramp the fraction (x / bw) / (t - alpha) at every size above the latency regime (t - alpha taken
/// as at least 5 % of t). `capped` (a link): fractions clamped to (0, 1] and made non-decreasing in size by
/// pooling adjacent violators; otherwise (a memory pipe, whose mid sizes run from L2) kept as measured. Needs 2
/// bandwidth points at distinct sizes and, without `alphaUs`, 1 latency point; otherwise `fitted` is false.
/// Why: a straight line cannot follow a put whose CTAs cannot fill the link at mid sizes (it overprices small
/// puts and underprices mid-size ones by up to 20 %), nor a copy that runs from L2 up to tens of MiB.
RampFit fitRamp(const std::vector<CalibPoint>& points, const AlphaBetaFit& line, const std::string& parameter,
                bool capped, std::optional<double> alphaUs = std::nullopt);

/// Result of a constant fit (flag, dispatch, proxy): the median and how far the points stray from it.
struct ConstantFit {
  double valueUs = 0;         ///< median of the times
  double spreadUs = 0;        ///< median absolute deviation from the median
  double maxRelResidual = 0;  ///< max |t - median| / median
  std::size_t n = 0;
};

/// Median of `timesUs`; throws Error(InvalidArgument) naming `parameter` when empty or a time is not > 0 and
/// finite.
ConstantFit fitConstant(const std::vector<double>& timesUs, const std::string& parameter = "constant");

/// One profile parameter in the report.
struct ParameterFit {
  std::string name;           ///< profile JSON name: "nvlink.alphaUs", "reduceGBs", ...
  std::string unit;           ///< "us", "GB/s", "TFLOP/s"
  double value = 0;           ///< what the profile holds
  bool measured = false;      ///< false: the datasheet default was kept
  std::size_t n = 0;          ///< points fitted (0 when not measured)
  double r2 = 0;              ///< weighted R^2 of the linear fit; NaN for constant fits and defaults
  double maxRelResidual = 0;  ///< max relative residual of the fit (0 for defaults)
  std::string method;         ///< "alpha-beta (weighted relative LS)", "median", "default (not measured)"
};

/// What calibrate() did: every parameter of mk::Profile, in declaration order, and the records it looked at.
struct FitReport {
  std::vector<ParameterFit> parameters;
  std::size_t recordsUsed = 0;     ///< calibration records fitted
  std::size_t recordsIgnored = 0;  ///< other records (collectives, baselines): never fitted
  /// Names of the parameters that kept their default (also written into Profile::source).
  std::vector<std::string> defaulted() const;
};

/// Fit every parameter that has calibration records in `files`; the rest keep their value from `defaults`
/// (normally defaultProfile(topologyPreset(cluster))) and are listed as "default (not measured)" in the report
/// and in the returned Profile's `source`. Throws Error(InvalidArgument) naming the parameter (and the file and
/// record for a bad record) when a fit has too few points or gives a negative / non-finite value, a gemm
/// or attention record lacks a positive "flops", or a "calib-" op is not in the vocabulary. Without calib-attention
/// records attentionTflops follows the (fitted) gemmTflops, as a profile without the field does, unless `defaults`
/// gives it a value of its own (a base profile that distinguishes them keeps it).
Profile calibrate(const std::vector<MeasurementFile>& files, const Profile& defaults, FitReport* report = nullptr,
                  const std::vector<std::string>& fileNames = {});

/// The report as a fixed-width table (parameter, value, unit, n, R^2, max rel residual, source), one line per
/// parameter, with a header line and a summary line of records used / ignored.
std::string formatFitReport(const FitReport& report);

}  // namespace mk
