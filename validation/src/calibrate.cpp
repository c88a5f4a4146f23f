#include "mk/validation/calibrate.hpp"

#include "calibrate_nccl.hpp"

#include <Eigen/Dense>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <map>
#include <optional>
#include <set>

#include "mk/error.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"
#include "mk/util/stats.hpp"

namespace mk {
namespace {

[[noreturn]] void reject(const std::string& parameter, const std::string& what) {
  throw Error(ErrorCode::InvalidArgument, "calibration of " + parameter + ": " + what);
}

constexpr const char* kMethodAlphaBeta = "alpha-beta (weighted relative LS)";
constexpr const char* kMethodMedian = "median";
constexpr const char* kMethodDefault = "default (not measured)";

/// A ramp replaces a line that misses some point by more than kLineGoodEnough, and only where it at least halves
/// the worst miss: a line that already follows the points stays (fewer parameters, the same prediction).
constexpr double kLineGoodEnough = 0.02;
bool keepRamp(const RampFit& r, double lineMaxRelResidual) {
  return r.fitted && lineMaxRelResidual > kLineGoodEnough && r.maxRelResidual < 0.5 * lineMaxRelResidual;
}

/// The sizes at which two patterns' per-message difference is read: latency dominates up to here; beyond, the
/// difference drowns in the transfer's own noise.
constexpr double kDifferenceMaxBytes = 64 * 1024;

/// The median of `a` - `b` over the sizes both measured up to kDifferenceMaxBytes (signed: a difference may be
/// negative from noise), with its spread; n = 0 when no size is common.
struct Difference {
  double valueUs = 0, spreadUs = 0, maxRelResidual = 0;
  std::size_t n = 0;
};
Difference medianDifference(const std::vector<CalibPoint>& a, const std::vector<CalibPoint>& b) {
  std::vector<double> diffs;
  for (const CalibPoint& y : b)
    for (const CalibPoint& x : a)
      if (x.x == y.x && y.x <= kDifferenceMaxBytes) diffs.push_back(x.timeUs - y.timeUs);
  Difference d;
  d.n = diffs.size();
  if (diffs.empty()) return d;
  d.valueUs = median(diffs);
  std::vector<double> dev;
  for (double v : diffs) dev.push_back(std::fabs(v - d.valueUs));
  d.spreadUs = median(dev);
  for (double v : dev) d.maxRelResidual = std::max(d.maxRelResidual, d.valueUs != 0 ? v / std::fabs(d.valueUs) : 0.0);
  return d;
}

std::string rampMethod(bool capped) {
  return capped ? "fraction (bytes/bw) / (t - alpha) per size, made non-decreasing, at most 1"
                : "fraction (bytes/bw) / (t - alpha) per size (L2: above 1 at mid sizes)";
}

}  // namespace

bool isCalibrationOp(const std::string& op) noexcept {
  for (const char* k : {kCalibPutNvlink, kCalibPutNetwork, kCalibCopyLocal, kCalibReduce, kCalibFlag, kCalibFlagLocal,
                        kCalibPutStream, kCalibDispatch, kCalibDispatchScratch, kCalibPutNvlinkScratch,
                        kCalibPutNvlinkOneWay, kCalibProxy, kCalibGemm, kCalibAttention})
    if (op == k) return true;
  return false;
}

bool isRecordedOnlyCalibrationOp(const std::string& op) noexcept {
  return op == kCalibPutNetworkOneWay || op == kCalibEmptyOp;
}

AlphaBetaFit fitAlphaBeta(const std::vector<CalibPoint>& points, const std::string& parameter) {
  std::set<double> distinct;
  double xMax = 0;
  for (const auto& p : points) {
    if (!std::isfinite(p.timeUs) || p.timeUs <= 0)
      reject(parameter, "time_us must be finite and > 0 (got " + formatNumber(p.timeUs) + ")");
    if (!std::isfinite(p.x) || p.x < 0)
      reject(parameter, "size must be finite and >= 0 (got " + formatNumber(p.x) + ")");
    distinct.insert(p.x);
    xMax = std::max(xMax, p.x);
  }
  if (distinct.size() < 2)
    reject(parameter, "needs points at >= 2 distinct sizes to separate latency from bandwidth (got " +
                          std::to_string(points.size()) + " points at " + std::to_string(distinct.size()) +
                          " distinct sizes)");
  // Weighted relative least squares: minimise sum(((alpha + x*b) - t) / t)^2, i.e. rows divided by t.
  // Micro-benchmark times span 1 us .. 10 ms; plain least squares would let the largest sizes decide alpha
  // alone (an error of 0.1% at 10 ms outweighs the whole 1 us point), so latency would be unconstrained.
  // Relative residuals give every size the same say, matching the 1% multiplicative noise of timings.
  // Solved by column-pivoting Householder QR of the 2-column weighted design matrix (never the normal
  // equations, which square the condition number); x is scaled to [0, 1] so both columns are O(1/t).
  const auto n = static_cast<Eigen::Index>(points.size());
  Eigen::MatrixXd a(n, 2);
  Eigen::VectorXd rhs = Eigen::VectorXd::Ones(n);
  for (Eigen::Index i = 0; i < n; ++i) {
    const auto& p = points[static_cast<std::size_t>(i)];
    a(i, 0) = 1.0 / p.timeUs;
    a(i, 1) = (p.x / xMax) / p.timeUs;
  }
  const Eigen::Vector2d c = a.colPivHouseholderQr().solve(rhs);
  double alpha = c(0);
  const double slope = c(1) / xMax;  // us per unit of x
  double tMax = 0;
  for (const auto& p : points) tMax = std::max(tMax, p.timeUs);
  // An intercept that is zero up to rounding is zero, not a negative latency.
  if (alpha < 0 && -alpha <= 1e-12 * tMax) alpha = 0;
  if (!std::isfinite(alpha) || alpha < 0)
    reject(parameter, "fitted latency alpha = " + formatNumber(alpha) +
                          " us is negative or not finite (the points do not follow t = alpha + bytes/bw)");
  if (!std::isfinite(slope) || slope <= 0)
    reject(parameter, "fitted bandwidth is not positive and finite (slope " + formatNumber(slope) +
                          " us per byte): the time does not grow with the size");
  AlphaBetaFit f;
  f.alphaUs = alpha;
  f.bwGBs = 1.0 / (slope * 1e3);
  f.n = points.size();
  double sw = 0, swt = 0;
  for (const auto& p : points) {
    const double w = 1.0 / (p.timeUs * p.timeUs);
    sw += w;
    swt += w * p.timeUs;
  }
  const double tBar = swt / sw;
  double ssRes = 0, ssTot = 0;
  for (const auto& p : points) {
    const double r = (alpha + p.x * slope - p.timeUs) / p.timeUs;
    f.residuals.push_back(r);
    f.maxRelResidual = std::max(f.maxRelResidual, std::abs(r));
    ssRes += r * r;
    ssTot += (p.timeUs - tBar) * (p.timeUs - tBar) / (p.timeUs * p.timeUs);
  }
  f.r2 = ssTot > 0 ? 1.0 - ssRes / ssTot : (ssRes == 0 ? 1.0 : 0.0);
  return f;
}

RampFit fitRamp(const std::vector<CalibPoint>& points, const AlphaBetaFit& line, const std::string& parameter,
                bool capped, std::optional<double> alphaUs) {
  constexpr double kLatencyShare = 0.01;    // bytes term below this share of t: the latency regime
  constexpr double kBandwidthShare = 0.80;  // bytes term above this share of t: the bandwidth regime
  constexpr double kMinMovingShare = 0.05;  // t - alpha is taken as at least this share of t
  RampFit out;
  if (!(line.bwGBs > 0)) return out;
  std::vector<CalibPoint> sorted = points;
  std::sort(sorted.begin(), sorted.end(), [](const CalibPoint& a, const CalibPoint& b) { return a.x < b.x; });
  auto bytesUs = [](double x, double bw) { return x / (bw * 1e3); };
  auto inLatencyRegime = [&](const CalibPoint& p) { return bytesUs(p.x, line.bwGBs) / p.timeUs < kLatencyShare; };
  std::vector<double> latency;
  std::vector<CalibPoint> bandwidth;
  std::set<double> distinct;
  for (const CalibPoint& p : sorted) {
    if (inLatencyRegime(p)) latency.push_back(p.timeUs - bytesUs(p.x, line.bwGBs));
    if (bytesUs(p.x, line.bwGBs) / p.timeUs > kBandwidthShare) {
      bandwidth.push_back(p);
      distinct.insert(p.x);
    }
  }
  out.latencyPoints = latency.size();
  out.bandwidthPoints = bandwidth.size();
  if ((!alphaUs && latency.empty()) || distinct.size() < 2) return out;
  const double alpha = alphaUs ? *alphaUs : median(latency);
  double bw = 0;
  try {
    bw = fitAlphaBeta(bandwidth, parameter + " (bandwidth regime)").bwGBs;
  } catch (const Error&) {
    return out;  // the large sizes alone do not make a line (e.g. a negative intercept): keep the plain line
  }
  // The fraction each size above the latency regime reaches; a capped ramp then takes the closest
  // non-decreasing sequence (pool adjacent violators, equal weights): a larger put never reaches less of the link.
  struct Block {
    double sum, n;
    std::size_t first, last;
  };
  std::vector<double> xs;
  std::vector<Block> blocks;
  for (const CalibPoint& p : sorted) {
    if (inLatencyRegime(p)) continue;
    const double moving = std::max(p.timeUs - alpha, kMinMovingShare * p.timeUs);
    const double f = capped ? std::min(1.0, bytesUs(p.x, bw) / moving) : bytesUs(p.x, bw) / moving;
    xs.push_back(p.x);
    blocks.push_back(Block{f, 1, xs.size() - 1, xs.size() - 1});
    while (capped && blocks.size() > 1 &&
           blocks[blocks.size() - 2].sum / blocks[blocks.size() - 2].n > blocks.back().sum / blocks.back().n) {
      const Block last = blocks.back();
      blocks.pop_back();
      blocks.back().sum += last.sum;
      blocks.back().n += last.n;
      blocks.back().last = last.last;
    }
  }
  // Several points of one size (repeated runs): one ramp point per size, their mean (pooled blocks: the block's).
  std::vector<RampPoint> ramp;
  std::vector<double> perSize;
  for (const Block& blk : blocks)
    for (std::size_t i = blk.first; i <= blk.last; ++i) {
      const double f = std::max(blk.sum / blk.n, 1e-6);
      if (!ramp.empty() && ramp.back().bytes == xs[i]) {
        perSize.push_back(f);
        double sum = 0;
        for (double v : perSize) sum += v;
        ramp.back().fraction = sum / static_cast<double>(perSize.size());
        continue;
      }
      perSize.assign(1, f);
      ramp.push_back(RampPoint{xs[i], f});
    }
  out.link = LinkCost{alpha, bw, std::move(ramp)};
  validateRamp(out.link.ramp, parameter + " ramp", capped);
  for (const CalibPoint& p : points) {
    const double model = alpha + p.x / (linkRate(out.link, p.x) * 1e3);
    out.maxRelResidual = std::max(out.maxRelResidual, std::abs(model - p.timeUs) / p.timeUs);
  }
  out.rampPoints = out.link.ramp.size();
  out.fitted = true;
  return out;
}

ConstantFit fitConstant(const std::vector<double>& timesUs, const std::string& parameter) {
  if (timesUs.empty()) reject(parameter, "needs at least 1 point (got 0)");
  for (double t : timesUs)
    if (!std::isfinite(t) || t <= 0) reject(parameter, "time_us must be finite and > 0 (got " + formatNumber(t) + ")");
  // The median, not the mean: one preempted or cold iteration must not move a latency constant.
  ConstantFit f;
  f.n = timesUs.size();
  f.valueUs = median(timesUs);
  std::vector<double> dev;
  for (double t : timesUs) {
    dev.push_back(std::abs(t - f.valueUs));
    f.maxRelResidual = std::max(f.maxRelResidual, std::abs(t - f.valueUs) / f.valueUs);
  }
  f.spreadUs = median(dev);
  return f;
}

std::vector<std::string> FitReport::defaulted() const {
  std::vector<std::string> out;
  for (const auto& p : parameters)
    if (!p.measured) out.push_back(p.name);
  return out;
}

Profile calibrate(const std::vector<MeasurementFile>& files, const Profile& defaults, FitReport* report,
                  const std::vector<std::string>& fileNames) {
  std::map<std::string, std::vector<CalibPoint>> byOp;
  FitReport rep;
  for (std::size_t fi = 0; fi < files.size(); ++fi) {
    const std::string fname = fi < fileNames.size() ? fileNames[fi] : "file " + std::to_string(fi);
    const auto& recs = files[fi].records;
    for (std::size_t ri = 0; ri < recs.size(); ++ri) {
      const MeasurementRecord& r = recs[ri];
      const std::string where = fname + ": records[" + std::to_string(ri) + "]";
      // Honesty rule: a collective (or baseline) record is what the profile predicts, never what fits it.
      if (r.impl != "mkernel" || r.op.rfind("calib-", 0) != 0 || isRecordedOnlyCalibrationOp(r.op)) {
        ++rep.recordsIgnored;
        continue;
      }
      if (!isCalibrationOp(r.op))
        throw Error(ErrorCode::InvalidArgument,
                    where + ".op: unknown calibration op \"" + r.op +
                        "\" (expected calib-put-nvlink, calib-put-network, calib-copy-local, calib-reduce, "
                        "calib-flag, calib-flag-local, calib-put-stream, calib-dispatch, calib-dispatch-scratch, "
                        "calib-put-nvlink-scratch, calib-put-nvlink-oneway, calib-proxy, calib-gemm or "
                        "calib-attention; "
                        "calib-put-network-oneway and calib-empty-op are recorded only)");
      if (!std::isfinite(r.timeUs) || r.timeUs <= 0)
        throw Error(ErrorCode::InvalidArgument,
                    where + ".time_us: must be finite and > 0 (got " + formatNumber(r.timeUs) + ")");
      CalibPoint p{static_cast<double>(r.bytes), r.timeUs};
      if (r.op == kCalibGemm || r.op == kCalibAttention) {
        auto it = r.extra.find("flops");
        double flops = -1;
        if (it != r.extra.end()) {
          const auto j = nlohmann::json::parse(it->second, nullptr, false);
          if (j.is_number()) flops = j.get<double>();
        }
        if (!std::isfinite(flops) || flops <= 0)
          throw Error(ErrorCode::InvalidArgument, where + ".flops: a " + r.op + " record needs a number > 0 (got " +
                                                      (it == r.extra.end() ? std::string("nothing") : it->second) +
                                                      ")");
        p.x = flops;
      }
      byOp[r.op].push_back(p);
      ++rep.recordsUsed;
    }
  }

  if (rep.recordsUsed == 0)
    throw Error(
        ErrorCode::InvalidArgument,
        "calibration: no calibration records (impl \"mkernel\", op \"calib-*\") in the inputs, nothing to fit (" +
            std::to_string(rep.recordsIgnored) + " other records ignored: collectives are never fitted)");
  Profile out = defaults;
  auto defaultParam = [&](const char* name, const char* unit, double value) {
    rep.parameters.push_back(
        ParameterFit{name, unit, value, false, 0, std::numeric_limits<double>::quiet_NaN(), 0, kMethodDefault});
  };
  // A line, or a ramp over it where the ramp follows the points more closely (fitRamp).
  auto link = [&](const char* op, const char* prefix, LinkCost& lc, bool capped) {
    const std::string a = std::string(prefix) + ".alphaUs", b = std::string(prefix) + ".bwGBs";
    auto it = byOp.find(op);
    if (it == byOp.end()) {
      defaultParam(a.c_str(), "us", lc.alphaUs);
      defaultParam(b.c_str(), "GB/s", lc.bwGBs);
      return;
    }
    const AlphaBetaFit f = fitAlphaBeta(it->second, std::string(prefix) + " (" + op + ")");
    lc = LinkCost{f.alphaUs, f.bwGBs};
    rep.parameters.push_back(ParameterFit{a, "us", f.alphaUs, true, f.n, f.r2, f.maxRelResidual, kMethodAlphaBeta});
    rep.parameters.push_back(ParameterFit{b, "GB/s", f.bwGBs, true, f.n, f.r2, f.maxRelResidual, kMethodAlphaBeta});
    const RampFit r = fitRamp(it->second, f, std::string(prefix) + " (" + op + ")", capped);
    if (!keepRamp(r, f.maxRelResidual)) return;
    lc = r.link;
    rep.parameters.pop_back();
    rep.parameters.pop_back();
    const double nan = std::numeric_limits<double>::quiet_NaN();
    rep.parameters.push_back(ParameterFit{a, "us", lc.alphaUs, true, r.latencyPoints, nan, r.maxRelResidual,
                                          "median of t - bytes/bw where bytes/bw < 1 % of t (ramp fit)"});
    rep.parameters.push_back(ParameterFit{b, "GB/s", lc.bwGBs, true, r.bandwidthPoints, nan, r.maxRelResidual,
                                          "alpha-beta slope where bytes/bw > 80 % of t (ramp fit)"});
    rep.parameters.push_back(ParameterFit{std::string(prefix) + ".ramp", "points", double(r.rampPoints), true,
                                          r.rampPoints, nan, r.maxRelResidual, rampMethod(capped)});
  };
  // Rates (reduce, gemm): fitted with an intercept so launch overhead does not depress the rate; the profile
  // has no field for that intercept (the cost model charges local.alphaUs per reduce, nothing per gemm).
  auto rate = [&](const char* op, const char* name, const char* unit, double scale, double& value) {
    auto it = byOp.find(op);
    if (it == byOp.end()) return defaultParam(name, unit, value);
    const AlphaBetaFit f = fitAlphaBeta(it->second, std::string(name) + " (" + op + ")");
    value = f.bwGBs * scale;
    rep.parameters.push_back(
        ParameterFit{name, unit, value, true, f.n, f.r2, f.maxRelResidual,
                     "rate = alpha-beta slope (intercept " + formatNumber(f.alphaUs) + " us not kept)"});
  };
  auto constant = [&](const char* op, const char* name, double& value) {
    auto it = byOp.find(op);
    if (it == byOp.end()) return defaultParam(name, "us", value);
    std::vector<double> t;
    for (const auto& p : it->second) t.push_back(p.timeUs);
    const ConstantFit f = fitConstant(t, std::string(name) + " (" + op + ")");
    value = f.valueUs;
    rep.parameters.push_back(ParameterFit{name, "us", value, true, f.n, std::numeric_limits<double>::quiet_NaN(),
                                          f.maxRelResidual,
                                          std::string(kMethodMedian) + " (MAD " + formatNumber(f.spreadUs) + " us)"});
  };
  // A put's bytes ramp up with its CTAs (the engine gives a data step one CTA per 32 KiB): NVLink and network
  // puts get a ramp where it fits better than the line. A local copy's mid sizes run from L2, faster than its
  // large-size rate: a ramp (at most 1) cannot say that, so the copy keeps its line.
  link(kCalibPutNvlink, "nvlink", out.nvlink, true);
  link(kCalibPutNetwork, "network", out.network, true);
  link(kCalibCopyLocal, "local", out.local, false);
  rate(kCalibReduce, "reduceGBs", "GB/s", 1.0, out.reduceGBs);
  // The model charges local.alphaUs before a reduce's bytes: its ramp is fitted against that alpha, and kept
  // where it follows the points more closely than the line with that alpha.
  if (auto it = byOp.find(kCalibReduce); it != byOp.end()) {
    const AlphaBetaFit f = fitAlphaBeta(it->second, std::string("reduceGBs (") + kCalibReduce + ")");
    double lineResidual = 0;
    for (const CalibPoint& p : it->second)
      lineResidual = std::max(lineResidual, std::abs(out.local.alphaUs + p.x / (f.bwGBs * 1e3) - p.timeUs) / p.timeUs);
    const RampFit r = fitRamp(it->second, f, std::string("reduceGBs (") + kCalibReduce + ")", false, out.local.alphaUs);
    if (keepRamp(r, lineResidual)) {
      out.reduceGBs = r.link.bwGBs;
      out.reduceRamp = r.link.ramp;
      rep.parameters.pop_back();
      const double nan = std::numeric_limits<double>::quiet_NaN();
      rep.parameters.push_back(ParameterFit{"reduceGBs", "GB/s", out.reduceGBs, true, r.bandwidthPoints, nan,
                                            r.maxRelResidual,
                                            "alpha-beta slope where bytes/bw > 80 % of t (ramp fit, alpha = "
                                            "local.alphaUs)"});
      rep.parameters.push_back(ParameterFit{"reduceRamp", "points", double(r.rampPoints), true, r.rampPoints, nan,
                                            r.maxRelResidual, rampMethod(false)});
    }
  }
  constant(kCalibFlag, "flagUs", out.flagUs);
  constant(kCalibFlagLocal, "localFlagUs", out.localFlagUs);
  // dispatchUs: the intercept of ops whose peers write only scratch when measured (calib-dispatch-scratch),
  // and peerUserUs what ops whose peers touch user buffers pay on top (calib-dispatch, the same pattern into
  // the peers' output). Without the scratch variant, dispatchUs is calib-dispatch and no op pays more.
  if (byOp.count(kCalibDispatchScratch)) {
    constant(kCalibDispatchScratch, "dispatchUs", out.dispatchUs);
    if (byOp.count(kCalibDispatch)) {
      double withPeers = 0;
      constant(kCalibDispatch, "dispatch with peer user buffers", withPeers);
      rep.parameters.pop_back();  // reported below as the difference it is used for
      out.peerUserUs = std::max(0.0, withPeers - out.dispatchUs);
      rep.parameters.push_back(
          ParameterFit{"peerUserUs", "us", out.peerUserUs, true, byOp.at(kCalibDispatch).size(),
                       std::numeric_limits<double>::quiet_NaN(), 0,
                       "median of calib-dispatch (" + formatNumber(withPeers) + " us) - dispatchUs, floored at 0"});
    } else {
      defaultParam("peerUserUs", "us", out.peerUserUs);
    }
  } else {
    constant(kCalibDispatch, "dispatchUs", out.dispatchUs);
    defaultParam("peerUserUs", "us", out.peerUserUs);
  }
  // putIssueUs: the lane's time per streamed Put, the intercept of its alpha-beta fit (what a Put costs the
  // lane before its next step; the rest of nvlink.alphaUs only delays the Put's signal).
  if (auto it = byOp.find(kCalibPutStream); it != byOp.end()) {
    const AlphaBetaFit f = fitAlphaBeta(it->second, std::string("putIssueUs (") + kCalibPutStream + ")");
    out.putIssueUs = f.alphaUs;
    rep.parameters.push_back(
        ParameterFit{"putIssueUs", "us", out.putIssueUs, true, f.n, f.r2, f.maxRelResidual,
                     "alpha-beta intercept (bandwidth " + formatNumber(f.bwGBs) + " GB/s not kept)"});
  } else {
    defaultParam("putIssueUs", "us", out.putIssueUs);
  }
  // waitUs: calib-put-nvlink is a Put then a Wait on one lane, calib-put-stream the same Puts without the Waits:
  // per size, the difference is what each Wait keeps its lane (the peer's Put was visible by then: the one-way
  // time below is shorter than the issue plus this).
  const std::vector<CalibPoint> none;
  auto points = [&](const char* op) -> const std::vector<CalibPoint>& {
    const auto it = byOp.find(op);
    return it == byOp.end() ? none : it->second;
  };
  const Difference wait = medianDifference(points(kCalibPutNvlink), points(kCalibPutStream));
  if (wait.n == 0) {
    defaultParam("waitUs", "us", out.waitUs);
  } else {
    out.waitUs = std::max(0.0, wait.valueUs);
    rep.parameters.push_back(ParameterFit{"waitUs", "us", out.waitUs, true, wait.n,
                                          std::numeric_limits<double>::quiet_NaN(), wait.maxRelResidual,
                                          "median of " + std::string(kCalibPutNvlink) + " - " + kCalibPutStream +
                                              " per size (MAD " + formatNumber(wait.spreadUs) + " us), floored at 0"});
  }
  // userPutUs: what a Put into a peer's user buffer costs more than one into its scratch, per message: the
  // median difference of the two both-ways patterns at the sizes both measured where latency dominates.
  // nvlink.alphaUs then becomes the scratch Put's, so that a Put into user buffers still costs what
  // calib-put-nvlink measured.
  const Difference user = medianDifference(points(kCalibPutNvlink), points(kCalibPutNvlinkScratch));
  if (user.n == 0) {
    defaultParam("userPutUs", "us", out.userPutUs);
  } else {
    // Floored at 0 and kept below alpha: the scratch Put cannot be free.
    out.userPutUs = std::min(std::max(0.0, user.valueUs), 0.9 * out.nvlink.alphaUs);
    out.nvlink.alphaUs -= out.userPutUs;
    for (ParameterFit& pf : rep.parameters)
      if (pf.name == "nvlink.alphaUs") {
        pf.value = out.nvlink.alphaUs;
        pf.method += "; minus userPutUs (a Put into scratch)";
      }
    rep.parameters.push_back(ParameterFit{"userPutUs", "us", out.userPutUs, true, user.n,
                                          std::numeric_limits<double>::quiet_NaN(), user.maxRelResidual,
                                          "median of " + std::string(kCalibPutNvlink) + " - " + kCalibPutNvlinkScratch +
                                              " per size (MAD " + formatNumber(user.spreadUs) + " us), floored at 0"});
  }
  // With waitUs measured, a Put's visibility is no longer the both-ways cycle (that is the issue plus the Wait's
  // lane time): it is the one-way ping-pong's latency regime, the time from a Put's start until the waiting
  // peer moves on (into the peer's output, so less userPutUs for the scratch Put nvlink.alphaUs stands for).
  if (wait.n > 0 && byOp.count(kCalibPutNvlinkOneWay)) {
    std::vector<double> latency;
    for (const CalibPoint& p : byOp.at(kCalibPutNvlinkOneWay)) {
      const double bytesUs = p.x / (linkRate(out.nvlink, p.x) * 1e3);
      if (bytesUs < 0.01 * p.timeUs) latency.push_back(p.timeUs - bytesUs);
    }
    if (!latency.empty()) {
      const ConstantFit f = fitConstant(latency, std::string("nvlink.alphaUs (") + kCalibPutNvlinkOneWay + ")");
      out.nvlink.alphaUs = std::max(0.0, f.valueUs - out.userPutUs);
      for (ParameterFit& pf : rep.parameters)
        if (pf.name == "nvlink.alphaUs") {
          pf.value = out.nvlink.alphaUs;
          pf.n = f.n;
          pf.maxRelResidual = f.maxRelResidual;
          pf.method = "median of " + std::string(kCalibPutNvlinkOneWay) + " - bytes/bw where bytes/bw < 1 % of t (" +
                      formatNumber(f.valueUs) + " us, MAD " + formatNumber(f.spreadUs) +
                      " us): the Put's visibility; minus userPutUs (a Put into scratch)";
        }
    }
  }
  constant(kCalibProxy, "proxyUs", out.proxyUs);
  // calib-put-network times the whole ProxyPut, and the model charges proxyUs + network.alphaUs + bytes / bw for
  // one: with both measured, the network's alpha is the fit's intercept less proxyUs (floored at 0), so the sum
  // stays what was measured and proxyUs is not counted twice.
  if (byOp.count(kCalibPutNetwork) && byOp.count(kCalibProxy)) {
    out.network.alphaUs = std::max(0.0, out.network.alphaUs - out.proxyUs);
    for (ParameterFit& pf : rep.parameters)
      if (pf.name == "network.alphaUs") {
        pf.value = out.network.alphaUs;
        pf.method += "; minus proxyUs (floored at 0)";
      }
  }
  // x = flops: the "bandwidth" is flops per us / 1e3, and TFLOP/s = flops per us / 1e6.
  rate(kCalibGemm, "gemmTflops", "TFLOP/s", 1e-3, out.gemmTflops);
  if (byOp.count(kCalibAttention) || defaults.attentionTflops != defaults.gemmTflops) {
    rate(kCalibAttention, "attentionTflops", "TFLOP/s", 1e-3, out.attentionTflops);
  } else {
    // Not measured: the GEMM rate, fitted or not, as a profile without the field reads (what priced attention
    // before calib-attention existed).
    out.attentionTflops = out.gemmTflops;
    rep.parameters.push_back(ParameterFit{"attentionTflops", "TFLOP/s", out.attentionTflops, false, 0,
                                          std::numeric_limits<double>::quiet_NaN(), 0,
                                          "gemmTflops (no calib-attention records)"});
  }

  // Only where our impl "nccl" records were given (calibrate_nccl.hpp); a micro-benchmark set leaves it unlisted.
  if (auto fit = fitNcclGroupGpuUs(files, fileNames, out.nccl)) rep.parameters.push_back(*fit);

  const auto defaulted = rep.defaulted();
  out.source = "calibrated from " + std::to_string(rep.recordsUsed) + " micro-benchmark records";
  if (!defaulted.empty()) {
    out.source += "; default (not measured): ";
    for (std::size_t i = 0; i < defaulted.size(); ++i) out.source += (i ? ", " : "") + defaulted[i];
  }
  if (report) *report = std::move(rep);
  return out;
}

std::string formatFitReport(const FitReport& report) {
  std::string s = strprintf("%-16s %12s %-8s %5s %9s %13s  %s\n", "parameter", "value", "unit", "n", "R^2",
                            "max rel resid", "source");
  for (const auto& p : report.parameters) {
    const std::string r2 = std::isnan(p.r2) ? "-" : formatNumber(p.r2);
    const std::string resid = p.measured ? formatNumber(p.maxRelResidual) : "-";
    s += strprintf("%-16s %12.6g %-8s %5zu %9s %13s  %s\n", p.name.c_str(), p.value, p.unit.c_str(), p.n, r2.c_str(),
                   resid.c_str(), p.method.c_str());
  }
  s += strprintf("records: %zu calibration records fitted, %zu other records ignored (never fitted)\n",
                 report.recordsUsed, report.recordsIgnored);
  return s;
}

}  // namespace mk
