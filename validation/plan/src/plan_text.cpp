// mkernel — the terminal summary of a plan (plan_output.hpp).
#include <cmath>
#include <cstdio>
#include <string>

#include "mk/error.hpp"
#include "mk/plan/plan_output.hpp"
#include "mk/util/format.hpp"
#include "mk/util/size.hpp"

namespace mk::plan {

namespace {

/// `v` printed with `f`. Every number of the summary passes here: a non-finite one ("inf s") is a model bug the
/// input checks missed, so it is an internal error naming `field`, never a table with "inf" or "nan" in it.
std::string fmt(const char* field, const char* f, double v) {
  if (!std::isfinite(v))
    throw Error(ErrorCode::Internal, std::string("the summary's ") + field + " is " + formatNumber(v) +
                                         ", not a finite number (a bug: please report it with the command line)");
  return strprintf(f, v);
}

/// "34.1 s", "812 ms": a step time with 3 significant digits ("-" for nothing).
std::string duration(const char* field, double us) {
  if (us <= 0) return "-";
  if (us >= 1e6) return fmt(field, "%.3g s", us * 1e-6);
  if (us >= 1e3) return fmt(field, "%.3g ms", us * 1e-3);
  return fmt(field, "%.3g us", us);
}

std::string pct(const char* field, double x) { return fmt(field, "%.0f %%", 100 * x); }

std::string mark(Status s) {
  switch (s) {
    case Status::Validated: return "validated";
    case Status::Extrapolated: return "extrapolated*";
    case Status::NotValidated: return "NOT VALIDATED";
    case Status::NotAvailable: return "n/a";
  }
  return "";
}

/// "36/59/5": the shares of the step (percent) from validated, extrapolated and not validated classes.
std::string shares(const ScaleResult& s) {
  double by[3] = {0, 0, 0}, total = 0;
  for (const auto& [id, us] : s.classUs) {
    const Status st = s.classUse.at(id).status;
    by[st == Status::Validated ? 0 : st == Status::Extrapolated ? 1 : 2] += us;
    total += us;
  }
  if (total <= 0) return "-";
  return fmt("confidence share", "%.0f", 100 * by[0] / total) + "/" +
         fmt("confidence share", "%.0f", 100 * by[1] / total) + "/" +
         fmt("confidence share", "%.0f", 100 * by[2] / total);
}

/// Collectives of the scale's critical stage priced by their closed form instead of simulated (above --sim-budget
/// or their share of --max-memory): their link sharing is not in the step.
/// Whether any kernel of the plan is priced by the GEMM model (no kernel record of its class on any GPU).
bool usesGemmModel(const PlanResult& plan) {
  for (const VariantResult& v : plan.variants)
    for (const ScaleResult& s : v.scales)
      for (const ComputeUse& c : s.compute)
        if (c.source == "gemm-model") return true;
  return false;
}

std::size_t closedFormUses(const PlanResult& plan, const ScaleResult& s) {
  std::size_t n = 0;
  for (const CommUse& c : s.comm) n += plan.prices.at(c.priceKey).source == "closed-form" ? 1 : 0;
  return n;
}

std::string pad(const std::string& s, std::size_t w, bool right = true) {
  if (s.size() >= w) return s;
  return right ? std::string(w - s.size(), ' ') + s : s + std::string(w - s.size(), ' ');
}

}  // namespace

std::string formatPlanText(const PlanResult& plan, bool brief) {
  const PlanInputs& in = plan.inputs;
  const Workload& w = in.workload;
  const ParallelLayout& l = w.layout;
  std::string out;
  out += "workload: " + w.name + " (" + std::to_string(w.model.layers) + " layers, hidden " +
         std::to_string(w.model.hidden) + ", seq " + std::to_string(w.training.seq) + ", global batch " +
         std::to_string(w.training.globalBatch) + " x micro " + std::to_string(w.training.microBatch) +
         "); layout tp " + std::to_string(l.tp) + " pp " + std::to_string(l.pp) + " ep " + std::to_string(l.ep) +
         (l.cp > 1 ? " cp " + std::to_string(l.cp) + " (" + toString(l.cpCommType) + ")" : "") + (l.sp ? " sp" : "") +
         ", zero " + std::to_string(l.zero) + ", " + toString(l.schedule) + "\n";
  out += "cluster: " + in.cluster + " (" + plan.cluster.node.gpu + ", " + std::to_string(plan.cluster.node.gpus) +
         " GPUs and " + std::to_string(plan.cluster.node.nics) + " NICs per node)\n";
  out += "profile: " + plan.profileNote + "\n";
  if (!plan.overlapNote.empty()) out += plan.overlapNote + "\n";
  out += "kernels: " + plan.kernelNote;
  if (!plan.kernels.models().empty())
    out += " (t = c0 + flops / R + bytes / B per GPU, class, kernel, dtype and pass; plan.json kernel_models)";
  // The GEMM model prices only what no kernel model covers: shown where a plan uses it.
  const GemmModel& g = *plan.gemm;
  if (usesGemmModel(plan)) {
    out += "\nGEMM model (GEMMs and attention without kernel records): t = " +
           fmt("compute overhead", "%.2f", g.overheadUs) + " us + max(flops / " +
           fmt("compute TFLOP/s", "%.0f", g.tflops) + " TFLOP/s, bytes / " + fmt("compute HBM GB/s", "%.0f", g.hbmGBs) +
           " GB/s) on " + g.gpu + "; " + plan.gemmNote;
    if (g.leaveOneShapeOut.n)
      out += "; leave-one-shape-out |error| median " + fmt("compute error", "%.1f", g.leaveOneShapeOut.medianAbsPct) +
             " %, max " + fmt("compute error", "%.1f", g.leaveOneShapeOut.maxAbsPct) + " %";
  }
  if (plan.steps) {
    out += "\nsteps: " + std::to_string(plan.steps->checks.size()) +
           " measured training steps predicted by this planner (mk-plan --check-steps):";
    for (const auto& [gpu, e] : plan.steps->errorByGpu)
      out += " " + gpu + " n=" + std::to_string(e.n) + " median |error| " + fmt("step error", "%.1f", e.medianAbsPct) +
             " %, max " + fmt("step error", "%.1f", e.maxAbsPct) + " %;";
    out.pop_back();
  }
  out += "\nvalidation of the collectives: " + plan.validationNote + "\n";

  bool anyClosedForm = false, anyUnmeasured = false;
  for (const VariantResult& v : plan.variants) {
    if (brief && &v != &plan.variants.front()) break;
    out += "\n== " + v.name + "\n";
    // Context parallelism's column only where a scale runs it (the tables of other layouts read as before).
    bool anyCp = false;
    for (const ScaleResult& s : v.scales) anyCp = anyCp || (s.feasible && s.layout.cp > 1);
    out += std::string("   GPUs nodes  tp/pp/dp/ep   mb      step   compute  TP expos  EP expos  PP expos  DP expos") +
           (anyCp ? "  CP expos" : "") + "    bubble   tokens/s   MFU scaling  confidence (v/e/n %)\n";
    for (const ScaleResult& s : v.scales) {
      if (!s.feasible) {
        out += pad(std::to_string(s.gpus), 7) + "  not feasible: " + s.reason + "\n";
        continue;
      }
      const StepBreakdown& b = s.layered;
      const ResolvedLayout& r = s.layout;
      out += pad(std::to_string(s.gpus), 7) + pad(std::to_string(s.nodes), 6) +
             pad(std::to_string(r.tp) + "/" + std::to_string(r.pp) + "/" + std::to_string(r.dp) + "/" +
                     std::to_string(r.ep),
                 14) +
             pad(std::to_string(r.microBatches), 5) + pad(duration("step", b.stepUs), 10) +
             pad(duration("compute", b.computeUs), 10) + pad(duration("TP exposed", b.tp.exposedUs), 10) +
             pad(duration("EP exposed", b.ep.exposedUs), 10) + pad(duration("PP exposed", b.pp.exposedUs), 10) +
             pad(duration("DP exposed", b.dp.exposedUs), 10) +
             (anyCp ? pad(duration("CP exposed", b.cp.exposedUs), 10) : std::string()) +
             pad(duration("bubble", b.bubbleUs), 10) + pad(fmt("tokens/s", "%.4g", s.tokensPerS), 11) +
             pad(pct("MFU", s.mfu), 6) + pad(pct("scaling", s.scalingEfficiency), 8) + "  " + pad(shares(s), 8, false) +
             " " + mark(s.status) + (s.hasNoise ? "  goodput " + pct("goodput", s.noise.goodput) : "") +
             (s.memoryCapacity > 0 && s.memory.total() > s.memoryCapacity
                  ? "  (does not fit: " + formatBytes(s.memory.total()) + " per GPU)"
                  : "") +
             (closedFormUses(plan, s) ? "  [closed form: " + std::to_string(closedFormUses(plan, s)) + " of " +
                                            std::to_string(s.comm.size()) + " collectives]"
                                      : "") +
             (s.unmeasuredComputeUs > 0
                  ? "  [unmeasured: " + pct("unmeasured share", s.unmeasuredComputeShare) + " of compute]"
                  : "") +
             (s.unpriced.empty() ? "" : "  [UNPRICED: " + std::to_string(s.unpriced.size()) + " kernels]") + "\n";
      anyClosedForm = anyClosedForm || closedFormUses(plan, s) > 0;
      anyUnmeasured = anyUnmeasured || s.unmeasuredComputeUs > 0;
    }
    std::vector<std::pair<uint32_t, const GoodputResult*>> failures;
    for (const ScaleResult& s : v.scales)
      if (s.feasible && s.hasFailures) failures.emplace_back(s.gpus, &s.failures);
    out += formatGoodputTable(failures);
  }
  if (anyClosedForm)
    out +=
        "[closed form: N of M collectives]: N collectives of the step were too large to simulate (--sim-budget, or "
        "their share of --max-memory) and are priced by their closed form, without link sharing; plan.json's "
        "collectives say which and why\n";
  if (plan.steps || !plan.kernels.models().empty()) {
    out +=
        "compute checked (of the critical stage's compute; by whole-step records / kernel records only / "
        "neither):";
    const VariantResult& v = plan.variants.front();
    for (const ScaleResult& s : v.scales)
      if (s.feasible)
        out += " " + std::to_string(s.gpus) + " GPUs " + pct("checked", s.computeByStepRecords) + "/" +
               pct("checked", s.computeByKernelRecords) + "/" + pct("checked", s.computeUnchecked) + ";";
    out.back() = '\n';
  }
  if (anyUnmeasured)
    out +=
        "[unmeasured: X % of compute]: the share of the step's compute time from kernel classes no kernel record "
        "covers, priced by the roofline c0 + bytes / B; plan.json's compute entries say which (source "
        "\"roofline: unmeasured\")\n";
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
          cell = duration("what-if step", s.hasNoise ? s.noise.meanStepUs : s.layered.stepUs) + " (" +
                 fmt("what-if speedup", "%.2fx", rel) + ")";
        }
        out += "  " + pad(cell, 22);
      }
      out += "\n";
    }
  }
  out += "\nfused: " + plan.fusedStatus + "\n";
  if (!plan.variants.empty()) {
    // Layered against fused on the baseline cluster: the fused operators' own model prices every GEMM + TP
    // collective pair they replace (not validated until they run on GPUs).
    bool header = false;
    for (const ScaleResult& s : plan.variants.front().scales) {
      if (!s.feasible || !s.fusedAvailable) continue;
      if (!header) {
        out += "   GPUs   layered     fused  speedup  TP exposed: layered     fused\n";
        header = true;
      }
      out += pad(std::to_string(s.gpus), 7) + pad(duration("layered step", s.layered.stepUs), 10) +
             pad(duration("fused step", s.fused.stepUs), 10) +
             pad(fmt("fused speedup", "%.2fx", s.layered.stepUs / s.fused.stepUs), 9) +
             pad(duration("layered TP exposed", s.layered.tp.exposedUs), 20) +
             pad(duration("fused TP exposed", s.fused.tp.exposedUs), 10) + "\n";
    }
  }
  out +=
      "confidence: v/e/n = the share of the step from classes of operation validated / extrapolated (measured "
      "on another GPU model or rank count) / not validated (nothing measured, e.g. inter-node collectives, "
      "attention); the mark is the worst class making up >= 5 % of the step (docs/planner.md)\n";
  return out;
}

}  // namespace mk::plan
