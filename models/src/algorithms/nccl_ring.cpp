// mkernel — nccl-ring: NCCL's ring (docs/algorithms-nccl.md), for all-reduce, all-gather and reduce-scatter.
//
// NCCL's ring is our ring's structure: rank r sends to r + 1, the all-reduce as a reduce-scatter then an
// all-gather, every block cut into slices that follow each other around the ring, channels on disjoint parts of
// the data. So this generator emits the ring generator's steps (allreduce_ring.cpp, allgather_ring.cpp,
// reducescatter_ring.cpp) with two differences: its puts carry the protocol bits (kStepLL, kStepLL128; none for
// Simple), and it is priced as the layered library: layeredProfile() (NCCL's per-kernel cost, Simple's put
// latency, the reduction fused into the receive). Its closed form is the ring's, under that profile and the
// protocol's put price (protocolView). Across nodes, with several ranks on every node, its channels run NCCL's
// rail rings (ringOrder, builder.hpp): each leaves every node by a GPU of its own, so they spread over the NICs.
#include "closed_form.hpp"
#include "common.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/cost/step_cost.hpp"
#include "mk/error.hpp"
#include "nccl_layered.hpp"

namespace mk::detail {
namespace {

template <CollOp Op>
AlgorithmDef makeNcclRing() {
  return Layered<Op, Algorithm::Ring, Algorithm::NcclRing>::def(
      "NCCL's ring: the ring's steps with the protocol's puts (LL, LL128, Simple), priced as the layered library",
      /*peersTouchUser=*/false);
}

}  // namespace

CostEstimate costLayered(const AlgorithmDef& base, const char* name, const CostContext& c, bool railRings) {
  const Protocol proto = c.opt.protocol == Protocol::Auto ? Protocol::Simple : c.opt.protocol;
  const Profile view = protocolView(layeredProfile(c.profile, proto), protocolFlags(proto));
  GenContext gen = c.gen;
  gen.railRings = railRings && railRingsApply(gen);
  CostEstimate e = base.cost(CostContext{c.spec, c.opt, c.topo, gen, view});
  e.formula = std::string(name) + "/" + toString(proto) + ": " + e.formula;
  return e;
}

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
