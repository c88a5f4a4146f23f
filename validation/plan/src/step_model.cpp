// mkernel — the step-time model (step_model.hpp).
#include "mk/plan/step_model.hpp"

#include <algorithm>
#include <string>
#include <utility>
#include <vector>

#include "mk/error.hpp"

namespace mk::plan {

namespace {

/// One stage's per-micro-batch sums.
struct StageSums {
  double computeF = 0, computeB = 0;
  double byClass[kKernelClasses] = {};      ///< computeF + computeB by kernel class
  double step = 0;                          ///< the per-step kernels (optimizer, gradient norm)
  double stepByClass[kKernelClasses] = {};  ///< `step` by kernel class
  double blocking[kPhases][2] = {};         ///< [phase][pass] blocking communication
  double attention[2] = {};                 ///< attention kernels per pass
  double ring[2] = {}, ringHidden[2] = {};  ///< context parallelism's K/V ring per pass
  double hiddenTp = 0;  ///< the TP collectives' layered time hidden in fused ops or by tpCommOverlap
  /// Pipeline and expert-parallel communication hidden by the overlap flags; expert- and context-parallel
  /// communication hidden in fused blocks
  double hidden[kPhases] = {};
  double prefetch[2] = {}, prefetchExposed[2] = {};  ///< ZeRO 3 per pass
  /// Gradient buckets of one step, in order, as runs of equal buckets (count, us each): a step may have billions of
  /// them (a vocabulary of 2^40 in 25 MiB buckets), one double each took gigabytes.
  std::vector<std::pair<uint64_t, double>> buckets;
  double paramGather = 0;
  double F() const { return computeF + blockingOf(0) + prefetchExposed[0]; }
  double B() const { return computeB + blockingOf(1) + prefetchExposed[1]; }
  double blockingOf(int pass) const {
    double sum = 0;
    for (int ph = 0; ph < kPhases; ++ph) sum += blocking[ph][pass];
    return sum;
  }
};

int passIdx(Pass p) { return p == Pass::Forward ? 0 : 1; }

/// Communication of `comm` us beside compute of `compute` us, which runs `slow` times slower while both run (the
/// overlap model): the time of both. The compute progresses comm / slow while the communication lasts; a
/// communication longer than the slowed compute sets the time alone.
double beside(double compute, double comm, double slow) {
  if (comm >= compute * slow) return comm;
  return compute + comm * (1 - 1 / slow);
}

/// The layered side's overlap flags of a stage's sums (docs/planner.md, "Overlap"): the interleaved schedule's
/// pipeline sends beside each pass's compute, and the MoE all-to-alls of one micro-batch beside the other
/// micro-batch's compute (combined 1F1B: a forward pass and a backward pass run together).
void overlapPhases(const ParallelLayout& l, double slow, StageSums& s) {
  const int pp = static_cast<int>(Phase::Pp), ep = static_cast<int>(Phase::Ep);
  if (l.overlapPpComm && l.schedule == PipelineSchedule::Interleaved) {
    const double compute[2] = {s.computeF, s.computeB};
    for (int p = 0; p < 2; ++p) {
      const double comm = s.blocking[pp][p];
      const double exposed = beside(compute[p], comm, slow) - compute[p];
      s.blocking[pp][p] = exposed;
      s.hidden[pp] += comm - exposed;
    }
  }
  const double a2a = s.blocking[ep][0] + s.blocking[ep][1];
  if (l.overlapMoeA2a && a2a > 0) {
    const double compute = s.computeF + s.computeB;
    const double exposed = beside(compute, a2a, slow) - compute;
    for (int p = 0; p < 2; ++p) s.blocking[ep][p] *= exposed / a2a;
    s.hidden[ep] += a2a - exposed;
  }
}

/// `ringRanks`: context parallelism's K/V ring (cpRingRanks).
StageSums sumStage(const Workload& w, const StageLowering& st, const StagePrices& pr, uint32_t ringRanks) {
  if (pr.computeUs.size() != st.compute.size() || pr.commUs.size() != st.comm.size() ||
      (!pr.fusedUs.empty() && pr.fusedUs.size() != st.fused.size()) ||
      (!pr.blockUs.empty() && pr.blockUs.size() != st.fusedBlocks.size()))
    throw Error(ErrorCode::InvalidArgument,
                "composeStep: stage " + std::to_string(st.stage) + ": the prices do not match the lowered operations");
  std::vector<bool> computeFused(st.compute.size(), false), commFused(st.comm.size(), false);
  StageSums s;
  auto addCompute = [&](const ComputeOp& op, double us) {
    if (op.pass == Pass::Step) {
      s.step += us;
      s.stepByClass[static_cast<int>(op.cls)] += us;
      return;
    }
    (op.pass == Pass::Forward ? s.computeF : s.computeB) += us;
    if (op.cls == KernelClass::Attention) s.attention[passIdx(op.pass)] += us;
    s.byClass[static_cast<int>(op.cls)] += us;
  };
  // The fused variant prices each (GEMM, collective) pair as our fused operator; the layered one with
  // tpCommOverlap as userbuffers runs it: tp chunks of the collective pipelined with the GEMM's chunks, the GEMM
  // slowed while the communication runs, one chunk of the shorter not hidden (the first chunk gathered before
  // the GEMM starts, or the last one reduced after it ends).
  const bool fusedVariant = !pr.fusedUs.empty();
  if (fusedVariant || w.layout.tpCommOverlap) {
    for (std::size_t f = 0; f < st.fused.size(); ++f) {
      const FusedCandidate& fc = st.fused[f];
      const ComputeOp& g = st.compute[fc.compute];
      const CommOp& c = st.comm[fc.comm];
      computeFused[fc.compute] = true;
      commFused[fc.comm] = true;
      const double gemm = pr.computeUs[fc.compute] * g.times;
      const double layeredComm = pr.commUs[fc.comm] * c.times;
      const double chunks = std::max<uint32_t>(1, w.layout.tp);
      const double fused = fusedVariant
                               ? pr.fusedUs[f] * c.times
                               : beside(gemm, layeredComm, pr.overlapSlowdown) + std::min(gemm, layeredComm) / chunks;
      addCompute(g, std::min(gemm, fused));
      const double exposed = std::max(0.0, fused - gemm);
      s.blocking[static_cast<int>(Phase::Tp)][passIdx(c.pass)] += exposed;
      s.hiddenTp += std::max(0.0, layeredComm - exposed);
    }
  }
  // A fused block: the operator's time in place of its kernels and exchanges. Its kernels' layered time counts as
  // compute (scaled down when the operator takes less), the rest as exposed communication of its phase.
  for (std::size_t f = 0; f < pr.blockUs.size(); ++f) {
    if (!pr.blockUs[f]) continue;  // the operator cannot express it: layered
    const FusedBlock& fb = st.fusedBlocks[f];
    double compute = 0, comm = 0;
    for (uint32_t i : fb.compute) {
      computeFused[i] = true;
      compute += pr.computeUs[i] * st.compute[i].times;
    }
    for (uint32_t i : fb.comm) {
      commFused[i] = true;
      comm += pr.commUs[i] * st.comm[i].times;
    }
    const double fused = *pr.blockUs[f] * fb.times;
    const double kept = compute > 0 ? std::min(compute, fused) / compute : 0;
    for (uint32_t i : fb.compute) addCompute(st.compute[i], pr.computeUs[i] * st.compute[i].times * kept);
    const double exposed = std::max(0.0, fused - compute);
    const int ph = static_cast<int>(fb.kind == FusedBlockKind::MoeFfn ? Phase::Ep : Phase::Cp);
    s.blocking[ph][passIdx(fb.pass)] += exposed;
    s.hidden[ph] += std::max(0.0, comm - exposed);
  }
  for (std::size_t i = 0; i < st.compute.size(); ++i)
    if (!computeFused[i]) addCompute(st.compute[i], pr.computeUs[i] * st.compute[i].times);
  for (std::size_t i = 0; i < st.comm.size(); ++i) {
    if (commFused[i]) continue;
    const CommOp& c = st.comm[i];
    const double us = pr.commUs[i] * c.times;
    switch (c.timing) {
      case CommTiming::Blocking: s.blocking[static_cast<int>(c.phase)][passIdx(c.pass)] += us; break;
      case CommTiming::LayerPrefetch: s.prefetch[passIdx(c.pass)] += us; break;
      case CommTiming::GradBucket: s.buckets.emplace_back(c.times, pr.commUs[i]); break;
      case CommTiming::ParamGather: s.paramGather += us; break;
      case CommTiming::AttentionRing: s.ring[passIdx(c.pass)] += us; break;
    }
  }
  // The K/V ring: each of the ring - 1 sends overlaps the attention block computed beside it, (ring - 1) / ring
  // of the pass's attention; what that cannot cover is on the critical path.
  const double covered = ringRanks > 1 ? static_cast<double>(ringRanks - 1) / ringRanks : 0;
  for (int p = 0; p < 2; ++p) {
    const double exposed = std::max(0.0, s.ring[p] - covered * s.attention[p]);
    s.blocking[static_cast<int>(Phase::Cp)][p] += exposed;
    s.ringHidden[p] = s.ring[p] - exposed;
  }
  if (!fusedVariant) overlapPhases(w.layout, pr.overlapSlowdown, s);
  // ZeRO 3: a layer's gather runs while the previous layer computes; what the pass's compute cannot cover waits.
  s.prefetchExposed[0] = std::max(0.0, s.prefetch[0] - s.computeF);
  s.prefetchExposed[1] = std::max(0.0, s.prefetch[1] - s.computeB);
  return s;
}

/// When the last gradient bucket is reduced, counted from the end of the stage's last backward pass. Bucket j of n
/// is ready at backwardUs x (j + 1) / n (with overlap) and is reduced after the previous one: end_j = max(end_{j-1},
/// ready_j) + us_j. Over a run of k equal buckets from a, end = max(end_{a-1} + k us, max_i (ready_i + (a + k - i)
/// us)); the second term is linear in i, so its largest value is at i = a or i = a + k - 1: O(1) per run.
double bucketTail(const std::vector<std::pair<uint64_t, double>>& buckets, double backwardUs, bool overlap) {
  uint64_t total = 0;
  for (const auto& run : buckets) total += run.first;
  if (total == 0) return 0;
  const double n = static_cast<double>(total);
  auto ready = [&](uint64_t j) { return overlap ? backwardUs * static_cast<double>(j + 1) / n : backwardUs; };
  double end = 0;
  uint64_t first = 0;
  for (const auto& [count, us] : buckets) {
    if (count == 0) continue;
    const double k = static_cast<double>(count);
    end = std::max({end + k * us, ready(first) + k * us, ready(first + count - 1) + us});
    first += count;
  }
  return end - backwardUs;
}

}  // namespace

StepBreakdown composeStep(const Workload& w, const StepLowering& step, const std::vector<StagePrices>& prices) {
  if (prices.size() != step.stages.size())
    throw Error(ErrorCode::InvalidArgument, "composeStep: " + std::to_string(prices.size()) + " stage prices for " +
                                                std::to_string(step.stages.size()) + " stages");
  std::vector<StageSums> sums;
  const uint32_t ringRanks = cpRingRanks(w.layout);
  for (std::size_t s = 0; s < step.stages.size(); ++s)
    sums.push_back(sumStage(w, step.stages[s], prices[s], ringRanks));
  uint32_t c = 0;
  for (uint32_t s = 1; s < sums.size(); ++s)
    if (sums[s].F() + sums[s].B() > sums[c].F() + sums[c].B()) c = s;
  const StageSums& cs = sums[c];
  const ResolvedLayout& r = step.layout;
  const double m = r.microBatches;
  const double bubbleFactor = w.layout.schedule == PipelineSchedule::GPipe
                                  ? static_cast<double>(r.pp - 1)
                                  : static_cast<double>(r.pp - 1) / static_cast<double>(r.virtualStages);
  StepBreakdown b;
  b.criticalStage = c;
  b.forwardUs = cs.F();
  b.backwardUs = cs.B();
  const double perMb = b.forwardUs + b.backwardUs;
  const double pipe = (m + bubbleFactor) * perMb;
  b.computeUs = m * (cs.computeF + cs.computeB);
  for (int k = 0; k < kKernelClasses; ++k) b.computeClassUs[k] = m * cs.byClass[k];
  b.criticalComputeUs = (m + bubbleFactor) * (cs.computeF + cs.computeB);
  PhaseTime* phases[kPhases] = {&b.tp, &b.ep, &b.pp, &b.dp, &b.cp};
  for (int ph = 0; ph < kPhases; ++ph) phases[ph]->exposedUs = m * (cs.blocking[ph][0] + cs.blocking[ph][1]);
  b.cp.hiddenUs = m * (cs.ringHidden[0] + cs.ringHidden[1] + cs.hidden[static_cast<int>(Phase::Cp)]);
  b.tp.hiddenUs = m * cs.hiddenTp;
  b.pp.hiddenUs = m * cs.hidden[static_cast<int>(Phase::Pp)];
  b.ep.hiddenUs = m * cs.hidden[static_cast<int>(Phase::Ep)];
  b.dp.exposedUs += m * (cs.prefetchExposed[0] + cs.prefetchExposed[1]);
  b.dp.hiddenUs += m * (cs.prefetch[0] + cs.prefetch[1] - cs.prefetchExposed[0] - cs.prefetchExposed[1]);
  b.bubbleUs = bubbleFactor * perMb;

  // Gradient reduction: stage s ends its last backward pass s x B_c before the pipeline ends; its optimizer step
  // and gradient norm run once its last bucket is reduced (with ZeRO, on the shard the reduce-scatter left).
  double dpEnd = -1, dpTotal = 0, stepEnd = pipe;
  uint32_t last = 0;
  for (uint32_t s = 0; s < sums.size(); ++s) {
    const double end = pipe - s * b.backwardUs + bucketTail(sums[s].buckets, sums[s].B(), w.layout.overlapGradReduce);
    if (s == 0 || end > dpEnd) {
      dpEnd = end;
      dpTotal = 0;
      for (const auto& [count, us] : sums[s].buckets) dpTotal += static_cast<double>(count) * us;
    }
    if (end + sums[s].step > stepEnd) {
      stepEnd = end + sums[s].step;
      last = s;
    }
  }
  const double gradExposed = std::max(0.0, dpEnd - pipe);
  // What the optimizer adds past the gradient reduction, split over its classes as the stage that ends last runs
  // them.
  b.optimizerUs = std::max(0.0, stepEnd - pipe - gradExposed);
  if (sums[last].step > 0)
    for (int k = 0; k < kKernelClasses; ++k)
      b.computeClassUs[k] += b.optimizerUs * sums[last].stepByClass[k] / sums[last].step;
  b.computeUs += b.optimizerUs;
  b.criticalComputeUs += b.optimizerUs;
  b.computeGemmUs = b.computeClassUs[static_cast<int>(KernelClass::Gemm)];
  b.computeAttentionUs = b.computeClassUs[static_cast<int>(KernelClass::Attention)];
  // Parameter all-gather after the optimizer step (ZeRO 1/2), every stage at once.
  double gatherExposed = 0, gatherTotal = 0;
  for (const StageSums& s : sums) {
    const double exposed = w.layout.overlapParamGather ? std::max(0.0, s.paramGather - s.F()) : s.paramGather;
    if (exposed >= gatherExposed) {
      gatherExposed = exposed;
      gatherTotal = s.paramGather;
    }
  }
  b.dp.exposedUs += gradExposed + gatherExposed;
  b.dp.hiddenUs += std::max(0.0, dpTotal - gradExposed) + std::max(0.0, gatherTotal - gatherExposed);
  b.stepUs = pipe + gradExposed + b.optimizerUs + gatherExposed;
  return b;
}

}  // namespace mk::plan
