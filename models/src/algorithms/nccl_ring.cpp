// mkernel — nccl-ring: NCCL's ring (docs/algorithms-nccl.md), for all-reduce, all-gather and reduce-scatter.
//
// NCCL's ring is our ring's structure: rank r sends to r + 1, the all-reduce as a reduce-scatter then an
// all-gather, every block cut into slices that follow each other around the ring, channels on disjoint parts of
// the data. So this generator emits the ring generator's steps (allreduce_ring.cpp, allgather_ring.cpp,
// reducescatter_ring.cpp) with two differences: its puts carry the protocol bits (kStepLL, kStepLL128; none for
// Simple), and it is priced as the layered library: layeredProfile() (NCCL's per-kernel cost, Simple's put
// latency, the reduction fused into the receive). Its closed form is the ring's, under that profile and the
// protocol's put price (protocolView).
#include "closed_form.hpp"
#include "common.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"

namespace mk::detail {
namespace {

template <CollOp Op>
const AlgorithmDef& ringOf() {
  static const AlgorithmDef& def = findAlgorithm(Op, Algorithm::Ring);
  return def;
}

template <CollOp Op>
void setupNcclRing(ScheduleBuilder& b, GenContext& ctx) {
  ctx.putFlags = protocolFlags(ctx.opt.protocol);
  ctx.railRings = railRingsApply(ctx);
  if (ringOf<Op>().setup) ringOf<Op>().setup(b, ctx);
}

template <CollOp Op>
void emitNcclRing(ScheduleBuilder& b, const GenContext& ctx, uint32_t channel, Range part) {
  ringOf<Op>().emit(b, ctx, channel, part);
}

template <CollOp Op>
CostEstimate costNcclRing(const CostContext& c) {
  const Protocol proto = c.opt.protocol == Protocol::Auto ? Protocol::Simple : c.opt.protocol;
  const Profile view = protocolView(layeredProfile(c.profile, proto), protocolFlags(proto));
  GenContext rails = c.gen;
  rails.railRings = railRingsApply(rails);
  CostEstimate e = ringOf<Op>().cost(CostContext{c.spec, c.opt, c.topo, rails, view});
  e.formula = std::string("nccl-ring/") + toString(proto) + ": " + e.formula;
  return e;
}

template <CollOp Op>
AlgorithmDef makeNcclRing() {
  return {Op,
          "nccl-ring",
          "NCCL's ring: the ring's steps with the protocol's puts (LL, LL128, Simple), priced as the layered library",
          setupNcclRing<Op>,
          emitNcclRing<Op>,
          costNcclRing<Op>,
          /*peersTouchUser=*/false};
}

}  // namespace

AlgorithmDef ncclRing(CollOp op) {
  switch (op) {
    case CollOp::AllReduce: return makeNcclRing<CollOp::AllReduce>();
    case CollOp::AllGather: return makeNcclRing<CollOp::AllGather>();
    case CollOp::ReduceScatter: return makeNcclRing<CollOp::ReduceScatter>();
    default: break;
  }
  throw Error(ErrorCode::NotFound, std::string("nccl-ring has no generator for ") + toString(op));
}

}  // namespace mk::detail
