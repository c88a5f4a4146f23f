// mk-schedule's op runners besides the collectives: the fused GEMM + collective ops, moe-dispatch-gemm, moe-ffn and
// ring-attention (generate, validate, summarise, cost, verify, write).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include "mk/algorithms/attention.hpp"
#include "mk/algorithms/fused.hpp"
#include "mk/algorithms/moe.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/bottleneck.hpp"
#include "mk/cost/cost.hpp"
#include "mk/exec/verify_attention.hpp"
#include "mk/exec/verify_fused.hpp"
#include "mk/exec/verify_moe.hpp"
#include "mk/util/cli_collective.hpp"
#include "mk/util/format.hpp"
#include "mk/util/progress.hpp"
#include "mk_schedule_common.hpp"

namespace mkschedule {

/// A fused op (--op gemm-rs|ag-gemm|gemm-ar): plan it, generate, validate, print its shape and closed form, verify.
int runFused(const Options& o) {
  const mk::FusedRequest request = mk::parseFused(o.coll);
  const mk::Placement placed = mk::placeRanks(o.coll.cluster, o.coll.nodes, o.coll.ranks);
  const mk::Topology& topo = placed.topo;
  const uint32_t nRanks = placed.nRanks;
  mk::Profile profile = mk::profileFor(o.coll, topo);
  const std::vector<std::string> filled = mk::fillCtaDefaults(profile, topo);
  const mk::FusedPlan plan = mk::planFused(request.spec, request.opt, topo, nRanks, profile);
  mk::checkMemory(plan.spec, topo.layout(nRanks), plan.opt, jobOf(o), o.guard.maxMemory());
  const auto t0 = std::chrono::steady_clock::now();
  const mk::Schedule schedule = mk::withProgress("mk-schedule", "generate", o.guard.progressWanted(), [&] {
    return mk::generate(plan.spec, topo.layout(nRanks), plan.opt);
  });
  const double genMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  const std::string validated = validateText(schedule);

  std::printf("mk-schedule: %s on %s x %u node(s) (%u ranks, %u GPU(s) per node)\n", mk::toString(plan.spec.op),
              topo.name.c_str(), topo.nodes, nRanks, topo.node.gpus);
  printLines(mk::cli::describeFusedPlan(plan, nRanks, profile.sms > 0 ? profile.sms : topo.node.sms));
  std::printf("  generate   %.1f ms, validate %s\n", genMs, validated.c_str());
  printSummary(schedule);
  const mk::LayeredEstimate layered = mk::layeredEstimate(plan.spec, topo, nRanks, profile);
  std::printf("  cost       %s closed form: %s\n", mk::formatMicros(plan.estimate.totalUs).c_str(),
              plan.estimate.formula.c_str());
  printLines(mk::cli::describeFusedCost(plan.estimate, layered, plan.estimate.totalUs));
  std::printf("  profile    %s%s\n", profile.source.c_str(), filledNote(filled).c_str());

  const mk::InputKind kind = o.inputs == "integers" ? mk::InputKind::SmallIntegers : mk::InputKind::Uniform;
  const int rc = o.verify ? verify(o, nRanks, [&] { return mk::verifyFused(schedule, plan.spec, o.seed, kind); }) : 0;
  if (rc == 0) writeOutputs(o, schedule);
  return rc;
}

/// --op moe-dispatch-gemm | moe-ffn | ring-attention: generate, validate, summarise, the uncontended timeline's cost
/// and bound, --verify on the CPU executor (uniform routing for MoE), then the outputs.
int runOperator(const Options& o) {
  const mk::Placement placed = mk::placeRanks(o.coll.cluster, o.coll.nodes, o.coll.ranks);
  const mk::Topology& topo = placed.topo;
  const uint32_t nRanks = placed.nRanks;
  mk::Profile profile = mk::profileFor(o.coll, topo);
  const std::vector<std::string> filled = mk::fillCtaDefaults(profile, topo);
  const bool moe = o.coll.op == mk::cli::kMoeDispatchGemmOp, ffn = o.coll.op == mk::cli::kMoeFfnOp;
  mk::MoeDispatchGemmSpec moeSpec;
  mk::MoeFfnSpec ffnSpec;
  mk::RingAttentionSpec attnSpec;
  if (ffn) {
    ffnSpec = mk::cli::moeFfnSpecOf(o.ops);
    mk::validateMoeFfnSpec(ffnSpec, nRanks);
  } else if (moe) {
    moeSpec = mk::cli::moeSpecOf(o.ops);
    mk::validateMoeDispatchGemmSpec(moeSpec, nRanks);
  } else {
    attnSpec = mk::cli::attentionSpecOf(o.ops, o.coll, profile.sms);
    mk::validateRingAttentionSpec(attnSpec, nRanks);
  }
  // moe-ffn's return across nodes is chosen by the SimGrid replay (mk::sim::planMoeFfn), which mk-schedule does not
  // run: there it must be named.
  const std::vector<uint32_t> nodeOf = topo.layout(nRanks);
  if (ffn && ffnSpec.combineReturn == mk::MoeCombineReturn::Auto &&
      std::any_of(nodeOf.begin(), nodeOf.end(), [&](uint32_t n) { return n != nodeOf[0]; }))
    throw mk::Error(mk::ErrorCode::InvalidArgument,
                    "--combine auto across nodes is chosen by the SimGrid replay, which mk-schedule does not run: name "
                    "--combine per-block or node-sum (mk-sim --op moe-ffn with the same options prints its choice)");
  const auto t0 = std::chrono::steady_clock::now();
  const mk::Schedule schedule = mk::withProgress("mk-schedule", "generate", o.guard.progressWanted(), [&] {
    return ffn              ? mk::generateMoeFfn(ffnSpec, nodeOf)
           : moe            ? mk::generateMoeDispatchGemm(moeSpec, nodeOf)
           : o.ops.backward ? mk::generateRingAttentionBackward(attnSpec, nodeOf)
                            : mk::generateRingAttention(attnSpec, nodeOf);
  });
  const double genMs = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  mk::requireWithin(mk::memoryNeed(mk::countOf(schedule), jobOf(o)), o.guard.maxMemory());
  const std::string validated = validateText(schedule);
  std::printf("mk-schedule: %s %s on %s x %u node(s) (%u ranks, %u GPU(s) per node)\n", schedule.info.op.c_str(),
              schedule.info.algo.c_str(), topo.name.c_str(), topo.nodes, nRanks, topo.node.gpus);
  std::printf("  generate   %.1f ms, validate %s\n", genMs, validated.c_str());
  printSummary(schedule);
  const mk::Timeline t = mk::simulateUncontended(schedule, profile, topo);
  std::vector<mk::ResourceUse> uses = mk::timelineResourceUse(schedule, t, profile);
  const std::vector<mk::ResourceUse> compute = mk::computeResourceUse(schedule, t, t.totalUs);
  uses.insert(uses.end(), compute.begin(), compute.end());
  std::printf("  cost       %s uncontended timeline (no closed form: mk-sim replays it with contention)\n",
              mk::formatMicros(t.totalUs).c_str());
  std::printf("  bound      %s\n", mk::bottleneckText(uses).c_str());
  std::printf("  profile    %s%s\n", profile.source.c_str(), filledNote(filled).c_str());
  const int rc = !o.verify ? 0
                 : ffn     ? verify(o, nRanks, [&] { return mk::verifyMoeFfn(schedule, ffnSpec, o.seed); })
                 : moe     ? verify(o, nRanks, [&] { return mk::verifyMoeDispatchGemm(schedule, moeSpec, o.seed); })
                 : o.ops.backward
                     ? verify(o, nRanks, [&] { return mk::verifyRingAttentionBackward(schedule, attnSpec, o.seed); })
                     : verify(o, nRanks, [&] { return mk::verifyRingAttention(schedule, attnSpec, o.seed); });
  if (rc == 0) writeOutputs(o, schedule);
  return rc;
}

}  // namespace mkschedule
