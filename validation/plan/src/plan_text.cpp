// mkernel — the terminal summary of a plan (plan_output.hpp).
#include <cmath>
#include <cstdio>
#include <string>

#include "mk/error.hpp"
#include "mk/plan/headline.hpp"
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
  if (us >= 1e9) return fmt(field, "%.0f s", us * 1e-6);  // %.3g would print 1.23e+03 s
  if (us >= 1e6) return fmt(field, "%.3g s", us * 1e-6);
  if (us >= 1e3) return fmt(field, "%.3g ms", us * 1e-3);
  return fmt(field, "%.3g us", us);
}

std::string pct(const char* field, double x) { return fmt(field, "%.0f %%", 100 * x); }

/// `v` itself, or the internal error fmt() raises for a non-finite number.
double finite(const char* field, double v) {
  (void)fmt(field, "%g", v);
  return v;
}

/// One column of the step's breakdown: the compute, the exposed part of each parallel dimension, the bubble.
struct Part {
  const char* head;
  double (*us)(const StepBreakdown&);
};
const Part kParts[] = {
    {"compute", [](const StepBreakdown& b) { return b.computeUs; }},
    {"TP exp", [](const StepBreakdown& b) { return b.tp.exposedUs; }},
    {"EP exp", [](const StepBreakdown& b) { return b.ep.exposedUs; }},
    {"PP exp", [](const StepBreakdown& b) { return b.pp.exposedUs; }},
    {"DP exp", [](const StepBreakdown& b) { return b.dp.exposedUs; }},
    {"CP exp", [](const StepBreakdown& b) { return b.cp.exposedUs; }},
    {"bubble", [](const StepBreakdown& b) { return b.bubbleUs; }},
};

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
  for (const CommUse& c : s.comm) n += plan.prices.at(c.priceKey).source == PriceSource::ClosedForm ? 1 : 0;
  return n;
}

/// Columns `s` takes on a terminal: a UTF-8 character such as "\u00b1" is one.
std::size_t columns(const std::string& s) {
  std::size_t cols = 0;
  for (unsigned char c : s) cols += (c & 0xC0) != 0x80 ? 1 : 0;
  return cols;
}

/// `s` padded to `w` columns.
std::string pad(const std::string& s, std::size_t w, bool right = true);

/// The fused operators of the critical stage at the largest baseline scale with a fused step: each pair and block
/// with its runs per step and its price, and the blocks kept layered with the reason.
std::string fusedOpsText(const PlanResult& plan) {
  if (plan.variants.empty()) return {};
  const ScaleResult* last = nullptr;
  for (const ScaleResult& s : plan.variants.front().scales)
    if (s.feasible && s.fusedAvailable) last = &s;
  if (!last || (last->fusedOps.empty() && last->fusedBlocks.empty())) return {};
  std::string out = "fused operators of the critical stage at " + std::to_string(last->gpus) + " GPUs (one run):\n";
  for (const FusedUse& f : last->fusedOps)
    out += "  " + pad(toString(f.kind), 26, false) + pad(f.gemm + " + " + f.comm, 40, false) + " x" +
           pad(std::to_string(f.timesPerStep), 5, false) + " " + duration("fused op", f.us) + "  (alone: GEMM " +
           duration("fused GEMM", f.gemmUs) + ", collective " +
           duration("fused collective", plan.prices.at(f.priceKey).us) + ")\n";
  for (const FusedBlockUse& b : last->fusedBlocks) {
    const std::string name = std::string(toString(b.kind)) + (b.mirror ? " (backward)" : "") +
                             (b.pass == Pass::Backward && !b.mirror ? " (recomputed)" : "");
    out += "  " + pad(name, 26, false) +
           pad(std::to_string(b.replaces.size()) + " ops on " + std::to_string(b.ranks) + " ranks", 40, false) + " x" +
           pad(std::to_string(b.timesPerStep), 5, false) + " ";
    if (b.fused)
      out += duration("fused block", b.us) + "  (layered: kernels " + duration("layered kernels", b.layeredComputeUs) +
             ", exchanges " + duration("layered exchanges", b.layeredCommUs) + "; " + b.source + ")\n";
    else
      out += "not fused: " + b.note + "\n";
  }
  return out;
}

std::string pad(const std::string& s, std::size_t w, bool right) {
  const std::size_t cols = columns(s);
  if (cols >= w) return s;
  return right ? std::string(w - cols, ' ') + s : s + std::string(w - cols, ' ');
}

/// `text` broken at spaces into lines of at most `width` columns (a longer word stays whole), the lines after the
/// first indented by `indent`; ends with a newline.
std::string wrap(const std::string& text, std::size_t width, const std::string& indent) {
  std::string out, line;
  std::size_t cols = 0, start = 0;
  while (start < text.size()) {
    std::size_t end = text.find(' ', start);
    if (end == std::string::npos) end = text.size();
    const std::string word = text.substr(start, end - start);
    const std::size_t wcols = columns(word);
    if (!line.empty() && cols + 1 + wcols > width) {
      out += line + "\n";
      line = indent;
      cols = indent.size();
    } else if (!line.empty() && line != indent) {
      line += ' ';
      ++cols;
    }
    line += word;
    cols += wcols;
    start = end + 1;
  }
  return out + line + "\n";
}

}  // namespace

std::string formatPlanText(const PlanResult& plan, bool brief) {
  const PlanInputs& in = plan.inputs;
  const Workload& w = in.workload;
  const ParallelLayout& l = w.layout;
  std::string out = wrap("headline: " + planHeadline(plan), 120, "  ");
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
    // A part's column only where a scale of this variant spends time in it (the table fits 120 columns where the
    // layout leaves parts out).
    std::vector<Part> parts;
    for (const Part& p : kParts) {
      bool used = false;
      for (const ScaleResult& s : v.scales) used = used || (s.feasible && p.us(s.layered) > 0);
      if (used) parts.push_back(p);
    }
    out += "   GPUs nodes tp/pp/dp/ep  mb    step    band tokens/s  MFU scale  " + pad("bound", 12, false) +
           pad("mem/GPU", 9);
    for (const Part& p : parts) out += pad(p.head, 8);
    out += " v/e/n %\n";
    for (const ScaleResult& s : v.scales) {
      if (!s.feasible) {
        out += pad(std::to_string(s.gpus), 7) + "  not feasible: " + s.reason + "\n";
        continue;
      }
      const StepBreakdown& b = s.layered;
      const ResolvedLayout& r = s.layout;
      const StepBand band = stepBand(plan, v, s);
      const Bottleneck bn = bottleneck(s);
      out += pad(std::to_string(s.gpus), 7) + pad(std::to_string(s.nodes), 6) +
             pad(std::to_string(r.tp) + "/" + std::to_string(r.pp) + "/" + std::to_string(r.dp) + "/" +
                     std::to_string(r.ep),
                 12) +
             pad(std::to_string(r.microBatches), 4) + pad(duration("step", b.stepUs), 8) +
             pad(band.measuredShare > 0 ? formatBand(band) : "-", 8) +
             pad(formatCount(finite("tokens/s", s.tokensPerS)), 9) + pad(pct("MFU", s.mfu), 5) +
             pad(pct("scaling", s.scalingEfficiency), 6) + "  " +
             pad(bn.part + " " + pct("bottleneck share", bn.share), 12, false) +
             pad(fmt("memory per GPU", "%.1f GB", s.memory.total() * 1e-9), 9);
      for (const Part& p : parts) out += pad(duration(p.head, p.us(b)), 8);
      out += " " + shares(s) + (band.measuredShare > 0 ? "" : "  NOT VALIDATED") +
             (s.hasNoise ? "  goodput " + pct("goodput", s.noise.goodput) : "") +
             (s.memoryCapacity > 0 && s.memory.total() > s.memoryCapacity
                  ? "  (does not fit: " + formatMemoryOf(s.memory.total(), s.memoryCapacity) + ")"
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
  out += "\nfused: " + plan.fusedStatus;
  // Measured only in a regime of their own (ranks sharing one GPU over loopback TCP): extrapolated, with the error.
  if (plan.fusedStatus == "available" && plan.confidence.forClass("fused").status == Status::Extrapolated) {
    const ConfidenceClass& c = plan.confidence.classes().at("fused");
    out += ", extrapolated: median |error| " + formatNumber(c.error->medianAbsPct, 3) + " % on " +
           std::to_string(c.error->n) + " fused records measured on " + c.regime;
  }
  out += "\n";
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
  if (!brief) out += fusedOpsText(plan);
  out +=
      "band: +- the step's parts weighted by the median |error| of their class of operation (measured classes "
      "only); bound: the step's largest part and its share; mem/GPU in GB (the datasheet's unit); v/e/n % = the "
      "share of the step from classes validated / extrapolated (measured on another GPU model or rank count) / not "
      "validated (nothing measured); NOT VALIDATED: no part of the step was measured (docs/planner.md, \"The "
      "report and its numbers\")\n";
  return out;
}

}  // namespace mk::plan
