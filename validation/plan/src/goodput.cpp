// mkernel — goodput under failures (goodput.hpp).
#include "mk/plan/goodput.hpp"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <iterator>
#include <sstream>

#include "mk/error.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"

namespace mk::plan {

namespace {

/// Bounds of the durations and counts: wide enough for any job, narrow enough that no value is infinite.
constexpr double kMaxMtbfH = 1e9, kMaxDurationS = 365.0 * 86400, kMaxCkptBwGBs = 1e9;
constexpr uint32_t kMaxNodes = 1000000;

[[noreturn]] void bad(const std::string& msg) { throw Error(ErrorCode::InvalidArgument, msg); }

double number(const std::string& key, const std::string& text, const char* what) {
  std::size_t used = 0;
  double x = NAN;
  try {
    x = std::stod(text, &used);
  } catch (...) {
    used = 0;
  }
  if (text.empty() || used != text.size() || !std::isfinite(x)) bad(key + " must be " + what + " (got '" + text + "')");
  return x;
}

/// "90s", "1.5h", "20min", "2d", "500ms" in seconds; a bare number or another unit is refused (minutes are "min":
/// "m" could be months).
constexpr std::pair<const char*, double> kDurationUnits[] = {
    {"ms", 1e-3}, {"min", 60}, {"s", 1}, {"h", 3600}, {"d", 86400}};

/// Where the trailing letters of `text` (its unit) begin.
std::size_t unitStart(const std::string& text) {
  std::size_t end = text.size();
  while (end > 0 && std::isalpha(static_cast<unsigned char>(text[end - 1]))) --end;
  return end;
}

bool hasDurationUnit(const std::string& text) {
  const std::string unit = text.substr(unitStart(text));
  return std::any_of(std::begin(kDurationUnits), std::end(kDurationUnits),
                     [&](const auto& u) { return unit == u.first; });
}

double duration(const std::string& key, const std::string& text) {
  const std::size_t end = unitStart(text);
  const std::string unit = text.substr(end);
  for (const auto& [name, scale] : kDurationUnits)
    if (unit == name) return number(key, text.substr(0, end), "a duration with a unit, e.g. 90s, 20min, 1.5h") * scale;
  bad(key + ": unknown unit '" + unit + "' in '" + text + "' (expected a number and one of ms, s, min, h, d)");
}

double positiveDuration(const std::string& key, const std::string& text, double maxS) {
  const double s = duration(key, text);
  if (!(s > 0) || s > maxS)
    bad(key + " must be a duration > 0 and <= " + formatDuration(maxS) + " (got '" + text + "')");
  return s;
}

double nonNegativeDuration(const std::string& key, const std::string& text) {
  const double s = duration(key, text);
  if (s < 0 || s > kMaxDurationS)
    bad(key + " must be a duration >= 0 and <= " + formatDuration(kMaxDurationS) + " (got '" + text + "')");
  return s;
}

uint32_t count(const std::string& key, const std::string& text, uint32_t lo) {
  const double x = number(key, text, "a whole number");
  if (x != std::floor(x) || x < lo || x > kMaxNodes)
    bad(key + " must be a whole number in [" + std::to_string(lo) + ", " + std::to_string(kMaxNodes) + "] (got '" +
        text + "')");
  return static_cast<uint32_t>(x);
}

/// P(K <= n) for K Poisson with mean `mu`, summed in log space (exp(-mu) alone underflows past mu = 745).
double poissonCdf(double mu, int64_t n) {
  if (n < 0) return 0;
  if (mu <= 0) return 1;
  double sum = 0;
  for (int64_t i = 0; i <= n; ++i) {
    const double k = static_cast<double>(i);
    sum += std::exp(-mu + k * std::log(mu) - std::lgamma(k + 1));
  }
  return std::min(1.0, sum);
}

}  // namespace

bool parseFailureKey(FailureSpec& spec, const std::string& key, const std::string& value) {
  if (key == "mtbf") {
    const auto colon = value.find(':');
    const std::string domain = colon == std::string::npos ? "" : value.substr(0, colon);
    std::optional<double>* slot = domain == "gpu"    ? &spec.mtbfGpuH
                                  : domain == "node" ? &spec.mtbfNodeH
                                  : domain == "rack" ? &spec.mtbfRackH
                                                     : nullptr;
    if (!slot) bad("mtbf must be gpu:, node: or rack: and a duration, e.g. mtbf=gpu:50000h (got '" + value + "')");
    if (*slot) bad("mtbf=" + domain + ": is given twice");
    *slot = positiveDuration("mtbf", value.substr(colon + 1), kMaxMtbfH * 3600) / 3600;
  } else if (key == "rack") {
    spec.rackNodes = count(key, value, 1);
  } else if (key == "restart") {
    std::vector<double> parts;
    if (value.back() == ':') bad("restart: empty part in '" + value + "'");
    std::stringstream ss(value);
    std::string part;
    while (std::getline(ss, part, ':')) parts.push_back(nonNegativeDuration(key, part));
    if (parts.size() != 1 && parts.size() != 4)
      bad("restart must be one duration or four, detection:reschedule:reload:warm-up, e.g. 1min:5min:10min:2min "
          "(got '" +
          value + "')");
    double total = 0;
    for (double p : parts) total += p;
    spec.restartS = total;
    if (parts.size() == 4) spec.restartPartsS = parts;
  } else if (key == "checkpoint") {
    // A write time ("90s") or the bytes one GPU writes ("40GiB", replacing the memory model's weights + optimizer).
    if (hasDurationUnit(value)) {
      spec.checkpointWriteS = positiveDuration(key, value, kMaxDurationS);
    } else {
      try {
        spec.checkpointBytesPerGpu = static_cast<double>(parseSize(value));
      } catch (const Error& e) {
        bad("checkpoint must be a write time (90s, 2min) or the bytes per GPU (40GiB): " + e.message());
      }
      if (*spec.checkpointBytesPerGpu <= 0) bad("checkpoint must be more than 0 bytes per GPU (got '" + value + "')");
    }
  } else if (key == "ckptbw") {
    const auto colon = value.find(':');
    const std::string domain = colon == std::string::npos ? "node" : value.substr(0, colon);
    if (domain != "node" && domain != "gpu")
      bad("ckptbw must be [node:|gpu:]GB/s, e.g. ckptbw=node:25 (got '" + value + "')");
    const double gbs = number(key, colon == std::string::npos ? value : value.substr(colon + 1), "GB/s");
    if (!(gbs > 0) || gbs > kMaxCkptBwGBs)
      bad("ckptbw must be in (0, " + formatNumber(kMaxCkptBwGBs) + "] GB/s (got '" + value + "')");
    spec.ckptBwGBs = gbs;
    spec.ckptBwPerGpu = domain == "gpu";
  } else if (key == "ckptinterval") {
    spec.intervalS = positiveDuration(key, value, kMaxDurationS);
  } else if (key == "spares") {
    spec.spares = count(key, value, 0);
  } else if (key == "repair") {
    spec.repairS = positiveDuration(key, value, kMaxDurationS);
  } else {
    return false;
  }
  return true;
}

void checkFailureSpec(const FailureSpec& spec) {
  if (spec.mtbfRackH && !spec.rackNodes)
    bad("mtbf=rack: needs rack=N (nodes per rack): the cluster's topology has no racks");
  if (spec.checkpointWriteS && spec.ckptBwGBs)
    bad("checkpoint=DURATION (the write time) and ckptbw= (the write time from the checkpoint size) exclude each "
        "other");
}

double youngDalyIntervalS(double writeS, double mtbfS) { return std::sqrt(2 * writeS * mtbfS); }

double firstOrderEttr(double writeS, double intervalS, double perFailureS, double mtbfS) {
  return std::clamp(1 - writeS / intervalS - (intervalS / 2 + perFailureS) / mtbfS, 0.0, 1.0);
}

GoodputResult estimateGoodput(const FailureSpec& spec, const FailureScale& job) {
  GoodputResult r;
  const bool anyMtbf = spec.mtbfGpuH || spec.mtbfNodeH || spec.mtbfRackH;
  const double gpuH = anyMtbf ? spec.mtbfGpuH.value_or(0) : kDefaultGpuMtbfH;
  r.racks = spec.rackNodes ? (job.nodes + *spec.rackNodes - 1) / *spec.rackNodes : 0;
  // Failures per hour by what they take down: a GPU's takes its node, a rack's all its nodes.
  const double gpuRate = gpuH > 0 ? job.gpus / gpuH : 0;
  const double nodeRate = spec.mtbfNodeH ? job.nodes / *spec.mtbfNodeH : 0;
  const double rackRate = spec.mtbfRackH ? r.racks / *spec.mtbfRackH : 0;
  r.failuresPerHour = gpuRate + nodeRate + rackRate;
  r.jobMtbfS = 3600 / r.failuresPerHour;
  if (!anyMtbf) r.mtbfSource = "MTBF per GPU " + strprintf("%.0f", gpuH) + " h (" + kDefaultGpuMtbfSource + ")";
  for (const auto& [name, h] : {std::pair<const char*, std::optional<double>>{"GPU", spec.mtbfGpuH},
                                {"node", spec.mtbfNodeH},
                                {"rack", spec.mtbfRackH}})
    if (h)
      r.mtbfSource += (r.mtbfSource.empty() ? "MTBF per " : ", per ") + std::string(name) + " " +
                      strprintf("%.6g", *h) + " h (given)";
  if (spec.mtbfRackH) r.mtbfSource += "; racks of " + std::to_string(*spec.rackNodes) + " nodes";

  std::vector<std::string> unknown;
  r.checkpointBytesPerGpu = spec.checkpointBytesPerGpu.value_or(job.checkpointBytesPerGpu);
  if (spec.checkpointWriteS) {
    r.writeS = *spec.checkpointWriteS;
  } else if (spec.ckptBwGBs) {
    // Every GPU writes its own weights and optimizer state at once; per node they share the node's bandwidth.
    const double bytes = r.checkpointBytesPerGpu * (spec.ckptBwPerGpu ? 1 : job.gpusPerNode);
    r.writeS = bytes / (*spec.ckptBwGBs * 1e9);
  } else {
    unknown.push_back(spec.checkpointBytesPerGpu ? "checkpoint write (a size needs ckptbw=)"
                                                 : "checkpoint write (give ckptbw= or checkpoint=)");
  }
  if (spec.intervalS) {
    r.intervalS = spec.intervalS;
  } else if (r.writeS) {
    r.intervalS = youngDalyIntervalS(*r.writeS, r.jobMtbfS);
    r.youngDaly = true;
  }
  if (spec.restartS)
    r.restartS = spec.restartS;
  else
    unknown.push_back("restart (give restart=)");

  if (!spec.spares) {
    r.waitS = 0;  // a replacement is always there: finding it is part of restart's reschedule
  } else {
    // Nodes under repair form an M/G/inf queue: Poisson with mean (node losses per hour) x repair, whatever the
    // repair time's distribution. A failure that takes k nodes finds spares when at most spares - k are away.
    const double lossPerS = (gpuRate + nodeRate + rackRate * spec.rackNodes.value_or(1)) / 3600;
    const auto missK = [&](double repairS, uint32_t k) {
      return 1 - poissonCdf(lossPerS * repairS, static_cast<int64_t>(*spec.spares) - k);
    };
    if (spec.repairS) {
      const double rackK = spec.rackNodes.value_or(1);
      r.noSpareProbability = r.failuresPerHour > 0 ? ((gpuRate + nodeRate) * missK(*spec.repairS, 1) +
                                                      rackRate * missK(*spec.repairS, static_cast<uint32_t>(rackK))) /
                                                         r.failuresPerHour
                                                   : 0;
      r.waitS = r.noSpareProbability * *spec.repairS;
    } else {
      unknown.push_back("repair time of a node (spares= needs repair=)");
    }
  }

  if (r.intervalS && r.restartS && r.waitS) r.lostPerFailureS = *r.intervalS / 2 + *r.restartS + *r.waitS;
  if (r.writeS && r.intervalS && r.restartS && r.waitS) {
    r.ettr = firstOrderEttr(*r.writeS, *r.intervalS, *r.restartS + *r.waitS, r.jobMtbfS);
    r.goodputTokensPerS = job.tokensPerS * *r.ettr;
    if (*r.goodputTokensPerS > 0) r.trainS = job.tokenBudget / *r.goodputTokensPerS;
    const double share = (*r.lostPerFailureS + *r.writeS) / r.jobMtbfS;
    if (*r.ettr <= 0)
      r.note = "the job fails faster than it makes progress (lost work per failure >= MTBF): no goodput";
    else if (share > 0.1)
      r.note = "interval + restart + write are " + formatNumber(100 * share, 2) +
               " % of the MTBF: the first-order model is optimistic there";
  }
  for (const std::string& u : unknown) r.unknown += (r.unknown.empty() ? "" : "; ") + u;
  return r;
}

std::string formatDuration(std::optional<double> seconds) {
  if (!seconds) return "unknown";
  const double s = *seconds;
  if (s >= 86400) return strprintf("%.3g d", s / 86400);
  if (s >= 3600) return strprintf("%.3g h", s / 3600);
  if (s >= 60) return strprintf("%.3g min", s / 60);
  return strprintf("%.3g s", s);
}

std::string formatGoodputTable(const std::vector<std::pair<uint32_t, const GoodputResult*>>& rows) {
  if (rows.empty()) return "";
  const auto cell = [](const std::string& s, std::size_t w) {
    return "  " + (s.size() >= w ? s : std::string(w - s.size(), ' ') + s);
  };
  std::string out = "goodput under failures (docs/planner.md): " + rows.front().second->mtbfSource + "\n" +
                    "   GPUs  fail/day  job MTBF    ckpt/GPU     write   interval  lost/fail     ETTR  goodput tok/s"
                    "  time to train\n";
  std::string notes;
  for (const auto& [gpus, g] : rows) {
    out += cell(std::to_string(gpus), 5) + cell(strprintf("%.3g", g->failuresPerHour * 24), 8) +
           cell(formatDuration(g->jobMtbfS), 8) + cell(formatBytes(g->checkpointBytesPerGpu), 10) +
           cell(formatDuration(g->writeS), 8) + cell(formatDuration(g->intervalS) + (g->youngDaly ? "*" : ""), 9) +
           cell(formatDuration(g->lostPerFailureS), 9) +
           cell(g->ettr ? strprintf("%.1f %%", 100 * *g->ettr) : "unknown", 7) +
           cell(g->goodputTokensPerS ? strprintf("%.4g", *g->goodputTokensPerS) : "unknown", 13) +
           cell(g->ettr ? (g->trainS ? formatDuration(g->trainS) : "never") : "unknown", 13) + "\n";
    if (!g->unknown.empty() && notes.find(g->unknown) == std::string::npos) notes += "  unknown: " + g->unknown + "\n";
    if (!g->note.empty()) notes += "  " + std::to_string(gpus) + " GPUs: " + g->note + "\n";
  }
  if (rows.front().second->youngDaly) notes += "  *: the Young-Daly interval sqrt(2 x write x job MTBF)\n";
  return out + notes;
}

}  // namespace mk::plan
