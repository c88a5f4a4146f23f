// mkernel — compute beside communication: fit and prices (overlap_model.hpp).
#include "mk/plan/overlap_model.hpp"

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "mk/error.hpp"
#include "mk/plan/kernel_model.hpp"

namespace mk::plan {

namespace {

using Json = nlohmann::json;

struct Sample {
  std::string shape;
  double ctas = 0, slowdown = 1, timeUs = 0, aloneUs = 0;
};

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  const std::size_t n = v.size();
  return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

/// phi of one record: the SMs of GEMM throughput each communication CTA took.
double phiOf(const Sample& s, double sms) { return sms * (1 - 1 / s.slowdown) / s.ctas; }

double predictUs(const Sample& s, double sms, double phi) { return s.aloneUs * sms / (sms - phi * s.ctas); }

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
    std::set<std::string> files;
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
    g.files.insert(name);
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
      g.samples.push_back(s);
    }
  }
  OverlapModel out;
  for (auto& [gpu, g] : byGpu) {
    OverlapFit fit;
    fit.gpu = gpu;
    fit.sms = g.sms;
    fit.records = g.samples.size();
    fit.files.assign(g.files.begin(), g.files.end());
    const double S = g.sms;
    std::vector<double> all;
    std::set<std::string> shapes;
    for (const Sample& s : g.samples) {
      all.push_back(phiOf(s, S));
      shapes.insert(s.shape);
    }
    fit.shapes = shapes.size();
    fit.phi = std::max(0.0, median(all));
    std::vector<double> ins, loso;
    for (const Sample& s : g.samples) {
      ins.push_back(errorPct(predictUs(s, S, fit.phi), s.timeUs));
      if (shapes.size() < 2) continue;
      std::vector<double> rest;
      for (const Sample& o : g.samples)
        if (o.shape != s.shape) rest.push_back(phiOf(o, S));
      loso.push_back(errorPct(predictUs(s, S, std::max(0.0, median(rest))), s.timeUs));
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
  double phi = 1;
  if (use) {
    phi = use->phi;
    s.source = "measured (" + use->gpu + ")";
  } else if (!fits_.empty()) {
    phi = fits_.front().phi;
    s.source = "extrapolated from " + fits_.front().gpu;
  } else {
    s.source = "SM share (no kernel-overlap records)";
  }
  const double S = gpuSms, lost = std::min(phi * commSms, 0.9 * S);
  s.factor = S / (S - lost);
  return s;
}

}  // namespace mk::plan
