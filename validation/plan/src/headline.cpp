// mkernel — the plan in one sentence (headline.hpp).
#include "mk/plan/headline.hpp"

#include <cctype>
#include <cmath>

#include "mk/util/format.hpp"
#include "mk/util/size.hpp"

namespace mk::plan {

StepBand stepBand(const PlanResult& plan, const VariantResult& v, const ScaleResult& s) {
  StepBand b;
  if (!s.feasible || s.layered.stepUs <= 0) return b;
  const auto& classes = plan.confidence.classes();
  double all = 0, measured = 0, weighted = 0;
  for (const auto& [id, us] : s.classUs) {
    all += us;
    const auto it = classes.find(id);
    if (it == classes.end()) continue;
    const ConfidenceClass& c = it->second;
    const auto own = c.errorByGpu.find(v.nodeType.node.gpu);
    const ErrorStats* e = own != c.errorByGpu.end() ? &own->second : c.error ? &*c.error : nullptr;
    if (!e || e->n == 0) continue;
    measured += us;
    weighted += us * e->medianAbsPct;
  }
  b.pct = weighted / s.layered.stepUs;
  b.measuredShare = all > 0 ? measured / all : 0;
  return b;
}

std::string formatBand(const StepBand& b) {
  if (b.measuredShare <= 0) return "not validated";
  return strprintf(b.pct < 10 ? "\u00b1%.1f %%" : "\u00b1%.0f %%", b.pct);
}

Bottleneck bottleneck(const ScaleResult& s) {
  const StepBreakdown& b = s.layered;
  const std::pair<const char*, double> parts[] = {
      {"compute", b.computeUs}, {"TP", b.tp.exposedUs}, {"EP", b.ep.exposedUs}, {"PP", b.pp.exposedUs},
      {"DP", b.dp.exposedUs},   {"CP", b.cp.exposedUs}, {"bubble", b.bubbleUs}};
  Bottleneck out;
  double top = -1;
  for (const auto& [part, us] : parts)
    if (us > top) {
      top = us;
      out.part = part;
    }
  out.share = b.stepUs > 0 ? top / b.stepUs : 0;
  std::string key = out.part;
  for (char& c : key) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  const auto it = s.bounds.find(key);
  if (it != s.bounds.end()) out.why = it->second;
  return out;
}

std::string formatCount(double v) {
  static const char* kUnits[] = {"", "k", "M", "B", "T", "P"};
  if (!std::isfinite(v)) return formatNumber(v);
  int unit = 0;
  double x = std::fabs(v);
  while (x >= 999.95 && unit < 5) {
    x /= 1000;
    ++unit;
  }
  // 4 significant digits at most, trailing zeros dropped: "1T", "455.8k", "1.753M".
  const int decimals = unit == 0 ? 0 : x >= 100 ? 1 : x >= 10 ? 2 : 3;
  std::string s = strprintf("%.*f", decimals, x);
  if (s.find('.') != std::string::npos) {
    while (s.back() == '0') s.pop_back();
    if (s.back() == '.') s.pop_back();
  }
  return (v < 0 ? "-" : "") + s + kUnits[unit];
}

namespace {

std::string seconds(double us) {
  if (us >= 1e9) return strprintf("%.0f s", us * 1e-6);  // %.3g would print 1.23e+03 s
  if (us >= 1e6) return strprintf("%.3g s", us * 1e-6);
  if (us >= 1e3) return strprintf("%.3g ms", us * 1e-3);
  return strprintf("%.3g us", us);
}

}  // namespace

std::string layoutRole(const PlanResult& plan) {
  // mk-plan --search plans the best layout it found at each GPU count: a recommendation, not the workload's own.
  return plan.search ? "recommended" : "planned";
}

std::string formatHeadline(const PlanResult& plan, const VariantResult& v, const ScaleResult& s) {
  const ResolvedLayout& r = s.layout;
  std::string out = plan.inputs.workload.name + " on " + std::to_string(s.gpus) + " x " + v.nodeType.node.gpu + " (" +
                    plan.inputs.cluster + (v.name == "baseline" ? "" : ", " + v.name) + "): layout " +
                    layoutRole(plan) + " tp " + std::to_string(r.tp) + " pp " + std::to_string(r.pp) +
                    (r.virtualStages > 1 ? " (v " + std::to_string(r.virtualStages) + ")" : "") + " dp " +
                    std::to_string(r.dp) + (r.ep > 1 ? " ep " + std::to_string(r.ep) : "") +
                    (r.cp > 1 ? " cp " + std::to_string(r.cp) : "") + ", " + std::to_string(r.microBatches) +
                    " micro-batches; ";
  const StepBand band = stepBand(plan, v, s);
  out += "step " + seconds(s.layered.stepUs) + " " + formatBand(band);
  if (band.measuredShare > 0 && band.measuredShare < 0.995)
    out += strprintf(" (%.0f %% of the step measured)", 100 * band.measuredShare);
  out += ", " + formatCount(s.tokensPerS) + " tokens/s, " + formatCount(s.gpuHours) + " GPU-hours for " +
         formatCount(plan.inputs.tokenBudget) + " tokens; ";
  const Bottleneck bn = bottleneck(s);
  out += "bound by " + bn.part + strprintf(" (%.0f %% of the step", 100 * bn.share) +
         (bn.why.empty() ? "" : ": " + bn.why) + ")";
  bool moe = false, ring = false;
  for (const FusedBlockUse& b : s.fusedBlocks)
    if (b.fused) (b.kind == FusedBlockKind::MoeFfn ? moe : ring) = true;
  const std::string blocks =
      std::string(moe ? ", MoE layers (moe-ffn)" : "") + (ring ? ", attention with its K/V ring (ring-attention)" : "");
  if (s.fusedAvailable && s.fused.stepUs > 0)
    out += "; fusing GEMMs with their TP collectives" + blocks + ": " +
           strprintf("%.2fx", s.layered.stepUs / s.fused.stepUs) + " (modelled, " +
           toString(plan.confidence.forClass("fused").status) + ")";
  else
    out += "; fusing: " + (s.fusedNote.empty() ? plan.fusedStatus : s.fusedNote);
  if (s.memoryCapacity > 0 && s.memory.total() > s.memoryCapacity)
    out += "; does NOT fit: " + formatMemoryOf(s.memory.total(), s.memoryCapacity);
  return out + ".";
}

std::string formatMemoryOf(double bytes, double capacity) {
  // Decimal GB: the capacity is the datasheet's (80 GB for an H100), so both numbers are in its unit.
  return strprintf("%.1f GB of %.4g GB per GPU", bytes * 1e-9, capacity * 1e-9);
}

std::string planHeadline(const PlanResult& plan) {
  if (plan.variants.empty()) return "nothing planned.";
  const VariantResult& v = plan.variants.front();
  for (auto it = v.scales.rbegin(); it != v.scales.rend(); ++it)
    if (it->feasible) return formatHeadline(plan, v, *it);
  return plan.inputs.workload.name + ": no GPU count of the sweep is feasible for this layout (the table says why).";
}

}  // namespace mk::plan
