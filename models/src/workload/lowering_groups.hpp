// mkernel — the rank groups of a lowered step and the context-parallel exchanges around attention (internal to
// the lowering: lowering.cpp, lowering_groups.cpp, lowering_cp.cpp).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "mk/workload/lowering.hpp"

namespace mk::detail {

/// Global rank of (tensor, context, data index, pipeline stage) in Megatron-LM's "tp-cp-ep-dp-pp" order.
struct RankGrid {
  uint32_t tp, cp, dp, pp;
  uint32_t rank(uint32_t t, uint32_t c, uint32_t d, uint32_t s) const { return t + tp * (c + cp * (d + dp * s)); }
};

/// Every group set of one pipeline stage.
struct StageGroups {
  GroupSet tp{"tp", {}};
  GroupSet dp{"dp", {}};           ///< dense gradients: the dp x cp ranks of one TP index (Megatron's DP x CP group)
  GroupSet ep{"ep", {}};           ///< expert parallelism
  GroupSet edp{"edp", {}};         ///< the ranks holding the same experts
  GroupSet etp{"etp", {}};         ///< expert tensor parallelism: the ranks splitting one expert's columns (etp > 1)
  GroupSet pp{"pp", {}};           ///< the boundary this stage sends over
  GroupSet cp{"cp", {}};           ///< context parallelism (a2a+p2p: the a2a groups)
  GroupSet cpRing{"cp.ring", {}};  ///< p2p, a2a+p2p: (sender, receiver) of one step of the K/V ring
  /// p2p, a2a+p2p: every rank of one K/V ring in ring order (where the fused variant's ring-attention runs)
  GroupSet cpRingRanks{"cp.ring.ranks", {}};
};

/// The groups of stage `stage` of `r` (ResolvedLayout); `a2aSize` the a2a+p2p a2a group (0 or 1: none).
StageGroups stageGroups(const ResolvedLayout& r, uint32_t stage, uint32_t a2aSize);

/// One context-parallel exchange of one layer (per micro-batch): what StageBuilder::addComm needs.
struct CpExchange {
  std::string name;
  CommKind kind = CommKind::AllGather;
  Pass pass = Pass::Forward;
  CommTiming timing = CommTiming::Blocking;
  uint64_t count = 0;     ///< in the generators' convention (lowering.hpp, CommOp::count)
  uint32_t perLayer = 1;  ///< runs per layer and micro-batch (ring steps)
  bool ring = false;      ///< over StageGroups::cpRing, else StageGroups::cp
};

/// The exchanges of one layer for layout.cpCommType (docs/planner.md, "Context parallelism"); none with cp 1.
/// `tokens` = the rank's tokens of a micro-batch (T / cp), `qHeads`, `kvHeads` per tensor-parallel rank.
std::vector<CpExchange> cpExchanges(const ParallelLayout& l, uint64_t tokens, uint64_t qHeads, uint64_t kvHeads,
                                    uint64_t headDim);

/// The a2a group size of layout.cpCommType: cp for a2a, cpA2aSize for a2a+p2p, 1 otherwise.
uint32_t cpA2aRanks(const ParallelLayout& l) noexcept;

}  // namespace mk::detail
