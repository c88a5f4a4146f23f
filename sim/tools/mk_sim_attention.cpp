// mk-sim --op ring-attention [--backward]: ring attention (context parallelism, mk/algorithms/attention.hpp), the key /
// value blocks travelling around the ring while each rank computes attention against the block it holds (backward:
// with their dK / dV accumulators, each rank adding its attention-grad contribution), replayed.
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/attention.hpp"
#include "mk/util/format.hpp"
#include "mk/util/progress.hpp"
#include "mk_sim_common.hpp"

namespace mksim {

int runAttention(const Options& o) {
  if (!o.sweep.empty())
    bad("--sweep sizes a collective by --bytes; ring-attention has one shape (--seq, --heads, --head-dim)");
  if (!o.extentsIn.empty()) bad("--extents gives runtime extents: ring-attention has none (its blocks are fixed)");
  Setup st = makeSetup(o, nullptr);
  mk::fillCtaDefaults(st.profile, st.topo);
  const mk::RingAttentionSpec spec = mk::cli::attentionSpecOf(o.ops, o.coll, st.profile.sms);
  mk::validateRingAttentionSpec(spec, st.nRanks);
  const mk::Schedule s = mk::withProgress("mk-sim", "generate", o.guard.progressWanted(), [&] {
    const std::vector<uint32_t> nodeOf = st.topo.layout(st.nRanks);
    return o.ops.backward ? mk::generateRingAttentionBackward(spec, nodeOf) : mk::generateRingAttention(spec, nodeOf);
  });
  std::vector<std::pair<std::string, std::string>> lines;
  lines.emplace_back(
      "problem", mk::strprintf("B %u x S %llu tokens (%llu per rank), %u query / %u key-value heads of %u, %s, %s (%s)",
                               spec.batch, static_cast<unsigned long long>(spec.seq),
                               static_cast<unsigned long long>(spec.seq / st.nRanks), spec.qHeads, spec.kvHeads,
                               spec.headDim, mk::toString(spec.dtype),
                               spec.causal ? "causal, zigzag placement" : "no mask", s.info.algo.c_str()));
  if (o.ops.backward)
    lines.emplace_back("pass",
                       "backward: K/V travel with float32 dK/dV accumulators, dQ stays; attention-grad priced "
                       "at 2.5 x the forward's FLOPs");
  lines.emplace_back("split", mk::strprintf("compute lane %u CTAs, send lane 1 (%u SMs: every SM the send lane does "
                                            "not use computes)",
                                            spec.computeCtas, st.profile.sms));
  return runOperator(o, st, s, lines);
}

}  // namespace mksim
