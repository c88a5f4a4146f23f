#include "mk/algorithms/request.hpp"

#include <algorithm>

#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"

namespace mk {
namespace {
bool perRankBlock(CollOp op) noexcept {
  return op == CollOp::AllGather || op == CollOp::ReduceScatter || op == CollOp::AllToAll;
}
}  // namespace

uint64_t countForBytes(CollOp op, uint64_t bytes, DType dtype, uint32_t nRanks) noexcept {
  const uint64_t elems = bytes / dtypeSize(dtype);
  return perRankBlock(op) ? (nRanks ? elems / nRanks : 0) : elems;
}

uint64_t minBytesFor(CollOp op, DType dtype, uint32_t nRanks) noexcept {
  return dtypeSize(dtype) * (perRankBlock(op) ? nRanks : 1);
}

uint64_t requireCountForBytes(CollOp op, uint64_t bytes, DType dtype, uint32_t nRanks) {
  const uint64_t count = countForBytes(op, bytes, dtype, nRanks);
  if (count == 0)
    throw Error(ErrorCode::InvalidArgument, "--bytes " + std::to_string(bytes) + " holds less than one " +
                                                toString(dtype) + " element per rank (need at least " +
                                                std::to_string(minBytesFor(op, dtype, nRanks)) + " bytes)");
  return count;
}

CollectiveRequest parseCollective(const CollectiveArgs& a) {
  CollectiveRequest r;
  r.spec.op = requireCollOp(a.op, "--op");
  r.spec.dtype = requireDType(a.dtype, "--dtype");
  r.spec.redop = requireRedOp(a.redop, "--redop");
  r.spec.root = a.root;
  if (a.algo != "auto") {
    r.algo = requireAlgorithm(r.spec.op, a.algo);
    r.spec.algo = *r.algo;
  }
  const auto inter = parseInterPhase(a.inter);
  if (!inter) throw Error(ErrorCode::InvalidArgument, "unknown --inter '" + a.inter + "' (expected ring, rhd, auto)");
  r.gen.inter = *inter;
  // "auto" takes the size table's chunks and channels unless they were asked for, as the engine does.
  r.gen.chunks = r.algo || a.chunksGiven ? a.chunks : 0;
  r.gen.channels = r.algo || a.channelsGiven ? a.channels : 0;
  return r;
}

Profile profileFor(const CollectiveArgs& a, const Topology& topo) {
  return a.profile.empty() ? defaultProfile(topo) : loadProfile(a.profile);
}

Placement placeRanks(const std::string& cluster, uint32_t nodes, uint32_t ranks, uint32_t minNodes) {
  Placement p;
  p.topo = loadTopology(cluster, 0);
  const uint32_t perNode = p.topo.node.gpus;
  uint32_t want = nodes ? nodes : std::max(p.topo.nodes, minNodes);
  if (!nodes && ranks > want * perNode) want = (ranks + perNode - 1) / perNode;
  if (want != p.topo.nodes) p.topo = loadTopology(cluster, want);
  p.nRanks = ranks ? ranks : p.topo.totalGpus();
  if (p.nRanks > p.topo.totalGpus())
    throw Error(ErrorCode::InvalidArgument,
                "--ranks " + std::to_string(p.nRanks) + " does not fit the cluster: " + p.topo.name + " x " +
                    std::to_string(p.topo.nodes) + " node(s) has " + std::to_string(p.topo.totalGpus()) + " GPUs");
  return p;
}

}  // namespace mk
