// mkernel — the planner's kernel models: fit, errors and prices (kernel_model.hpp).
#include "mk/plan/kernel_model.hpp"

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <set>
#include <tuple>

#include "mk/error.hpp"

namespace mk::plan {

namespace {

using Vec = std::array<double, 3>;
using Mat = std::array<Vec, 3>;

/// The normal equations of sum((x . p - t) / t)^2 over some records: A = sum(u u^T), b = sum(u), c = count, with
/// u = x / t. Sums, so that one shape's records can be taken out for its leave-one-shape-out fit.
struct Normal {
  Mat a{};
  Vec b{};
  double c = 0;
  void add(const Vec& u, double sign = 1) {
    for (int i = 0; i < 3; ++i) {
      b[i] += sign * u[i];
      for (int j = 0; j < 3; ++j) a[i][j] += sign * u[i] * u[j];
    }
    c += sign;
  }
  Normal minus(const Normal& o) const {
    Normal r = *this;
    for (int i = 0; i < 3; ++i) {
      r.b[i] -= o.b[i];
      for (int j = 0; j < 3; ++j) r.a[i][j] -= o.a[i][j];
    }
    r.c -= o.c;
    return r;
  }
};

double flopsFor(const KernelFitOptions& o, double flops, uint64_t m, uint64_t n, uint64_t batch) {
  if (o.waveTileM == 0 || o.waveTileN == 0 || o.sms == 0 || m == 0 || n == 0) return flops;
  const double tiles = std::ceil(static_cast<double>(m) / o.waveTileM) *
                       std::ceil(static_cast<double>(n) / o.waveTileN) * static_cast<double>(batch);
  const double waves = std::ceil(tiles / o.sms);
  // The FLOPs of whole waves: every SM busy for as long as the last wave runs.
  return flops * waves * o.sms / tiles;
}

/// Features in microseconds at unit rates: 1, flops at 1 TFLOP/s (1e6 FLOP/us) or rows at 1 row/us (the loss),
/// bytes at 1 GB/s (1e3 B/us).
Vec features(const KernelFitOptions& o, const KernelRecord& r) {
  const double second =
      rowTermClass(r.cls) ? static_cast<double>(r.tokens) : flopsFor(o, r.flops, r.m, r.n, r.batch) / 1e6;
  return {1.0, second, r.bytes / 1e3};
}

/// min sum((x . p - t) / t)^2 over p >= 0: the unconstrained optimum of every face of the orthant (a subset of
/// free parameters, the others 0) that lands inside it; the cheapest of those is the constrained optimum (the
/// problem is convex, and its optimum is the unconstrained optimum of the face its support spans).
Vec solveNonNegative(const Normal& s) {
  Vec best{0, 0, 0};
  double bestCost = std::numeric_limits<double>::infinity();
  for (int mask = 1; mask < 8; ++mask) {
    int idx[3], n = 0;
    for (int i = 0; i < 3; ++i)
      if (mask >> i & 1) idx[n++] = i;
    double m[3][4];
    double scale = 0;
    for (int i = 0; i < n; ++i) {
      for (int j = 0; j < n; ++j) m[i][j] = s.a[idx[i]][idx[j]];
      m[i][n] = s.b[idx[i]];
      scale = std::max(scale, std::abs(m[i][i]));
    }
    bool singular = scale == 0;
    for (int c = 0; c < n && !singular; ++c) {
      int p = c;
      for (int r = c + 1; r < n; ++r)
        if (std::abs(m[r][c]) > std::abs(m[p][c])) p = r;
      if (std::abs(m[p][c]) < 1e-12 * scale) {
        singular = true;
        break;
      }
      for (int j = 0; j <= n; ++j) std::swap(m[c][j], m[p][j]);
      for (int r = 0; r < n; ++r) {
        if (r == c) continue;
        const double f = m[r][c] / m[c][c];
        for (int j = c; j <= n; ++j) m[r][j] -= f * m[c][j];
      }
    }
    if (singular) continue;
    Vec p{0, 0, 0};
    bool inside = true;
    for (int i = 0; i < n; ++i) {
      p[idx[i]] = m[i][n] / m[i][i];
      inside = inside && p[idx[i]] >= 0;
    }
    if (!inside) continue;
    double cost = s.c;
    for (int i = 0; i < 3; ++i) {
      cost -= 2 * s.b[i] * p[i];
      for (int j = 0; j < 3; ++j) cost += p[i] * s.a[i][j] * p[j];
    }
    if (cost < bestCost) {
      bestCost = cost;
      best = p;
    }
  }
  return best;
}

double dot(const Vec& p, const Vec& x) { return p[0] * x[0] + p[1] * x[1] + p[2] * x[2]; }

constexpr const char* kFp32Accumulate = "fp32-accumulate";
constexpr const char* kFp8Dtype = "float8_e4m3";

/// GEMMs and attention share one model per dtype and pass, but a GEMM adding into an fp32 output (its epilogue
/// reads and writes 4-byte elements) has its own; the other classes one per kernel, and the loss one per softmax
/// regime (softmaxRowInSharedMemory: a vocabulary row held in shared memory or read from memory each pass).
std::string variantOf(KernelClass cls, const std::string& kernel, bool accumulateFp32, uint64_t vocab,
                      std::size_t elemBytes) {
  if (cls == KernelClass::Gemm) return accumulateFp32 ? kFp32Accumulate : std::string();
  if (cls == KernelClass::Loss)
    return kernel + (softmaxRowInSharedMemory(vocab, elemBytes) ? " row-in-smem" : " row-in-hbm");
  return cls == KernelClass::Attention ? std::string() : kernel;
}

std::size_t elemBytesOf(const std::string& dtype) { return dtype == "float32" ? 4 : dtype == kFp8Dtype ? 1 : 2; }

std::string dtypeOf(KernelClass cls, const std::string& dtype) {
  return cls == KernelClass::Gemm ? dtype : std::string();
}

}  // namespace

std::string KernelKey::text() const {
  std::string s = toString(cls);
  if (!variant.empty()) s += " " + variant;
  if (!dtype.empty()) s += " " + dtype;
  return s + " " + (pass == "*" ? std::string("(every pass)") : pass);
}

std::string presetGpuName(const std::string& fileGpu) {
  std::string best;
  for (const auto& p : topologyPresets()) {
    const std::string g = topologyPreset(p).node.gpu;
    const bool match =
        fileGpu == g || (fileGpu.size() > g.size() && fileGpu.compare(0, g.size(), g) == 0 && fileGpu[g.size()] == ' ');
    if (match && g.size() > best.size()) best = g;
  }
  return best.empty() ? fileGpu : best;
}

KernelModel fitKernelModel(const std::vector<KernelRecord>& records, const KernelKey& key,
                           const KernelFitOptions& options) {
  std::map<std::string, Normal> byShape;
  Normal all;
  std::vector<Vec> x;
  for (const KernelRecord& r : records) {
    Vec u = features(options, r);
    x.push_back(u);
    for (double& v : u) v /= r.timeUs;
    byShape[r.shape].add(u);
    all.add(u);
  }
  if (byShape.size() < 2)
    throw Error(ErrorCode::InvalidArgument, "the kernel model of " + key.text() + " on " + key.gpu +
                                                " needs records of at least 2 shapes (got " +
                                                std::to_string(byShape.size()) + ")");
  KernelModel m;
  m.key = key;
  m.options = options;
  m.records = records.size();
  m.shapes = byShape.size();
  std::set<std::string> files;
  for (const KernelRecord& r : records) files.insert(r.file);
  m.files.assign(files.begin(), files.end());
  const Vec p = solveNonNegative(all);
  m.overheadUs = p[0];
  (rowTermClass(key.cls) ? m.rowsPerUs : m.tflops) = p[1] > 0 ? 1 / p[1] : 0;
  m.bandwidthGBs = p[2] > 0 ? 1 / p[2] : 0;
  std::map<std::string, Vec> loso;
  for (const auto& [shape, s] : byShape) loso[shape] = solveNonNegative(all.minus(s));
  for (std::size_t i = 0; i < records.size(); ++i) {
    m.insampleErrPct.push_back(errorPct(dot(p, x[i]), records[i].timeUs));
    m.losoErrPct.push_back(errorPct(dot(loso.at(records[i].shape), x[i]), records[i].timeUs));
  }
  m.inSample = errorStats(m.insampleErrPct);
  m.leaveOneShapeOut = errorStats(m.losoErrPct);
  return m;
}

bool rowTermClass(KernelClass cls) noexcept { return cls == KernelClass::Loss; }

double predictKernelUs(const KernelModel& model, double flops, double bytes, uint64_t m, uint64_t n, uint64_t batch,
                       uint64_t rows) {
  double us = model.overheadUs;
  if (model.tflops > 0) us += flopsFor(model.options, flops, m, n, batch) / (model.tflops * 1e6);
  if (model.rowsPerUs > 0) us += static_cast<double>(rows) / model.rowsPerUs;
  if (model.bandwidthGBs > 0) us += bytes / (model.bandwidthGBs * 1e3);
  return us;
}

KernelModels KernelModels::fit(const std::vector<MeasurementFile>& files, const std::vector<std::string>& names,
                               const KernelFitOptions& options) {
  KernelModels out;
  std::map<KernelKey, std::vector<KernelRecord>> groups;
  std::map<KernelKey, std::set<std::string>> passes;  // per key without pass: the passes measured
  std::set<std::string> used;
  for (std::size_t f = 0; f < files.size(); ++f) {
    for (KernelRecord& r : kernelRecords(files[f], names[f])) {
      KernelKey k{presetGpuName(r.gpu), r.cls,
                  variantOf(r.cls, r.kernel, r.accumulateFp32, r.vocab, elemBytesOf(r.dtype)), dtypeOf(r.cls, r.dtype),
                  toString(r.pass)};
      KernelKey any = k;
      any.pass = "*";
      passes[any].insert(k.pass);
      groups[any].push_back(r);
      groups[k].push_back(std::move(r));
      used.insert(names[f]);
      ++out.records_;
    }
  }
  out.files_.assign(used.begin(), used.end());
  std::map<std::pair<std::string, KernelClass>, std::vector<double>> ins, loso;
  std::map<std::pair<std::string, KernelClass>, std::set<std::string>> shapes;
  for (const auto& [key, recs] : groups) {
    // The fit over every pass only where several passes were measured: it prices a pass nothing measured (the
    // residual's backward add).
    if (key.pass == "*" && passes[key].size() < 2) continue;
    std::set<std::string> distinct;
    for (const KernelRecord& r : recs) distinct.insert(r.shape);
    if (distinct.size() < 2) continue;  // one shape: no prediction can be judged, so no model
    KernelModel m = fitKernelModel(recs, key, options);
    try {
      const NodeSpec node = presetNodeOfGpu(key.gpu);
      // FP8 GEMM records scale by the fp8 peaks (0 on a GPU without FP8: never extrapolated from).
      m.peakTflops = key.dtype == kFp8Dtype ? node.fp8Tflops : node.bf16Tflops;
      m.hbmGBs = node.hbmGBs;
    } catch (const Error&) {
      // A GPU no preset knows: its models price only plans on that GPU (never extrapolated from).
    }
    if (key.pass != "*") {
      const auto ck = std::make_pair(key.gpu, key.cls);
      ins[ck].insert(ins[ck].end(), m.insampleErrPct.begin(), m.insampleErrPct.end());
      loso[ck].insert(loso[ck].end(), m.losoErrPct.begin(), m.losoErrPct.end());
      for (const std::string& s : distinct) shapes[ck].insert(key.variant + key.dtype + key.pass + s);
    }
    out.models_.emplace(key, std::move(m));
  }
  for (const auto& [ck, e] : loso) {
    KernelClassErrors c;
    c.records = e.size();
    c.shapes = shapes[ck].size();
    c.inSample = errorStats(ins[ck]);
    c.leaveOneShapeOut = errorStats(e);
    out.classErrors_[ck] = c;
  }
  return out;
}

KernelModels::Match KernelModels::find(const ComputeOp& op, const std::string& gpu) const {
  const std::string variant = variantOf(op.cls, op.kernel, op.accumulateFp32, op.vocab, elemBytesOf(dtypeName(op))),
                    dtype = dtypeOf(op.cls, dtypeName(op));
  std::vector<std::string> gpus{gpu};
  for (const auto& [k, m] : models_)
    if (std::find(gpus.begin(), gpus.end(), k.gpu) == gpus.end()) gpus.push_back(k.gpu);
  for (const std::string& g : gpus) {
    KernelKey k{g, op.cls, variant, dtype, toString(op.pass)};
    auto it = models_.find(k);
    if (it == models_.end()) {
      k.pass = "*";
      it = models_.find(k);
    }
    if (it == models_.end()) {  // one pass measured, another used (the residual's backward add): that pass's fit
      for (auto m = models_.begin(); m != models_.end(); ++m)
        if (m->first.gpu == g && m->first.cls == op.cls && m->first.variant == variant && m->first.dtype == dtype) {
          it = m;
          break;
        }
    }
    // Another GPU's model scales by its datasheet: one no preset knows cannot be scaled.
    if (it != models_.end() && (g == gpu || it->second.peakTflops > 0)) return Match{&it->second, g != gpu};
  }
  // An fp32-accumulating GEMM nothing measured (FP8 weight gradients): the plain GEMM model of its dtype, whose
  // bytes term sees the larger output.
  if (op.accumulateFp32) {
    ComputeOp plain = op;
    plain.accumulateFp32 = false;
    return find(plain, gpu);
  }
  return Match{};
}

bool KernelModels::hasClass(KernelClass cls) const {
  for (const auto& [k, m] : models_)
    if (k.cls == cls) return true;
  return false;
}

std::map<std::string, KernelClassErrors> KernelModels::classErrors(KernelClass cls) const {
  std::map<std::string, KernelClassErrors> out;
  for (const auto& [k, e] : classErrors_)
    if (k.second == cls) out[k.first] = e;
  return out;
}

KernelPrice priceCompute(const GemmModel& gemm, const KernelModels& kernels, const ComputeOp& op,
                         const NodeSpec& node) {
  KernelPrice p;
  const KernelModels::Match match = kernels.find(op, node.gpu);
  if (match.model) {
    const KernelModel& m = *match.model;
    // Another GPU's records: its rate scaled by the dense bf16 (FP8 GEMMs: fp8) peaks, its bandwidth by the HBM
    // datasheets.
    const double peak = op.fp8 && op.cls == KernelClass::Gemm ? node.fp8Tflops : node.bf16Tflops;
    const double rScale = match.extrapolated && m.peakTflops > 0 ? peak / m.peakTflops : 1.0;
    const double bScale = match.extrapolated && m.hbmGBs > 0 ? node.hbmGBs / m.hbmGBs : 1.0;
    // The loss's per-row latency scales like a rate (SMs x clock: the bf16 peak ratio).
    const double f =
        (m.tflops > 0 ? flopsFor(m.options, op.flops, op.m, op.n, op.batch) / (m.tflops * rScale * 1e6) : 0.0) +
        (m.rowsPerUs > 0 ? static_cast<double>(op.tokens) / (m.rowsPerUs * rScale) : 0.0);
    const double b = m.bandwidthGBs > 0 ? op.bytes / (m.bandwidthGBs * bScale * 1e3) : 0.0;
    p.us = m.overheadUs + f + b;
    p.memoryBound = b > f;
    p.source = match.extrapolated ? "kernel-model: extrapolated" : "kernel-model";
    return p;
  }
  // No record of this kernel (its class, variant, dtype) on any GPU: the GEMM model or the roofline, and the
  // source says so (plan.json, the census, the unmeasured share).
  // The GEMM model is fitted on bf16 GEMMs: an FP8 GEMM's FLOPs count for bf16 / fp8 of theirs.
  ComputeOp scaled = op;
  if (op.fp8 && op.cls == KernelClass::Gemm && node.fp8Tflops > 0) scaled.flops *= node.bf16Tflops / node.fp8Tflops;
  const ComputePrice c = priceCompute(gemm, scaled, node);
  p.us = c.us;
  p.memoryBound = c.memoryBound;
  p.source = computePriceSource(op);
  return p;
}

}  // namespace mk::plan
