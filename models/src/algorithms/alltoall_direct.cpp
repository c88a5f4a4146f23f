// mkernel — all-to-all, direct: rank r puts block j into rank j's output block r, in staggered order: the
// direct exchange of allgather_direct.cpp with per-peer source blocks (docs/algorithms-collectives.md).
#include "closed_form.hpp"
#include "common.hpp"

namespace mk::detail {
namespace {

void emitAllToAllDirect(ScheduleBuilder& b, const GenContext& ctx, uint32_t ch, Range part) {
  emitDirectExchange(b, ctx, ch, part, true);
}

}  // namespace

AlgorithmDef allToAllDirect() {
  return {CollOp::AllToAll, "direct",           "rank r puts block j into rank j's output block r (staggered order)",
          nullptr,          emitAllToAllDirect, costDirectExchange};
}

}  // namespace mk::detail
