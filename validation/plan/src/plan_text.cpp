// mkernel — the terminal summary of a plan (plan_output.hpp).
#include <cstdio>
#include <string>

#include "mk/plan/plan_output.hpp"
#include "mk/util/size.hpp"

namespace mk::plan {

namespace {

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

/// "34.1 s", "812 ms": a step time with 3 significant digits.
std::string duration(double us) {
  if (us >= 1e6) return fmt("%.3g s", us * 1e-6);
  if (us >= 1e3) return fmt("%.3g ms", us * 1e-3);
  return fmt("%.3g us", us);
}

std::string pct(double x) { return fmt("%.0f %%", 100 * x); }

std::string mark(Status s) {
  switch (s) {
    case Status::Validated: return "validated";
    case Status::Extrapolated: return "extrapolated*";
    case Status::NotValidated: return "NOT VALIDATED";
    case Status::NotAvailable: return "n/a";
  }
  return "";
}

std::string pad(const std::string& s, std::size_t w, bool right = true) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

}  // namespace

std::string formatPlanText(const PlanResult& plan) {
  const PlanInputs& in = plan.inputs;
  const Workload& w = in.workload;
  const ParallelLayout& l = w.layout;
  std::string out;
  out += "workload: " + w.name + " (" + std::to_string(w.model.layers) + " layers, hidden " +
         std::to_string(w.model.hidden) + ", seq " + std::to_string(w.training.seq) + ", global batch " +
         std::to_string(w.training.globalBatch) + " x micro " + std::to_string(w.training.microBatch) +
         "); layout tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp) + " ep " + std::to_string(l.ep) +
         (l.sp ? " sp" : "") + ", zero " + std::to_string(l.zero) + ", " + toString(l.schedule) + "\n";
  out += "cluster: " + in.cluster + " (" + plan.cluster.node.gpu + ", " + std::to_string(plan.cluster.node.gpus) +
         " GPUs and " + std::to_string(plan.cluster.node.nics) + " NICs per node)\n";
  out += "profile: " + plan.profileNote + "\n";
  const GemmModel& g = *plan.gemm;
  out += "compute: t = " + fmt("%.2f", g.overheadUs) + " us + max(flops / " + fmt("%.0f", g.tflops) +
         " TFLOP/s, bytes / " + fmt("%.0f", g.hbmGBs) + " GB/s) on " + g.gpu + "; " + plan.gemmNote;
  if (g.leaveOneShapeOut.n)
    out += "; leave-one-shape-out |error| median " + fmt("%.1f", g.leaveOneShapeOut.medianAbsPct) + " %, max " +
           fmt("%.1f", g.leaveOneShapeOut.maxAbsPct) + " %";
  out += "\nvalidation of the collectives: " + plan.validationNote + "\n";

  for (const VariantResult& v : plan.variants) {
    out += "\n== " + v.name + "\n";
    out +=
        "   GPUs  nodes  tp  pp    dp   mb        step     compute   exposed tp/ep/pp/dp (ms)       bubble   "
        "tokens/s    MFU  scaling  confidence\n";
    for (const ScaleResult& s : v.scales) {
      if (!s.feasible) {
        out += pad(std::to_string(s.gpus), 7) + "  not feasible: " + s.reason + "\n";
        continue;
      }
      const StepBreakdown& b = s.layered;
      const std::string exposed = fmt("%.1f", b.tp.exposedUs * 1e-3) + "/" + fmt("%.1f", b.ep.exposedUs * 1e-3) + "/" +
                                  fmt("%.1f", b.pp.exposedUs * 1e-3) + "/" + fmt("%.1f", b.dp.exposedUs * 1e-3);
      out += pad(std::to_string(s.gpus), 7) + pad(std::to_string(s.nodes), 7) + pad(std::to_string(s.layout.tp), 4) +
             pad(std::to_string(s.layout.pp), 4) + pad(std::to_string(s.layout.dp), 6) +
             pad(std::to_string(s.layout.microBatches), 5) + pad(duration(b.stepUs), 12) +
             pad(duration(b.computeUs), 12) + pad(exposed, 27) + pad(duration(b.bubbleUs), 13) +
             pad(fmt("%.4g", s.tokensPerS), 11) + pad(pct(s.mfu), 7) + pad(pct(s.scalingEfficiency), 9) + "  " +
             mark(s.status) + (s.hasNoise ? "  goodput " + pct(s.noise.goodput) : "") +
             (s.memoryCapacity > 0 && s.memory.total() > s.memoryCapacity
                  ? "  (does not fit: " + formatBytes(s.memory.total()) + ")"
                  : "") +
             "\n";
    }
  }
  if (plan.variants.size() > 1) {
    out += "\n== what-ifs side by side: step time (tokens/s relative to the baseline)\n   GPUs";
    for (const VariantResult& v : plan.variants) out += "  " + pad(v.name, 22);
    out += "\n";
    const auto& base = plan.variants.front().scales;
    for (std::size_t i = 0; i < base.size(); ++i) {
      out += pad(std::to_string(base[i].gpus), 7);
      for (const VariantResult& v : plan.variants) {
        const ScaleResult& s = v.scales[i];
        std::string cell = "-";
        if (s.feasible && base[i].feasible) {
          const double rel = base[i].layered.stepUs / s.layered.stepUs * (s.hasNoise ? s.noise.goodput : 1.0);
          cell = duration(s.hasNoise ? s.noise.meanStepUs : s.layered.stepUs) + " (" + fmt("%.2fx", rel) + ")";
        }
        out += "  " + pad(cell, 22);
      }
      out += "\n";
    }
  }
  out += "\nfused: " + plan.fusedStatus + "\n";
  out +=
      "confidence: validated = every class of operation making up >= 5 % of the step was measured in this regime;"
      " extrapolated* = measured elsewhere (other GPU model or rank count); NOT VALIDATED = a class nothing "
      "measured (e.g. inter-node collectives)\n";
  return out;
}

}  // namespace mk::plan
