// mkernel — what a priced scale of a plan says about itself (planner_internal.hpp).
#include <algorithm>
#include <map>
#include <set>
#include <string>

#include "mk/plan/step_check.hpp"
#include "mk/util/size.hpp"
#include "planner_internal.hpp"

namespace mk::plan::detail {

namespace {

int severity(Status s) {
  switch (s) {
    case Status::Validated: return 0;
    case Status::Extrapolated: return 1;
    case Status::NotValidated: return 2;
    case Status::NotAvailable: return 3;
  }
  return 2;
}

/// ScaleResult::computeBy*: the critical stage's kernels per step, each counted under the best check of its price.
void checkedCompute(ScaleResult& sr, const PlanResult& out, const Pending& pd) {
  const uint32_t c = sr.layered.criticalStage;
  const StageLowering& st = pd.step.stages[c];
  const std::set<std::string>* covered = nullptr;
  if (out.steps) {
    const auto it = out.steps->kernelsByGpu.find(presetGpuName(pd.cluster.node.gpu));
    if (it != out.steps->kernelsByGpu.end()) covered = &it->second;
  }
  double step = 0, kernel = 0, other = 0;
  for (std::size_t i = 0; i < st.compute.size(); ++i) {
    const ComputeOp& op = st.compute[i];
    const double us = pd.computeUs[c][i] * op.times * (op.pass == Pass::Step ? 1 : sr.layout.microBatches);
    if (covered && covered->count(stepKernelKey(op)))
      step += us;
    else if (pd.computeSource[c][i] == "kernel-model")
      kernel += us;
    else
      other += us;
  }
  const double all = step + kernel + other;
  if (all <= 0) return;
  sr.computeByStepRecords = step / all;
  sr.computeByKernelRecords = kernel / all;
  sr.computeUnchecked = other / all;
}

}  // namespace

/// Which class each part of the step comes from, and the step's resulting status: the worst status among the
/// classes that make up at least 5 % of the step.
void attributeClasses(ScaleResult& sr, const PlanResult& out, const Pending& pd) {
  const std::string gpu = pd.cluster.node.gpu;
  std::map<std::string, UseConfidence>& uses = sr.classUse;
  auto add = [&](const UseConfidence& u, double us) {
    if (us <= 0) return;
    sr.classUs[u.classId] += us;
    auto it = uses.find(u.classId);
    // One class used in several regimes (e.g. 8-rank and 2-rank all-gathers): keep the least trusted.
    if (it == uses.end() || severity(u.status) > severity(it->second.status)) uses[u.classId] = u;
  };
  for (int k = 0; k < kKernelClasses; ++k) {
    const auto cls = static_cast<KernelClass>(k);
    const double us = sr.layered.computeClassUs[k];
    add(out.confidence.forKernelClass(cls, gpu), us);
    // A class no kernel record covers (any GPU): priced by the roofline (GEMMs and attention: the GEMM model).
    if (cls != KernelClass::Gemm && cls != KernelClass::Attention && !out.kernels.hasClass(cls))
      sr.unmeasuredComputeUs += us;
  }
  sr.unmeasuredComputeShare = sr.layered.computeUs > 0 ? sr.unmeasuredComputeUs / sr.layered.computeUs : 0;
  checkedCompute(sr, out, pd);
  add(out.confidence.forClass("model.pipeline"), sr.layered.bubbleUs);
  const PhaseTime* phases[kPhases] = {&sr.layered.tp, &sr.layered.ep, &sr.layered.pp, &sr.layered.dp, &sr.layered.cp};
  for (int ph = 0; ph < kPhases; ++ph) {
    double total = 0;
    for (const CommUse& c : sr.comm)
      if (static_cast<int>(c.phase) == ph) total += out.prices.at(c.priceKey).us * c.timesPerStep;
    if (total <= 0) continue;
    for (const CommUse& c : sr.comm)
      if (static_cast<int>(c.phase) == ph)
        add(c.confidence, phases[ph]->exposedUs * out.prices.at(c.priceKey).us * c.timesPerStep / total);
  }
  int worst = 0;
  std::string notes;
  for (const auto& [id, us] : sr.classUs) {
    if (us < 0.05 * sr.layered.stepUs) continue;
    const UseConfidence& u = uses.at(id);
    worst = std::max(worst, severity(u.status));
    if (u.status != Status::Validated)
      notes +=
          (notes.empty() ? "" : "; ") + id + " " + toString(u.status) + (u.note.empty() ? "" : " (" + u.note + ")");
  }
  sr.status = worst == 0 ? Status::Validated : worst == 1 ? Status::Extrapolated : Status::NotValidated;
  sr.statusNote = notes;
}

void describeBounds(ScaleResult& sr, const PlanResult& out, const Pending& pd) {
  const StageLowering& st = pd.step.stages[sr.layered.criticalStage];
  double memUs = 0, allUs = 0;
  for (std::size_t i = 0; i < st.compute.size(); ++i) {
    if (st.compute[i].pass == Pass::Step) continue;  // per step, not per micro-batch
    const double us = pd.computeUs[sr.layered.criticalStage][i] * st.compute[i].times;
    allUs += us;
    if (pd.computeMemBound[sr.layered.criticalStage][i]) memUs += us;
  }
  const double memShare = allUs > 0 ? memUs / allUs : 0;
  sr.bounds["compute"] =
      memShare > 0.5
          ? "HBM bandwidth (memory-bound kernels: " + formatNumber(100 * memShare, 3) + " % of compute)"
          : "tensor cores (compute-bound kernels: " + formatNumber(100 * (1 - memShare), 3) + " % of compute)";
  const Phase phases[kPhases] = {Phase::Tp, Phase::Ep, Phase::Pp, Phase::Dp, Phase::Cp};
  for (Phase ph : phases) {
    const CommUse* top = nullptr;
    double topUs = 0;
    for (const CommUse& c : sr.comm) {
      if (c.phase != ph) continue;
      const double us = out.prices.at(c.priceKey).us * c.timesPerStep;
      if (us > topUs) {
        topUs = us;
        top = &c;
      }
    }
    if (top) sr.bounds[toString(ph)] = top->name + ": " + boundText(out.prices.at(top->priceKey));
  }
  if (sr.layered.bubbleUs > 0)
    sr.bounds["bubble"] = "pipeline fill and drain: (p - 1) / v = " +
                          formatNumber(static_cast<double>(sr.layout.pp - 1) / sr.layout.virtualStages, 4) +
                          " micro-batch times against " + std::to_string(sr.layout.microBatches) + " micro-batches";
}

}  // namespace mk::plan::detail
