// mk-sim --op moe-dispatch-gemm | moe-ffn: a MoE dispatch (per-node deduplication across nodes) fused with each
// receiver's expert GEMMs, or the whole expert FFN with its combine (mk/algorithms/moe.hpp), priced at the routing
// model's expected loads (uniform x --imbalance, capped at the capacity) or at a given routing (--extents), and
// replayed; moe-ffn's return across nodes as --combine names it, auto the shorter replay (mk/sim/moe.hpp).
#include <cstddef>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/moe.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/sim/moe.hpp"
#include "mk/util/format.hpp"
#include "mk/util/progress.hpp"
#include "mk_sim_common.hpp"

namespace mksim {

namespace {

/// moe-ffn's return: the one that runs and why (chosen by the replay, with both predictions; as given; the only one
/// on one node).
std::string combineText(const mk::sim::MoeFfnPlan& plan) {
  if (!plan.multiNode) return "every block to its source (one node: the returns are one schedule)";
  const char* chosen = mk::toString(plan.spec.combineReturn);
  if (!plan.byModel) return std::string(chosen) + " (--combine)";
  const bool summed = plan.spec.combineReturn == mk::MoeCombineReturn::NodeSum;
  return std::string(chosen) + " (--combine auto: the shorter replay, " + mk::formatMicros(plan.chosenUs()) +
         " against " + (summed ? "per-block " : "node-sum ") +
         mk::formatMicros(summed ? plan.perBlockUs : plan.nodeSumUs) + ")";
}

}  // namespace

int runMoe(const Options& o) {
  const bool ffn = o.coll.op == mk::cli::kMoeFfnOp;
  if (!o.sweep.empty())
    bad("--sweep sizes a collective by --bytes; " + o.coll.op + " has one shape (--experts, --topk, --tokens, " +
        "--hidden, " + (ffn ? "--ffn)" : "--out-cols)"));
  const mk::MoeFfnSpec ffnSpec = ffn ? mk::cli::moeFfnSpecOf(o.ops) : mk::MoeFfnSpec{};
  const mk::MoeDispatchGemmSpec spec = ffn ? ffnSpec.dispatch() : mk::cli::moeSpecOf(o.ops);
  Setup st = makeSetup(o, nullptr);
  mk::fillCtaDefaults(st.profile, st.topo);
  if (ffn)
    mk::validateMoeFfnSpec(ffnSpec, st.nRanks);
  else
    mk::validateMoeDispatchGemmSpec(spec, st.nRanks);
  // moe-ffn's return across nodes: the spec's, or the shorter replay of the two by the rule mk-plan applies too.
  mk::sim::MoeFfnPlan plan;
  mk::Schedule s = mk::withProgress("mk-sim", "generate", o.guard.progressWanted(), [&] {
    if (!ffn) return mk::generateMoeDispatchGemm(spec, st.topo.layout(st.nRanks));
    plan = mk::sim::planMoeFfn(ffnSpec, st.topo, st.nRanks, st.profile, simOptions(o, false));
    return std::move(plan.schedule);
  });
  // Priced at the extents' expected values unless a routing is given (mk/schedule/extent.hpp).
  if (!o.extentsIn.empty()) mk::fillCostAttributes(s, mk::loadExtentValues(s, o.extentsIn));

  const uint32_t global = st.nRanks * spec.experts;
  const double uniform = static_cast<double>(spec.tokens) * spec.topk / global;
  // The generator's routing model is the one home of the expected load: read it back from its first expert's extent.
  const int first = mk::extentIndex(s, "to0");
  const double expected = first >= 0 ? s.extents[static_cast<std::size_t>(first)].expected : uniform;
  std::vector<std::pair<std::string, std::string>> lines;
  const std::string expert = ffn ? mk::strprintf("hidden %u -> 2 x %u (SwiGLU) -> %u per expert, combined back",
                                                 spec.hidden, ffnSpec.ffn, spec.hidden)
                                 : mk::strprintf("hidden %u -> %u columns per expert", spec.hidden, spec.outCols);
  lines.emplace_back("problem",
                     mk::strprintf("%u experts per rank (%u in all), top-%u of %u tokens per rank, %s, capacity %u "
                                   "tokens per (rank, expert)%s, %s",
                                   spec.experts, global, spec.topk, spec.tokens, expert.c_str(), spec.capacityOr(),
                                   spec.capacity ? "" : " (--tokens: never drops)", s.info.algo.c_str()));
  if (ffn) lines.emplace_back("combine", combineText(plan));
  if (o.extentsIn.empty())
    lines.emplace_back("routing", mk::strprintf("expected: %.4g tokens per (rank, expert) = uniform %.4g x imbalance "
                                                "%.4g%s (--extents prices a given routing)",
                                                expected, uniform, spec.imbalance,
                                                expected < uniform * spec.imbalance ? ", capped at the capacity" : ""));
  else
    lines.emplace_back("routing", "given: " + o.extentsIn);
  return runOperator(o, st, s, lines);
}

}  // namespace mksim
