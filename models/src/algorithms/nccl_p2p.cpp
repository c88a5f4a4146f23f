// mkernel — nccl-p2p: NCCL's point-to-point channels (ncclSend / ncclRecv), for all-to-all and broadcast
// (docs/algorithms-nccl.md, "Point-to-point").
//
// NCCL runs an all-to-all as a group of sends and receives, one per peer, each on its p2p channels; a pipeline
// send of PP is one of them. Its data path is our direct exchange (alltoall_direct.cpp, broadcast_direct.cpp:
// every rank writes each peer's block straight into it), so this generator emits those steps with the
// protocol's puts and is priced as the layered library (layeredProfile). NCCL's p2p runs LL up to
// P2P_LL_THRESHOLD (16 KiB per channel, enqueue.cc of NCCL 2.30.7) and Simple above it: no LL128.
#include "common.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/error.hpp"
#include "nccl_layered.hpp"

namespace mk::detail {
namespace {

template <CollOp Op>
AlgorithmDef makeNcclP2p() {
  return Layered<Op, Algorithm::Direct, Algorithm::NcclP2p>::def(
      "NCCL's p2p sends: the direct exchange with the protocol's puts (LL, Simple), priced as the layered library",
      /*peersTouchUser=*/true);
}

}  // namespace

AlgorithmDef ncclP2p(CollOp op) {
  switch (op) {
    case CollOp::AllToAll: return makeNcclP2p<CollOp::AllToAll>();
    case CollOp::Broadcast: return makeNcclP2p<CollOp::Broadcast>();
    default: break;
  }
  throw Error(ErrorCode::NotFound, std::string("nccl-p2p has no generator for ") + toString(op));
}

}  // namespace mk::detail
