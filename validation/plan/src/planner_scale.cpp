// mkernel — one scale of a plan: its lowering and price requests (pass 1), its prices, step times and what its
// critical stage runs (pass 2); planner_internal.hpp.
#include <cmath>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mk/error.hpp"
#include "mk/util/format.hpp"
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

/// One fused block of stage `st` priced by its operator (`prices` gains its blockUs), or kept layered with the
/// reason.
FusedBlockUse fusedBlock(const FusedBlock& fb, const StageLowering& st, const Pending& pd, const VariantResult& vr,
                         FusedOpPricer& fused, StagePrices& prices) {
  FusedBlockUse u;
  u.kind = fb.kind;
  u.pass = fb.pass;
  u.mirror = fb.mirror;
  FusedBlockRequest rq;
  rq.block = fb;
  for (uint32_t i : fb.compute) {
    const ComputeOp& op = st.compute[i];
    u.replaces.push_back(op.name);
    const double us = prices.computeUs[i] * op.times / fb.times;
    u.layeredComputeUs += us;
    // The kernels whose work the operator's compute steps do; the others (activation, permutations) it absorbs.
    if (op.kind == ComputeKind::Gemm || op.kind == ComputeKind::Attention) rq.computeUs += us;
  }
  for (uint32_t i : fb.comm) {
    u.replaces.push_back(st.comm[i].name);
    u.layeredCommUs += prices.commUs[i] * st.comm[i].times / fb.times;
  }
  try {
    rq.placement = placeConcurrent(st.groups[fb.groups], pd.cluster);
    u.ranks = rq.placement.groupSize;
    rq.cluster = &pd.cluster;
    rq.profile = &vr.profile;
    const FusedOpPrice p = fused.priceBlock(rq);
    u.priced = true;
    u.fused = true;  // until keepShorterStep finds the step shorter without this kind of block
    u.us = p.us;
    u.source = p.source;
    u.split = p.split;
    prices.blockUs.emplace_back(p.us);
  } catch (const Error& e) {
    prices.blockUs.emplace_back(std::nullopt);
    u.note = e.message() + "; kept layered";
  }
  return u;
}

/// A planner recommends rather than forces: each kind of fused block stays fused only if the fused step is shorter
/// with it than with those blocks layered (their kernels and exchanges as the layered variant prices and overlaps
/// them); the blocks of a kind that does not pay are kept layered, their note giving both steps.
void keepShorterStep(const Workload& w, const Pending& pd, std::vector<StagePrices>& prices,
                     std::vector<FusedStagePrices>& priced) {
  for (FusedBlockKind kind : {FusedBlockKind::MoeFfn, FusedBlockKind::RingAttention}) {
    std::vector<StagePrices> without = prices;
    bool any = false;
    for (std::size_t s = 0; s < prices.size(); ++s)
      for (std::size_t b = 0; b < priced[s].blocks.size(); ++b)
        if (priced[s].blocks[b].kind == kind && priced[s].blocks[b].fused) {
          without[s].blockUs[b] = std::nullopt;
          any = true;
        }
    if (!any) continue;
    const double withUs = composeStep(w, pd.step, prices).stepUs;
    const double withoutUs = composeStep(w, pd.step, without).stepUs;
    if (withUs < withoutUs) continue;
    prices = std::move(without);
    for (FusedStagePrices& st : priced)
      for (FusedBlockUse& u : st.blocks)
        if (u.kind == kind && u.fused) {
          u.fused = false;
          u.note = strprintf(
              "its operator (%.1f us a run) does not shorten the fused step (%.4g s with the %s blocks, "
              "%.4g s without); kept layered",
              u.us, withUs * 1e-6, toString(kind), withoutUs * 1e-6);
        }
  }
}

/// The fused variant: every (GEMM, collective) pair priced by the fused operators' model (`prices` gains their
/// fusedUs) and every fused block by its operator (blockUs; kept layered where it cannot run), or why it has no
/// step. Returns what it priced on each stage (empty when it has no step).
std::vector<FusedStagePrices> fusedStep(ScaleResult& sr, const Pending& pd, const Workload& w, const VariantResult& vr,
                                        const PlanResult& out, FusedOpPricer& fused, std::vector<StagePrices>& prices) {
  std::vector<FusedStagePrices> priced(prices.size());
  if (!fused.available()) {
    sr.fusedNote = out.fusedStatus;
    return {};
  }
  try {
    for (std::size_t s = 0; s < prices.size(); ++s) {
      const StageLowering& st = pd.step.stages[s];
      for (const FusedBlock& fb : st.fusedBlocks)
        priced[s].blocks.push_back(fusedBlock(fb, st, pd, vr, fused, prices[s]));
      for (const FusedCandidate& f : st.fused) {
        FusedOpRequest rq;
        rq.kind = f.kind;
        rq.gemm = st.compute[f.compute];
        rq.comm = st.comm[f.comm];
        rq.placement = placeConcurrent(st.groups[rq.comm.groups], pd.cluster);
        rq.cluster = &pd.cluster;
        rq.profile = &vr.profile;
        rq.gemmUs = prices[s].computeUs[f.compute];
        priced[s].pairs.push_back(fused.price(rq));
        prices[s].fusedUs.push_back(priced[s].pairs.back().us);
      }
    }
    keepShorterStep(w, pd, prices, priced);
    sr.fused = composeStep(w, pd.step, prices);
    sr.fusedAvailable = true;
  } catch (const Error& e) {
    sr.fusedNote = "fused: " + e.message();
    return {};
  }
  return priced;
}

}  // namespace

void priceScale(ScaleResult& sr, const Pending& pd, const Workload& w, const VariantResult& vr, PlanResult& out,
                const CommPricer& pricer, FusedOpPricer& fused, double overlapSlowdown) {
  std::vector<StagePrices> prices = stagePrices(pd, out, pricer, overlapSlowdown);
  sr.layered = composeStep(w, pd.step, prices);
  const std::vector<FusedStagePrices> priced = fusedStep(sr, pd, w, vr, out, fused, prices);

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

  describeCriticalStage(sr, out, pd, pricer, priced.empty() ? nullptr : &priced[sr.layered.criticalStage]);
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

void describeCriticalStage(ScaleResult& sr, const PlanResult& out, const Pending& pd, const CommPricer& pricer,
                           const FusedStagePrices* fused) {
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
  for (std::size_t k = 0; k < st.fused.size(); ++k) {
    const FusedCandidate& f = st.fused[k];
    const ComputeOp& g = st.compute[f.compute];
    const CommOp& op = st.comm[f.comm];
    FusedUse u{f.kind,
               g.name,
               op.name,
               g.m,
               g.n,
               g.k,
               static_cast<uint32_t>(perStepTimes(op, sr.layout)),
               pd.computeUs[c][f.compute],
               *pd.keys[c][f.comm],
               0.0,
               {}};
    if (fused) {
      u.us = fused->pairs[k].us;
      u.source = fused->pairs[k].source;
    }
    sr.fusedOps.push_back(std::move(u));
  }
  if (!fused) return;
  for (std::size_t k = 0; k < st.fusedBlocks.size(); ++k) {
    FusedBlockUse u = fused->blocks[k];
    u.timesPerStep = st.fusedBlocks[k].times * sr.layout.microBatches;
    sr.fusedBlocks.push_back(std::move(u));
  }
}

}  // namespace mk::plan::detail
