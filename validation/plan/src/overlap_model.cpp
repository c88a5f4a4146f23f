// mkernel — compute beside communication: fit and prices (overlap_model.hpp).
#include "mk/plan/overlap_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>
#include <utility>

#include "mk/error.hpp"
#include "mk/plan/kernel_model.hpp"

namespace mk::plan {

namespace {

using Json = nlohmann::json;

/// The comm_kernel of the harness's stand-in for a collective (a Triton persistent copy); any other value names a
/// real collective kernel. A record without the field predates it and was taken beside the copy.
constexpr const char* kStandInKernel = "triton-persistent-copy";

struct Sample {
  std::string shape;
  std::string comm;  ///< comm_kernel
  std::string file;  ///< the measurement file's name
  double ctas = 0, slowdown = 1, timeUs = 0, aloneUs = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

double smShare(double sms, double phi, double ctas) { return sms / (sms - phi * ctas); }

double predictUs(const Sample& s, double sms, double phi, double f0) {
  return s.aloneUs * (1 + f0) * smShare(sms, phi, s.ctas);
}

/// (phi, f0) of some samples: phi on a grid of 0.01 in [0, kMaxPhi] (below S / c of every sample), f0 the median
/// excess of the measured slowdowns over the SM share at that phi (>= 0), the pair with the smallest median
/// |error| of the predicted times. A median, not a mean: one GEMM whose waves a few SMs less cut badly (the
/// smallest shape) should not move every other price.
constexpr double kMaxPhi = 4.0;
std::pair<double, double> fitSamples(const std::vector<Sample>& samples, double sms) {
  double maxCtas = 0;
  for (const Sample& s : samples) maxCtas = std::max(maxCtas, s.ctas);
  const double limit = std::min(kMaxPhi, 0.9 * sms / maxCtas);
  std::pair<double, double> best{0, 0};
  double bestErr = std::numeric_limits<double>::infinity();
  std::vector<double> excess, err;
  for (int i = 0; i * 0.01 <= limit; ++i) {
    const double phi = i * 0.01;
    excess.clear();
    for (const Sample& s : samples) excess.push_back(s.slowdown / smShare(sms, phi, s.ctas));
    const double f0 = std::max(0.0, median(excess) - 1);
    err.clear();
    for (const Sample& s : samples) err.push_back(std::abs(errorPct(predictUs(s, sms, phi, f0), s.timeUs)));
    const double e = median(err);
    if (e < bestErr - 1e-12) {
      bestErr = e;
      best = {phi, f0};
    }
  }
  return best;
}

Json field(const MeasurementRecord& r, const char* name) {
  auto e = r.extra.find(name);
  if (e == r.extra.end()) return Json();
  try {
    return Json::parse(e->second);
  } catch (const Json::exception&) {
    return Json();
  }
}

}  // namespace

OverlapModel OverlapModel::fit(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names) {
  struct Group {
    uint32_t sms = 0;
    std::vector<Sample> samples;
  };
  std::map<std::string, Group> byGpu;
  for (std::size_t f = 0; f < files.size(); ++f) {
    const MeasurementFile& file = files[f];
    bool any = false;
    for (const MeasurementRecord& r : file.records) any = any || r.op == "kernel-overlap";
    if (!any) continue;
    const std::string& name = f < names.size() ? names[f] : std::string("<file>");
    std::string gpu;
    uint32_t sms = 0;
    try {
      if (auto it = file.system.find("gpu"); it != file.system.end()) gpu = Json::parse(it->second).get<std::string>();
      if (auto it = file.system.find("sms"); it != file.system.end()) sms = Json::parse(it->second).get<uint32_t>();
    } catch (const Json::exception&) {
    }
    if (gpu.empty() || sms == 0)
      throw Error(ErrorCode::ParseError, name + ": system.gpu and system.sms: needed by its kernel-overlap records");
    Group& g = byGpu[presetGpuName(gpu)];
    if (g.sms != 0 && g.sms != sms)
      throw Error(ErrorCode::ParseError, name + ": system.sms: " + std::to_string(sms) + " where other files of " +
                                             presetGpuName(gpu) + " say " + std::to_string(g.sms));
    g.sms = sms;
    for (std::size_t i = 0; i < file.records.size(); ++i) {
      const MeasurementRecord& r = file.records[i];
      if (r.op != "kernel-overlap") continue;
      const std::string at = name + ": records[" + std::to_string(i) + "].";
      auto num = [&](const char* key) {
        const Json v = field(r, key);
        if (!v.is_number() || !(v.get<double>() > 0))
          throw Error(ErrorCode::ParseError, at + key + ": missing or not a positive number (a kernel-overlap " +
                                                 "record needs m, n, k, comm_ctas, alone_us)");
        return v.get<double>();
      };
      Sample s;
      s.shape = "m=" + std::to_string(static_cast<uint64_t>(num("m"))) +
                " n=" + std::to_string(static_cast<uint64_t>(num("n"))) +
                " k=" + std::to_string(static_cast<uint64_t>(num("k")));
      s.ctas = num("comm_ctas");
      s.aloneUs = num("alone_us");
      s.timeUs = r.timeUs;
      if (!(s.timeUs > 0)) throw Error(ErrorCode::ParseError, at + "time_us: must be > 0");
      if (!(s.ctas < sms))
        throw Error(ErrorCode::ParseError, at + "comm_ctas: " + std::to_string(static_cast<uint64_t>(s.ctas)) +
                                               " is not below the GPU's " + std::to_string(sms) + " SMs");
      s.slowdown = s.timeUs / s.aloneUs;
      s.file = name;
      const Json kernel = field(r, "comm_kernel");
      s.comm = kernel.is_string() ? kernel.get<std::string>() : std::string(kStandInKernel);
      g.samples.push_back(s);
    }
  }
  OverlapModel out;
  for (auto& [gpu, g] : byGpu) {
    OverlapFit fit;
    fit.gpu = gpu;
    fit.sms = g.sms;
    // A real collective kernel's records, where the GPU has any: the stand-in only approximates what it does to
    // the GEMM beside it (SMs held, and HBM moved at the rate a collective moves it).
    const auto real = [](const Sample& s) { return s.comm != kStandInKernel; };
    std::set<std::string> comms;
    if (std::any_of(g.samples.begin(), g.samples.end(), real)) {
      const std::size_t all = g.samples.size();
      g.samples.erase(std::remove_if(g.samples.begin(), g.samples.end(), [&](const Sample& s) { return !real(s); }),
                      g.samples.end());
      fit.standInRecords = all - g.samples.size();
    }
    for (const Sample& s : g.samples) comms.insert(s.comm);
    for (const std::string& c : comms) fit.comm += (fit.comm.empty() ? "" : ", ") + c;
    fit.records = g.samples.size();
    std::set<std::string> fitted;
    for (const Sample& s : g.samples) fitted.insert(s.file);
    fit.files.assign(fitted.begin(), fitted.end());
    const double S = g.sms;
    std::set<std::string> shapes;
    for (const Sample& s : g.samples) shapes.insert(s.shape);
    fit.shapes = shapes.size();
    std::tie(fit.phi, fit.f0) = fitSamples(g.samples, S);
    std::map<std::string, std::pair<double, double>> without;  // the fit without each shape
    if (shapes.size() >= 2)
      for (const std::string& shape : shapes) {
        std::vector<Sample> rest;
        for (const Sample& o : g.samples)
          if (o.shape != shape) rest.push_back(o);
        without[shape] = fitSamples(rest, S);
      }
    std::vector<double> ins, loso;
    for (const Sample& s : g.samples) {
      ins.push_back(errorPct(predictUs(s, S, fit.phi, fit.f0), s.timeUs));
      if (auto it = without.find(s.shape); it != without.end())
        loso.push_back(errorPct(predictUs(s, S, it->second.first, it->second.second), s.timeUs));
    }
    fit.inSample = errorStats(ins);
    fit.leaveOneShapeOut = errorStats(loso);
    out.fits_.push_back(std::move(fit));
  }
  return out;
}

OverlapSlowdown OverlapModel::slowdown(const std::string& gpu, uint32_t gpuSms, uint32_t commSms) const {
  if (gpuSms == 0 || commSms >= gpuSms)
    throw Error(ErrorCode::InvalidArgument, "overlap: a communication kernel of " + std::to_string(commSms) +
                                                " SMs beside compute on a GPU of " + std::to_string(gpuSms) +
                                                " SMs (layout.overlapSms must be below the GPU's SMs)");
  OverlapSlowdown s;
  const OverlapFit* use = nullptr;
  for (const OverlapFit& f : fits_)
    if (f.gpu == gpu) use = &f;
  double phi = 1, f0 = 0;
  if (use) {
    phi = use->phi;
    f0 = use->f0;
    s.source = "measured beside " + use->comm + " (" + use->gpu + ")";
  } else if (!fits_.empty()) {
    phi = fits_.front().phi;
    f0 = fits_.front().f0;
    s.source = "extrapolated from " + fits_.front().gpu + " (beside " + fits_.front().comm + ")";
  } else {
    s.source = "SM share (no kernel-overlap records)";
  }
  const double S = gpuSms, lost = std::min(phi * commSms, 0.9 * S);
  s.factor = (1 + f0) * S / (S - lost);
  return s;
}

}  // namespace mk::plan
