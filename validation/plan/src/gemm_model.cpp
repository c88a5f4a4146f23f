// mkernel — the planner's GEMM model: fit and price (gemm_model.hpp).
#include "mk/plan/gemm_model.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <tuple>

#include "mk/error.hpp"

namespace mk::plan {

namespace {

double dbl(uint64_t v) { return static_cast<double>(v); }
double flopsOf(const GemmSample& s) { return 2.0 * dbl(s.m) * dbl(s.n) * dbl(s.k); }
/// A, B and C once each, 2 bytes per element (the records are 16-bit in and out).
double bytesOf(const GemmSample& s) { return 2.0 * (dbl(s.m) * dbl(s.k) + dbl(s.k) * dbl(s.n) + dbl(s.m) * dbl(s.n)); }

double core(double flops, double bytes, double tflops, double hbmGBs) {
  return std::max(flops / (tflops * 1e6), bytes / (hbmGBs * 1e3));  // us: TFLOP/s = 1e6 FLOP/us, GB/s = 1e3 B/us
}

struct Fit {
  double tflops = 0, c0 = 0, cost = std::numeric_limits<double>::infinity();
};

/// For a given R the best c0 (>= 0) in closed form, and the cost sum(((c0 + core - t) / t)^2).
Fit evaluate(const std::vector<const GemmSample*>& s, double tflops, double hbmGBs) {
  double num = 0, den = 0;
  for (const GemmSample* x : s) {
    const double w = 1.0 / (x->timeUs * x->timeUs);
    num += w * (x->timeUs - core(flopsOf(*x), bytesOf(*x), tflops, hbmGBs));
    den += w;
  }
  Fit f;
  f.tflops = tflops;
  f.c0 = std::max(0.0, num / den);
  f.cost = 0;
  for (const GemmSample* x : s) {
    const double e = (f.c0 + core(flopsOf(*x), bytesOf(*x), tflops, hbmGBs) - x->timeUs) / x->timeUs;
    f.cost += e * e;
  }
  return f;
}

/// R by a grid over (0.05, 1.2] x peak, then a finer grid around the best point (the cost is piecewise smooth in
/// R, not necessarily unimodal, so no bracketing search).
Fit fit(const std::vector<const GemmSample*>& s, double peak, double hbmGBs) {
  Fit best;
  const int n = 2000;
  for (int i = 1; i <= n; ++i) {
    const Fit f = evaluate(s, peak * 1.2 * i / n, hbmGBs);
    if (f.cost < best.cost) best = f;
  }
  const double step = peak * 1.2 / n;
  for (int i = -200; i <= 200; ++i) {
    const double r = best.tflops + step * i / 100.0;
    if (r <= 0) continue;
    const Fit f = evaluate(s, r, hbmGBs);
    if (f.cost < best.cost) best = f;
  }
  return best;
}

double predict(const Fit& f, const GemmSample& x, double hbmGBs) {
  return f.c0 + core(flopsOf(x), bytesOf(x), f.tflops, hbmGBs);
}

}  // namespace

std::vector<GemmSample> gemmSamples(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                                    const std::string& gpu, const std::string& impl) {
  std::vector<GemmSample> out;
  for (std::size_t f = 0; f < files.size(); ++f) {
    auto it = files[f].system.find("gpu");
    if (it == files[f].system.end() || it->second != "\"" + gpu + "\"") continue;
    for (const MeasurementRecord& r : files[f].records) {
      if (r.op != "gemm" || r.impl != impl || (r.dtype != "bfloat16" && r.dtype != "float16")) continue;
      auto num = [&](const char* key) -> uint64_t {
        auto e = r.extra.find(key);
        if (e == r.extra.end()) return 0;
        try {
          return std::stoull(e->second);
        } catch (...) {
          return 0;
        }
      };
      GemmSample s{num("m"), num("n"), num("k"), r.timeUs, names[f]};
      if (s.m == 0 || s.n == 0 || s.k == 0) continue;  // not a shaped record: nothing to fit
      out.push_back(s);
    }
  }
  return out;
}

std::optional<GemmModel> fitGemmModelFor(const std::vector<MeasurementFile>& files,
                                         const std::vector<std::string>& names, const std::string& want) {
  std::map<std::string, std::vector<GemmSample>> byGpu;
  for (const auto& f : files) {
    auto it = f.system.find("gpu");
    if (it == f.system.end() || it->second.size() < 2) continue;
    const std::string gpu = it->second.substr(1, it->second.size() - 2);
    if (byGpu.count(gpu)) continue;
    auto samples = gemmSamples(files, names, gpu);
    if (!samples.empty()) byGpu[gpu] = std::move(samples);
  }
  std::string gpu;
  if (byGpu.count(want)) {
    gpu = want;
  } else {
    for (const auto& [g, s] : byGpu)
      if (gpu.empty() || s.size() > byGpu[gpu].size()) gpu = g;
  }
  if (gpu.empty()) return std::nullopt;
  const NodeSpec ref = presetNodeOfGpu(gpu);
  return fitGemmModel(byGpu[gpu], gpu, ref.bf16Tflops, ref.hbmGBs);
}

GemmModel fitGemmModel(const std::vector<GemmSample>& samples, const std::string& gpu, double peakTflops,
                       double hbmGBs) {
  std::set<std::tuple<uint64_t, uint64_t, uint64_t>> shapes;
  for (const auto& s : samples) shapes.insert({s.m, s.n, s.k});
  if (shapes.size() < 2)
    throw Error(ErrorCode::InvalidArgument, "the GEMM model needs records of at least 2 shapes on " + gpu + " (got " +
                                                std::to_string(shapes.size()) + ")");
  requirePositive("GPU peak TFLOP/s", peakTflops);
  requirePositive("GPU HBM GB/s", hbmGBs);
  GemmModel m;
  m.gpu = gpu;
  m.peakTflops = peakTflops;
  m.hbmGBs = hbmGBs;
  m.samples = samples;
  m.shapes = shapes.size();
  std::set<std::string> files;
  for (const auto& s : samples) files.insert(s.file);
  m.files.assign(files.begin(), files.end());

  std::vector<const GemmSample*> all;
  for (const auto& s : samples) all.push_back(&s);
  const Fit whole = fit(all, peakTflops, hbmGBs);
  m.tflops = whole.tflops;
  m.overheadUs = whole.c0;
  std::vector<double> err;
  for (const auto& s : samples) err.push_back(errorPct(predict(whole, s, hbmGBs), s.timeUs));
  m.inSample = errorStats(err);

  std::vector<double> loso;
  for (const auto& shape : shapes) {
    std::vector<const GemmSample*> rest;
    for (const auto& s : samples)
      if (std::make_tuple(s.m, s.n, s.k) != shape) rest.push_back(&s);
    const Fit f = fit(rest, peakTflops, hbmGBs);
    for (const auto& s : samples)
      if (std::make_tuple(s.m, s.n, s.k) == shape) loso.push_back(errorPct(predict(f, s, hbmGBs), s.timeUs));
  }
  m.leaveOneShapeOut = errorStats(loso);
  return m;
}

ComputePrice priceKernel(const GemmModel& model, double flops, double bytes, const NodeSpec& node) {
  const double r = model.tflops * node.bf16Tflops / model.peakTflops;
  const double f = flops / (r * 1e6), b = bytes / (node.hbmGBs * 1e3);
  return ComputePrice{model.overheadUs + std::max(f, b), b > f};
}

ComputePrice priceUnmeasured(const GemmModel& model, double bytes, const NodeSpec& node) {
  return ComputePrice{model.overheadUs + bytes / (node.hbmGBs * 1e3), true};
}

const char* computePriceSource(const ComputeOp& op) noexcept {
  return op.kind == ComputeKind::Other ? "roofline: unmeasured" : "gemm-model";
}

GemmModel gemmModelAtRate(const NodeSpec& node, double tflops) {
  requirePositive("profile.gemmTflops", tflops, "pricing GEMMs without GEMM records");
  GemmModel g;
  g.gpu = node.gpu;
  g.peakTflops = node.bf16Tflops;
  g.hbmGBs = node.hbmGBs;
  g.tflops = tflops;
  return g;
}

NodeSpec presetNodeOfGpu(const std::string& gpu) { return presetTopologyOfGpu(gpu).node; }

Topology presetTopologyOfGpu(const std::string& gpu) {
  std::string seen;
  for (const auto& p : topologyPresets()) {
    Topology t = topologyPreset(p);
    if (t.node.gpu == gpu) return t;
    if (seen.find(t.node.gpu) == std::string::npos) seen += (seen.empty() ? "" : ", ") + t.node.gpu;
  }
  throw Error(ErrorCode::NotFound, "no topology preset has GPU '" + gpu + "' (known: " + seen + ")");
}

}  // namespace mk::plan
