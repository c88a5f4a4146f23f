// mk-sim --op gemm-rs|ag-gemm|gemm-ar: a fused GEMM + collective planned as the engine would, replayed, and
// reported with what bounds it next to the unfused baseline.
#include <cstdio>
#include <string>
#include <vector>

#include "mk/algorithms/fused.hpp"
#include "mk/util/cli_collective.hpp"
#include "mk/util/format.hpp"
#include "mk/util/progress.hpp"
#include "mk_sim_common.hpp"

namespace mksim {

/// A fused op (--op gemm-rs|ag-gemm|gemm-ar): plan it as the engine would, replay its schedule, and report
/// what bounds it next to the unfused baseline.
int runFused(const Options& o) {
  if (!o.sweep.empty()) bad("--sweep sizes a collective by --bytes; a fused op has one shape (--m, --n, --k)");
  const mk::FusedRequest request = mk::parseFused(o.coll);
  Setup st = makeSetup(o, nullptr);
  const std::vector<std::string> filled = mk::fillCtaDefaults(st.profile, st.topo);
  const mk::FusedPlan plan = mk::planFused(request.spec, request.opt, st.topo, st.nRanks, st.profile);
  mk::sim::FusedRunInfo fused{plan, mk::layeredEstimate(plan.spec, st.topo, st.nRanks, st.profile)};
  std::printf("mk-sim: %s on %s x %u node(s) (%u ranks, %u GPU(s) per node), %s\n", mk::toString(plan.spec.op),
              st.topo.name.c_str(), st.topo.nodes, st.nRanks, st.topo.node.gpus, mk::toString(plan.spec.dtype));
  printProfile(o, st);
  if (!o.coll.profile.empty() && !filled.empty()) {
    std::string names;
    for (const auto& f : filled) names += (names.empty() ? "" : ", ") + f;
    std::printf("profile: %s from the datasheet (not in the profile file)\n", names.c_str());
  }
  for (const auto& [label, text] :
       mk::cli::describeFusedPlan(plan, st.nRanks, st.profile.sms > 0 ? st.profile.sms : st.topo.node.sms))
    std::printf("%s: %s\n", label.c_str(), text.c_str());
  if (o.fast) std::printf("mode: fast (node-local steps analytic, network simulated)\n");
  std::fflush(stdout);

  const bool wantTrace = !o.traceOut.empty();
  mk::checkMemory(plan.spec, st.topo.layout(st.nRanks), plan.opt, jobOf(st, wantTrace), o.guard.maxMemory());
  const mk::Schedule s = mk::withProgress("mk-sim", "generate", o.guard.progressWanted(),
                                          [&] { return mk::generate(plan.spec, st.topo.layout(st.nRanks), plan.opt); });
  mk::sim::RunInfo info = baseInfo(st, s);
  info.algo = s.info.algo;
  info.closedFormUs = plan.estimate.totalUs;
  if (s.stepCount() <= kUncontendedMaxSteps)
    info.uncontendedUs = mk::simulateUncontended(s, st.profile, st.topo).totalUs;
  info.fused = fused;
  const mk::sim::Prediction p = mk::sim::predict(s, st.topo, st.profile, simOptions(o, wantTrace));
  std::printf("predicted: %s  %.1f TFLOP/s per GPU\n", mk::formatMicros(p.totalUs).c_str(),
              p.totalUs > 0 ? mk::fusedFlops(plan.spec) / st.nRanks / (p.totalUs * 1e6) : 0.0);
  std::printf("closed form: %s (predicted / closed form = %.3f): %s\n", mk::formatMicros(plan.estimate.totalUs).c_str(),
              p.totalUs / plan.estimate.totalUs, plan.estimate.formula.c_str());
  if (info.uncontendedUs)
    std::printf("uncontended: %s (the timeline without link sharing)\n", mk::formatMicros(*info.uncontendedUs).c_str());
  for (const auto& [label, text] : mk::cli::describeFusedCost(plan.estimate, fused.layered, p.totalUs))
    std::printf("%s: %s\n", label.c_str(), text.c_str());
  finishReport(o, s, p, info, wantTrace);
  return 0;
}

}  // namespace mksim
