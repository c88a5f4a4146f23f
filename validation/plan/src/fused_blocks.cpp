// mkernel — the fused blocks' prices (fused.hpp, priceFusedBlock): a MoE layer's expert part as moe-ffn and an
// attention with its K/V ring as ring-attention, each generated at the block's shape on the ranks of its group and
// timed by the schedule's own model. Nothing here knows what the operators cost: the generators and the timeline /
// replay engines do.
#include <algorithm>
#include <cstdint>
#include <sstream>
#include <string>
#include <utility>

#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/plan/fused.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/schedule/step_kind.hpp"
#include "mk/sim/moe.hpp"
#include "mk/sim/replay.hpp"

namespace mk::plan {

namespace {

std::string opName(const FusedBlock& b) { return std::string(toString(b.kind)) + (b.mirror ? " (backward)" : ""); }

uint32_t narrow(const FusedBlock& b, uint64_t v, const char* field) {
  if (v > UINT32_MAX)
    throw Error(ErrorCode::Unsupported, opName(b) + ": " + field + " " + std::to_string(v) + " is beyond 32 bits");
  return static_cast<uint32_t>(v);
}

/// moe-ffn at the block's shape. A mirror moves what the forward moves: the gradient of the combine's output to the
/// experts (the dispatch's tokens), the gradient of their input back (the combine's), so it has the forward's
/// shape; its compute is the backward's through the rate (priceFusedBlock).
MoeFfnSpec moeSpec(const FusedBlock& b) {
  MoeFfnSpec s;
  s.experts = narrow(b, b.experts, "experts per rank");
  s.topk = narrow(b, b.topk, "top-k");
  s.tokens = narrow(b, b.tokens, "tokens per rank");
  s.hidden = narrow(b, b.hidden, "hidden");
  s.ffn = narrow(b, b.ffn, "ffn");
  s.imbalance = b.load;
  return s;
}

/// ring-attention at the block's shape. A mirror's blocks carry dK and dV back with K and V: twice the bytes per
/// block, which the forward schedule of twice the head dim moves (its FLOPs double too, which the rate absorbs).
RingAttentionSpec ringSpec(const FusedBlock& b, uint32_t sms) {
  RingAttentionSpec s;
  s.batch = narrow(b, b.batch, "micro-batch");
  s.qHeads = narrow(b, b.heads, "query heads per rank");
  s.kvHeads = narrow(b, b.kvHeads, "key-value heads per rank");
  s.headDim = narrow(b, b.headDim * (b.mirror ? 2 : 1), "head dim");
  s.seq = b.seq;
  s.causal = true;
  s.dtype = b.dtype;
  // As mk-sim gives it: every SM but the send lane's computes.
  s.computeCtas = sms > 1 ? sms - 1 : 1;
  return s;
}

/// The rate at which `s`'s compute steps take `computeUs` on the busiest rank (the most FLOPs of one rank, at the
/// extents' expected values): one compute price rule for both variants.
double computeRate(const Schedule& s, double computeUs, const FusedBlock& b) {
  double most = 0;
  for (const auto& lanes : s.lanes) {
    double rank = 0;
    for (const Lane& lane : lanes)
      for (const Step& st : lane.steps)
        if (pricedByFlops(st.kind)) rank += st.flops;
    most = std::max(most, rank);
  }
  if (!(most > 0)) throw Error(ErrorCode::Internal, "fused: " + opName(b) + "'s schedule computes nothing");
  return most / (computeUs * 1e6);
}

/// The most lanes of one rank that do not compute.
uint32_t otherLanes(const Schedule& s) {
  uint32_t most = 1;
  for (const auto& lanes : s.lanes) {
    uint32_t n = 0;
    for (const Lane& lane : lanes) n += lane.role == LaneRole::Compute ? 0 : 1;
    most = std::max(most, n);
  }
  return most;
}

/// How a block across nodes is replayed: its time only.
sim::SimOptions replayOptions() {
  sim::SimOptions so;
  so.trace = false;
  so.linkLoad = false;
  return so;
}

}  // namespace

FusedOpPrice priceFusedBlock(const FusedBlockRequest& rq) {
  const FusedBlock& b = rq.block;
  if (!rq.cluster || !rq.profile) throw Error(ErrorCode::Internal, "fused: a block request without cluster or profile");
  if (!b.unfusable.empty()) throw Error(ErrorCode::Unsupported, opName(b) + ": " + b.unfusable);
  if (!(rq.computeUs > 0))
    throw Error(ErrorCode::Internal, "fused: " + opName(b) + " comes without the layered price of its kernels");
  const ConcurrentPlacement& pl = rq.placement;
  const uint32_t ranks = pl.groupSize;
  Profile profile = *rq.profile;
  fillCtaDefaults(profile, pl.choice);
  const std::vector<uint32_t> nodeOf = pl.choice.layout(ranks);
  std::ostringstream split;
  Schedule s;
  double replayedUs = 0;  // the schedule's replay when choosing it took one (0: none)
  if (b.kind == FusedBlockKind::MoeFfn) {
    const MoeFfnSpec spec = moeSpec(b);
    validateMoeFfnSpec(spec, ranks);
    // Both returns run the same compute steps: the rate comes from either.
    MoeFfnSpec probe = spec;
    probe.combineReturn = MoeCombineReturn::PerBlock;
    profile.gemmTflops = computeRate(generateMoeFfn(probe, nodeOf), rq.computeUs, b);
    // The return across nodes: the one rule mk-sim applies too, by the replay this block is priced with below.
    sim::MoeFfnPlan plan = sim::planMoeFfn(spec, pl.choice, ranks, profile, replayOptions());
    if (plan.byModel) replayedUs = plan.chosenUs();
    MoeFfnSpec tuned = plan.spec;
    s = std::move(plan.schedule);
    // Then the split of the SMs between the compute lane and the others (MoeFfnSpec::computeCtas), the operator's
    // choice: the one with the lowest closed form of a few, as planFused chooses the TP operators' split.
    double best = simulateUncontended(s, profile, pl.choice).totalUs;
    const uint32_t others = otherLanes(s);
    for (uint32_t w : {others, 3 * others, 7 * others, 15 * others, profile.sms > others ? profile.sms - others : 1}) {
      MoeFfnSpec trial = tuned;
      trial.computeCtas = std::max(1u, w);
      if (trial.computeCtas == tuned.computeCtas) continue;
      Schedule t = generateMoeFfn(trial, nodeOf);
      const double us = simulateUncontended(t, profile, pl.choice).totalUs;
      if (us < best) {
        best = us;
        tuned = trial;
        s = std::move(t);
        replayedUs = 0;  // another schedule than the one replayed
      }
    }
    split << "moe-ffn: " << tuned.experts << " experts on each of " << ranks << " ranks, top-" << tuned.topk << " of "
          << tuned.tokens << " tokens per rank, hidden " << tuned.hidden << ", ffn " << tuned.ffn << ", load x"
          << tuned.imbalance << ", compute lane weight " << tuned.computeCtas << " against " << others
          << " other lanes of 1";
    if (plan.multiNode) split << ", combine " << toString(tuned.combineReturn);
  } else {
    const RingAttentionSpec spec = ringSpec(b, profile.sms);
    validateRingAttentionSpec(spec, ranks);
    s = generateRingAttention(spec, nodeOf);
    profile.attentionTflops = computeRate(s, rq.computeUs, b);
    split << "ring-attention: " << spec.batch << " x " << spec.seq << " tokens over a ring of " << ranks << " ranks, "
          << spec.qHeads << " query / " << spec.kvHeads << " key-value heads of " << spec.headDim
          << ", causal zigzag, compute lane " << spec.computeCtas << " CTAs";
  }
  const double rate = b.kind == FusedBlockKind::MoeFfn ? profile.gemmTflops : profile.attentionTflops;
  split << " (" << (b.mirror ? "backward: the forward schedule" : "computing") << " at " << rate << " TFLOP/s)";
  FusedOpPrice p;
  p.us = simulateUncontended(s, profile, pl.choice).totalUs;
  p.source = std::string("the ") + toString(b.kind) + " schedule's uncontended timeline (closed form)";
  if (pl.multiNode) {
    const double uncontended = p.us;
    p.us = replayedUs > 0 ? replayedUs : sim::predict(s, pl.choice, profile, replayOptions()).totalUs;
    std::ostringstream src;
    src << "the " << toString(b.kind) << " schedule replayed by SimGrid (uncontended timeline " << uncontended
        << " us)";
    p.source = src.str();
  }
  if (b.mirror) p.source += "; backward modelled from the forward operator";
  p.gemmUs = rq.computeUs;
  p.exposedCommUs = std::max(0.0, p.us - rq.computeUs);
  p.split = split.str();
  return p;
}

}  // namespace mk::plan
