// mkernel — one scale of a plan: its lowering and price requests (pass 1), its prices, step times and what its
// critical stage runs (pass 2); planner_internal.hpp.
#include <cmath>
#include <string>

#include "mk/error.hpp"
#include "planner_internal.hpp"

namespace mk::plan::detail {

namespace {

/// Runs of `op` per step on a GPU of its stage.
double perStepTimes(const CommOp& op, const ResolvedLayout& r) {
  const bool perMicroBatch = op.timing == CommTiming::Blocking || op.timing == CommTiming::LayerPrefetch ||
                             op.timing == CommTiming::AttentionRing;
  return static_cast<double>(op.times) * (perMicroBatch ? r.microBatches : 1);
}

/// The prices of every stage of `pd`: its kernels', its collectives' (new ones kept in out.prices) and the
/// compute slowdown beside communication.
std::vector<StagePrices> stagePrices(const Pending& pd, PlanResult& out, const CommPricer& pricer,
                                     double overlapSlowdown) {
  std::vector<StagePrices> prices(pd.step.stages.size());
  for (std::size_t s = 0; s < prices.size(); ++s) {
    prices[s].computeUs = pd.computeUs[s];
    prices[s].overlapSlowdown = overlapSlowdown;
    for (const std::string* key : pd.keys[s]) {
      const CommPrice& cp = pricer.price(*key);
      prices[s].commUs.push_back(cp.us);
      if (!out.prices.count(*key)) {
        out.prices[*key] = cp;
        out.stats.simulatedWallS += cp.wallS;
      }
    }
  }
  return prices;
}

/// The fused variant: every (GEMM, collective) pair priced by the fused operators' model (`prices` gains their
/// fusedUs), or why it has no step.
void fusedStep(ScaleResult& sr, const Pending& pd, const Workload& w, const VariantResult& vr, const PlanResult& out,
               FusedOpPricer& fused, std::vector<StagePrices>& prices) {
  if (!fused.available()) {
    sr.fusedNote = out.fusedStatus;
    return;
  }
  try {
    for (std::size_t s = 0; s < prices.size(); ++s) {
      const StageLowering& st = pd.step.stages[s];
      for (const FusedCandidate& f : st.fused) {
        FusedOpRequest rq;
        rq.kind = f.kind;
        rq.gemm = st.compute[f.compute];
        rq.comm = st.comm[f.comm];
        rq.placement = placeConcurrent(st.groups[rq.comm.groups], pd.cluster);
        rq.cluster = &pd.cluster;
        rq.profile = &vr.profile;
        rq.gemmUs = prices[s].computeUs[f.compute];
        prices[s].fusedUs.push_back(fused.price(rq).us);
      }
    }
    sr.fused = composeStep(w, pd.step, prices);
    sr.fusedAvailable = true;
  } catch (const Error& e) {
    sr.fusedNote = "fused: " + e.message();
  }
}

}  // namespace

void priceScale(ScaleResult& sr, const Pending& pd, const Workload& w, const VariantResult& vr, PlanResult& out,
                const CommPricer& pricer, FusedOpPricer& fused, double overlapSlowdown) {
  std::vector<StagePrices> prices = stagePrices(pd, out, pricer, overlapSlowdown);
  sr.layered = composeStep(w, pd.step, prices);
  fusedStep(sr, pd, w, vr, out, fused, prices);

  const PlanInputs& in = out.inputs;
  const double stepS = sr.layered.stepUs * 1e-6;
  sr.tokensPerS = static_cast<double>(pd.step.tokensPerStep) / stepS;
  sr.mfu = pd.step.modelFlopsPerStep / (stepS * sr.gpus * pd.cluster.node.bf16Tflops * 1e12);
  sr.gpuHours = in.tokenBudget / sr.tokensPerS * sr.gpus / 3600.0;
  if (vr.whatIf.noise.any()) {
    sr.hasNoise = true;
    sr.noise = applyNoise(vr.whatIf.noise, sr.gpus, sr.layered.stepUs, sr.layered.criticalComputeUs);
  }
  sr.memory = estimateMemory(w, pd.step);
  sr.memoryCapacity = in.gpuMemoryGB ? *in.gpuMemoryGB * 1e9 : gpuMemoryBytes(pd.cluster.node.gpu);
  if (vr.whatIf.failures.any()) {
    sr.hasFailures = true;
    sr.failures =
        estimateGoodput(vr.whatIf.failures, {sr.gpus, sr.nodes, pd.cluster.node.gpus,
                                             sr.memory.weights + sr.memory.optimizer, sr.tokensPerS, in.tokenBudget});
  }

  describeCriticalStage(sr, out, pd, pricer);
  attributeClasses(sr, out, pd);
  describeBounds(sr, out, pd);
}

void prepareScale(ScaleResult& sr, Pending& pd, const Workload& w, const VariantResult& vr, const PlanResult& out,
                  CommPricer& pricer, bool keepGroups) {
  try {
    sr.layout = resolveLayout(w, sr.gpus);
    pd.step = lowerStep(w, sr.layout);
    pd.cluster = vr.nodeType;
    pd.cluster.nodes = sr.nodes;
    validateTopology(pd.cluster);
    const std::size_t context = pricer.context(pd.cluster, vr.profile);
    for (StageLowering& st : pd.step.stages) {
      pd.keys.emplace_back();
      for (const CommOp& op : st.comm) pd.keys.back().push_back(&pricer.request(op, st.groups[op.groups], context));
      // Placed and keyed: the ranks of every instance are only needed again to place the fused operators (a
      // search holds the lowerings of thousands of layouts, gigabytes of ranks at 16384 GPUs).
      if (!keepGroups) st.groups = {};
      pd.computeUs.emplace_back();
      pd.computeMemBound.emplace_back();
      pd.computeSource.emplace_back();
      for (const ComputeOp& op : st.compute) {
        const KernelPrice cp = priceCompute(*out.gemm, out.kernels, op, pd.cluster.node);
        pd.computeUs.back().push_back(cp.us);
        pd.computeMemBound.back().push_back(cp.memoryBound);
        pd.computeSource.back().push_back(cp.source);
        if (!(std::isfinite(cp.us) && cp.us > 0))
          sr.unpriced.push_back("stage " + std::to_string(st.stage) + ": " + op.name);
      }
    }
    sr.feasible = true;
  } catch (const Error& e) {
    if (e.code() != ErrorCode::InvalidArgument && e.code() != ErrorCode::Unsupported) throw;
    sr.feasible = false;
    sr.reason = e.message();
  }
}

void describeCriticalStage(ScaleResult& sr, const PlanResult& out, const Pending& pd, const CommPricer& pricer) {
  const uint32_t c = sr.layered.criticalStage;
  const StageLowering& st = pd.step.stages[c];
  for (std::size_t k = 0; k < st.comm.size(); ++k) {
    const CommOp& op = st.comm[k];
    const CommPrice& cp = pricer.price(*pd.keys[c][k]);
    CommUse u;
    u.name = op.name;
    u.phase = op.phase;
    u.timing = op.timing;
    u.timesPerStep = static_cast<uint32_t>(perStepTimes(op, sr.layout));
    u.priceKey = *pd.keys[c][k];
    u.confidence = out.confidence.forComm(cp.domain, cp.op, cp.groupSize, pd.cluster.node.gpu);
    sr.comm.push_back(u);
  }
  for (std::size_t k = 0; k < st.compute.size(); ++k) {
    const ComputeOp& op = st.compute[k];
    ComputeUse u;
    u.name = op.name;
    u.kind = op.kind;
    u.cls = op.cls;
    u.kernel = op.kernel;
    u.pass = op.pass;
    u.m = op.m;
    u.n = op.n;
    u.k = op.k;
    u.batch = op.batch;
    u.timesPerStep = op.pass == Pass::Step ? op.times : op.times * sr.layout.microBatches;
    u.us = pd.computeUs[c][k];
    u.tflops = op.flops / (pd.computeUs[c][k] * 1e6);
    u.memoryBound = pd.computeMemBound[c][k];
    u.source = pd.computeSource[c][k];
    sr.compute.push_back(u);
  }
  for (const FusedCandidate& f : st.fused) {
    const ComputeOp& g = st.compute[f.compute];
    const CommOp& op = st.comm[f.comm];
    sr.fusedOps.push_back(FusedUse{f.kind, g.name, op.name, g.m, g.n, g.k,
                                   static_cast<uint32_t>(perStepTimes(op, sr.layout)), pd.computeUs[c][f.compute],
                                   *pd.keys[c][f.comm]});
  }
}

}  // namespace mk::plan::detail
