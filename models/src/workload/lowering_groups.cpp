// mkernel — rank groups of a lowered step and the context-parallel exchanges (lowering_groups.hpp).
#include "lowering_groups.hpp"

#include <algorithm>

namespace mk::detail {

uint32_t cpA2aRanks(const ParallelLayout& l) noexcept {
  if (l.cpCommType == CpCommType::A2a) return l.cp;
  if (l.cpCommType == CpCommType::A2aP2p) return l.cpA2aSize;
  return 1;
}

StageGroups stageGroups(const ResolvedLayout& r, uint32_t stage, uint32_t a2aSize) {
  const RankGrid grid{r.tp, r.cp, r.dp, r.pp};
  const uint32_t cd = r.cp * r.dp;  // (cp, dp) index j = c + cp d: local rank t + tp j
  const uint32_t ranks = r.tp * cd, base = ranks * stage;
  StageGroups g;
  for (uint32_t j = 0; j < cd; ++j) {
    std::vector<uint32_t> tp;
    for (uint32_t t = 0; t < r.tp; ++t) tp.push_back(base + t + r.tp * j);
    g.tp.instances.push_back(std::move(tp));
  }
  for (uint32_t t = 0; t < r.tp; ++t) {
    std::vector<uint32_t> dp;
    for (uint32_t j = 0; j < cd; ++j) dp.push_back(base + t + r.tp * j);
    g.dp.instances.push_back(std::move(dp));
  }
  // Expert parallelism: ep consecutive (cp, dp) indices of one TP index (Megatron's expert grid with etp = tp,
  // and the layout of earlier versions), or, when ep does not divide dp x cp, ep consecutive ranks of the stage
  // (Megatron's etp-ep-edp grid with etp = 1). The expert data-parallel group: every rank of the stage with the
  // same expert-parallel index (with etp = 1 the TP ranks hold the same whole experts).
  // etp > 1: Megatron's expert grid etp-ep-edp over the stage's ranks, local rank i = e_t + etp (e_e + ep e_d):
  // etp consecutive ranks split one set of experts' columns, the ep ranks at stride etp hold different experts,
  // the edp ranks at stride etp x ep the same expert shard.
  const bool fromCd = r.etp == 1 && cd % r.ep == 0;
  if (r.etp > 1) {
    const uint32_t te = r.etp * r.ep;
    for (uint32_t i0 = 0; i0 < ranks; i0 += r.etp) {
      std::vector<uint32_t> t;
      for (uint32_t k = 0; k < r.etp; ++k) t.push_back(base + i0 + k);
      g.etp.instances.push_back(std::move(t));
    }
    for (uint32_t b0 = 0; b0 < ranks; b0 += te)
      for (uint32_t t = 0; t < r.etp; ++t) {
        std::vector<uint32_t> e;
        for (uint32_t k = 0; k < r.ep; ++k) e.push_back(base + b0 + t + r.etp * k);
        g.ep.instances.push_back(std::move(e));
      }
    g.edp.instances.resize(te);
    for (uint32_t i = 0; i < ranks; ++i) g.edp.instances[i % te].push_back(base + i);
  } else if (fromCd) {
    for (uint32_t t = 0; t < r.tp; ++t)
      for (uint32_t j0 = 0; j0 < cd; j0 += r.ep) {
        std::vector<uint32_t> e;
        for (uint32_t k = 0; k < r.ep; ++k) e.push_back(base + t + r.tp * (j0 + k));
        g.ep.instances.push_back(std::move(e));
      }
  } else {
    for (uint32_t i0 = 0; i0 < ranks; i0 += r.ep) {
      std::vector<uint32_t> e;
      for (uint32_t k = 0; k < r.ep; ++k) e.push_back(base + i0 + k);
      g.ep.instances.push_back(std::move(e));
    }
  }
  if (r.etp == 1) {
    g.edp.instances.resize(r.ep);
    for (uint32_t i = 0; i < ranks; ++i) g.edp.instances[fromCd ? (i / r.tp) % r.ep : i % r.ep].push_back(base + i);
  }
  // Context parallelism: the cp ranks of one (tp, dp) index; a2a+p2p splits them into a2a groups of a2aSize
  // consecutive ranks and rings over the ranks of one position in those groups.
  const uint32_t a = std::max<uint32_t>(1, a2aSize);
  const uint32_t cpGroup = a > 1 ? a : r.cp;
  const uint32_t ringLen = r.cp / a;
  for (uint32_t d = 0; d < r.dp; ++d)
    for (uint32_t t = 0; t < r.tp; ++t) {
      for (uint32_t c0 = 0; c0 < r.cp; c0 += cpGroup) {
        std::vector<uint32_t> c;
        for (uint32_t k = 0; k < cpGroup; ++k) c.push_back(grid.rank(t, c0 + k, d, stage));
        g.cp.instances.push_back(std::move(c));
      }
      // One ring step: every rank sends one block to the next ring position and receives one from the previous.
      // Instances must not share ranks, so a step is priced as the sends of the even positions: the odd
      // positions' sends leave from the GPUs that only received and arrive at those that only sent, over the
      // link directions the even ones leave free (full duplex; docs/planner.md, "Context parallelism").
      if (ringLen > 1)
        for (uint32_t j = 0; j < a; ++j) {
          std::vector<uint32_t> ring;
          for (uint32_t k = 0; k < ringLen; ++k) ring.push_back(grid.rank(t, j + a * k, d, stage));
          g.cpRingRanks.instances.push_back(std::move(ring));
        }
      for (uint32_t c = 0; c < r.cp; ++c) {
        const uint32_t pos = c / a;
        if (ringLen > 1 && pos % 2 == 0 && pos + 1 < ringLen)
          g.cpRing.instances.push_back({grid.rank(t, c, d, stage), grid.rank(t, c + a, d, stage)});
      }
    }
  if (r.pp > 1) {
    const uint32_t from = stage + 1 < r.pp ? stage : stage - 1;
    for (uint32_t i = 0; i < ranks; ++i) g.pp.instances.push_back({ranks * from + i, ranks * (from + 1) + i});
  }
  return g;
}

std::vector<CpExchange> cpExchanges(const ParallelLayout& l, uint64_t tokens, uint64_t qHeads, uint64_t kvHeads,
                                    uint64_t headDim) {
  std::vector<CpExchange> out;
  if (l.cp <= 1) return out;
  const uint64_t kv = 2 * tokens * kvHeads * headDim;  // the rank's K and V
  const uint32_t a = cpA2aRanks(l);
  if (a > 1) {
    // Ulysses: the rank's tokens of every local head are exchanged for all tokens of heads / a: each of the a
    // destinations gets 1 / a of the rank's Q, K and V (before) or of the output (after).
    const uint64_t qkv = (qHeads + 2 * kvHeads) * headDim * tokens / a, o = qHeads * headDim * tokens / a;
    out.push_back({"cp.a2a.qkv", CommKind::AllToAll, Pass::Forward, CommTiming::Blocking, qkv, 1, false});
    out.push_back({"cp.a2a.out", CommKind::AllToAll, Pass::Forward, CommTiming::Blocking, o, 1, false});
    out.push_back({"cp.a2a.out.bwd", CommKind::AllToAll, Pass::Backward, CommTiming::Blocking, o, 1, false});
    out.push_back({"cp.a2a.qkv.bwd", CommKind::AllToAll, Pass::Backward, CommTiming::Blocking, qkv, 1, false});
  }
  if (l.cpCommType == CpCommType::AllGather) {
    // Transformer Engine's all-gather CP gathers K/V again in the backward pass instead of keeping them.
    out.push_back({"cp.ag.kv", CommKind::AllGather, Pass::Forward, CommTiming::Blocking, kv, 1, false});
    out.push_back({"cp.ag.kv.bwd", CommKind::AllGather, Pass::Backward, CommTiming::Blocking, kv, 1, false});
    out.push_back({"cp.rs.dkv", CommKind::ReduceScatter, Pass::Backward, CommTiming::Blocking, kv, 1, false});
  }
  const uint32_t ringLen = cpRingRanks(l);
  if (ringLen > 1) {
    // After the a2a a rank holds T a / cp tokens of kvHeads / a heads: the same K/V elements as without it.
    out.push_back({"cp.ring.kv", CommKind::SendRecv, Pass::Forward, CommTiming::AttentionRing, kv, ringLen - 1, true});
    out.push_back(
        {"cp.ring.kv.bwd", CommKind::SendRecv, Pass::Backward, CommTiming::AttentionRing, 2 * kv, ringLen - 1, true});
  }
  return out;
}

}  // namespace mk::detail

namespace mk {

uint32_t cpRingRanks(const ParallelLayout& l) noexcept {
  const bool ring = l.cpCommType == CpCommType::P2p || l.cpCommType == CpCommType::A2aP2p;
  return ring ? l.cp / detail::cpA2aRanks(l) : 1;
}

}  // namespace mk
