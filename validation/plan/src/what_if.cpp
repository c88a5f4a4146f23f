// mkernel — what-if variants and the noise model (what_if.hpp).
#include "mk/plan/what_if.hpp"

#include <algorithm>
#include <cmath>
#include <random>
#include <sstream>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/util/size.hpp"

namespace mk::plan {

namespace {

[[noreturn]] void bad(const std::string& what, const std::string& msg) {
  throw Error(ErrorCode::InvalidArgument, "--what-if '" + what + "': " + msg);
}

double positiveNumber(const std::string& what, const std::string& key, const std::string& v) {
  std::size_t used = 0;
  double x = 0;
  try {
    x = std::stod(v, &used);
  } catch (...) {
    used = 0;
  }
  if (used != v.size() || !std::isfinite(x) || x <= 0) bad(what, key + " must be a positive number (got '" + v + "')");
  return x;
}

/// `v` parsed as positiveNumber() and within [lo, hi]: every what-if value has a bound, so that no variant can
/// turn a step time into inf (stragglers=0.5:1e300 printed "inf s" and wrote null into plan.json).
double boundedNumber(const std::string& what, const std::string& key, const std::string& v, double lo, double hi,
                     const char* unit = "") {
  const double x = positiveNumber(what, key, v);
  if (x < lo || x > hi)
    bad(what, key + " must be in [" + formatNumber(lo) + ", " + formatNumber(hi) + "]" + unit + " (got '" + v + "')");
  return x;
}

uint32_t positiveCount(const std::string& what, const std::string& key, const std::string& v) {
  const double x = positiveNumber(what, key, v);
  if (x != std::floor(x) || x > 1e9) bad(what, key + " must be a positive integer (got '" + v + "')");
  return static_cast<uint32_t>(x);
}

/// A standard normal from two uniforms (Box-Muller): std::normal_distribution's algorithm is the library's, so
/// results would differ between standard libraries; mt19937_64's sequence is fixed by the standard.
double normal(std::mt19937_64& rng) {
  const double u1 = (static_cast<double>(rng() >> 11) + 0.5) * 0x1.0p-53;
  const double u2 = static_cast<double>(rng() >> 11) * 0x1.0p-53;
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

}  // namespace

WhatIf parseWhatIf(const std::string& text) {
  WhatIf w;
  w.name = text;
  if (text.empty()) bad(text, "empty (expected key=value[,key=value...])");
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ',')) {
    const auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0 || eq + 1 == item.size()) bad(text, "'" + item + "' is not key=value");
    const std::string key = item.substr(0, eq), v = item.substr(eq + 1);
    if (key == "nic-bw") {
      if (v.back() == 'x')
        w.nicBwFactor =
            boundedNumber(text, key + " factor", v.substr(0, v.size() - 1), kMinNicBwFactor, kMaxNicBwFactor);
      else
        w.nicBwGBs = boundedNumber(text, key, v, kMinNicBwGBs, kMaxNicBwGBs, " GB/s");
    } else if (key == "nics") {
      w.nics = positiveCount(text, key, v);
    } else if (key == "oversub") {
      w.oversub = boundedNumber(text, key, v, 1, kMaxOversubscription);
    } else if (key == "nodes-per-leaf") {
      w.nodesPerLeaf = positiveCount(text, key, v);
    } else if (key == "nvlink-domain") {
      w.nvlinkDomain = positiveCount(text, key, v);
    } else if (key == "noise") {
      w.noise.sigma = boundedNumber(text, key, v, 0, kMaxNoiseSigma);
    } else if (key == "stragglers") {
      const auto colon = v.find(':');
      if (colon == std::string::npos)
        bad(text, "stragglers must be FRACTION:SLOWDOWN, e.g. 0.01:1.5 (got '" + v + "')");
      w.noise.stragglerFraction = boundedNumber(text, key + " fraction", v.substr(0, colon), 0, 1);
      w.noise.stragglerSlowdown = boundedNumber(text, key + " slowdown", v.substr(colon + 1), 1, kMaxStragglerSlowdown);
    } else if (key == "seed") {
      w.noise.seed = positiveCount(text, key, v);
    } else {
      bool failureKey = false;
      try {
        failureKey = parseFailureKey(w.failures, key, v);
      } catch (const Error& e) {
        bad(text, e.message());
      }
      if (!failureKey)
        bad(text, "unknown key '" + key +
                      "' (expected nic-bw, nics, oversub, nodes-per-leaf, nvlink-domain, noise, stragglers, seed, "
                      "mtbf, rack, restart, checkpoint, ckptbw, ckptinterval, spares, repair)");
    }
  }
  try {
    checkFailureSpec(w.failures);
  } catch (const Error& e) {
    bad(text, e.message());
  }
  return w;
}

void applyWhatIf(const WhatIf& w, Topology& topo, Profile& profile) {
  if (!w.changesCluster()) return;  // the baseline: the cluster as given, checked where it was read
  const Topology before = topo;
  NodeSpec& n = topo.node;
  if (w.nvlinkDomain || w.nics) {
    // A new NIC count or node size has no per-NIC list to keep: the uniform form with the first NIC's rate,
    // latency and transport (the even mapping of nicsOf), and no PCIe switches (docs/planner.md, what-ifs).
    const std::vector<NicSpec> nics = nicsOf(n);
    const double perGpu = n.gpus ? static_cast<double>(nics.size()) / n.gpus : 0;
    if (!nics.empty()) n.nic = NicSpec{nics[0].bwGBs, nics[0].latencyUs, nics[0].transport, {}, {}};
    n.nicList.clear();
    n.pcieSwitches.clear();
    n.nics = static_cast<uint32_t>(nics.size());
    if (w.nvlinkDomain) {
      // Keep the NICs per GPU: a domain of 4 GPUs on a node type with 8 GPUs and 8 NICs gets 4 NICs.
      n.gpus = *w.nvlinkDomain;
      n.nics = n.nics ? std::max<uint32_t>(1, static_cast<uint32_t>(std::lround(perGpu * n.gpus))) : 0;
    }
    if (w.nics) n.nics = *w.nics;
  }
  if (w.nicBwFactor || w.nicBwGBs) {
    auto rate = [&](double gbs) { return w.nicBwGBs ? *w.nicBwGBs : gbs * *w.nicBwFactor; };
    n.nic.bwGBs = rate(n.nic.bwGBs);
    for (NicSpec& nic : n.nicList) nic.bwGBs = rate(nic.bwGBs);
  }
  if (w.oversub) topo.fabric.oversubscription = *w.oversub;
  if (w.nodesPerLeaf) topo.fabric.nodesPerLeaf = *w.nodesPerLeaf;
  try {
    validateTopology(topo);
  } catch (const Error& e) {
    bad(w.name, e.message());
  }
  // The one rule of a profile on another cluster: its fractions of the datasheet, applied to the variant's.
  profile = profileOnCluster(profile, before, topo);
  profile.source += " [what-if " + w.name + "]";
}

NoiseResult applyNoise(const NoiseSpec& spec, uint32_t gpus, double stepUs, double criticalComputeUs, uint32_t steps) {
  NoiseResult r;
  r.steps = steps;
  if (!spec.any() || gpus == 0 || steps == 0) {
    r.meanStepUs = r.maxStepUs = stepUs;
    return r;
  }
  std::mt19937_64 rng(spec.seed * 0x9E3779B97F4A7C15ull + gpus);
  std::vector<double> base(gpus, 1.0);
  if (spec.stragglerFraction > 0 && spec.stragglerSlowdown > 1) {
    const uint32_t k = static_cast<uint32_t>(std::lround(spec.stragglerFraction * gpus));
    std::vector<uint32_t> ids(gpus);
    for (uint32_t i = 0; i < gpus; ++i) ids[i] = i;
    for (uint32_t i = 0; i < k && i < gpus; ++i) {  // the first k of a seeded Fisher-Yates shuffle
      const uint32_t j = i + static_cast<uint32_t>(rng() % (gpus - i));
      std::swap(ids[i], ids[j]);
      base[ids[i]] = spec.stragglerSlowdown;
    }
    r.stragglers = std::min(k, gpus);
  }
  double sum = 0;
  for (uint32_t s = 0; s < steps; ++s) {
    double worst = 1;
    for (uint32_t g = 0; g < gpus; ++g) {
      const double slow = base[g] * (spec.sigma > 0 ? 1 + spec.sigma * std::fabs(normal(rng)) : 1.0);
      worst = std::max(worst, slow);
    }
    const double t = stepUs + (worst - 1) * criticalComputeUs;
    sum += t;
    r.maxStepUs = std::max(r.maxStepUs, t);
  }
  r.meanStepUs = sum / steps;
  r.goodput = stepUs / r.meanStepUs;
  return r;
}

}  // namespace mk::plan
