// mkernel — internal: a layered (nccl-*) generator made of one of our generators' steps (nccl_ring.cpp,
// nccl_p2p.cpp): the same emission with the protocol's bits on every put, NCCL's rail rings where the layered
// algorithm is the ring, and the base's closed form under layeredProfile() (costLayered, builder.hpp).
#pragma once

#include "builder.hpp"
#include "mk/algorithms/nccl.hpp"

namespace mk::detail {

/// Layered algorithm `Self` for `Op`, emitting the steps of our generator `Base` (Ring or Direct).
template <CollOp Op, Algorithm Base, Algorithm Self>
struct Layered {
  static constexpr bool kRailRings = Self == Algorithm::NcclRing;

  static const AlgorithmDef& base() {
    static const AlgorithmDef& def = findAlgorithm(Op, Base);
    return def;
  }
  static void setup(ScheduleBuilder& b, GenContext& ctx) {
    ctx.putFlags = protocolFlags(ctx.opt.protocol);
    ctx.railRings = kRailRings && railRingsApply(ctx);
    if (base().setup) base().setup(b, ctx);
  }
  static void emit(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
    base().emit(b, ctx, channel, part);
  }
  static CostEstimate cost(const CostContext& c) { return costLayered(base(), toString(Self), c, kRailRings); }
  /// Its definition; `peersTouchUser` is the base's (not looked up: the registries may still be being built).
  static AlgorithmDef def(const char* summary, bool peersTouchUser) {
    return {Op, toString(Self), summary, setup, emit, cost, peersTouchUser};
  }
};

}  // namespace mk::detail
