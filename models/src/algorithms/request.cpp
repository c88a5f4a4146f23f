#include "mk/algorithms/request.hpp"

#include <algorithm>

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

Placement placeRanks(const std::string& cluster, uint32_t nodes, uint32_t ranks, uint32_t minNodes) {
  Placement p;
  p.topo = loadTopology(cluster, 0);
  const uint32_t perNode = p.topo.node.gpus;
  uint32_t want = nodes ? nodes : std::max(p.topo.nodes, minNodes);
  if (!nodes && ranks > want * perNode) want = (ranks + perNode - 1) / perNode;
  if (want != p.topo.nodes) p.topo = loadTopology(cluster, want);
  p.nRanks = ranks ? ranks : p.topo.totalGpus();
  if (p.nRanks > p.topo.totalGpus())
    throw Error(ErrorCode::InvalidArgument, "--ranks " + std::to_string(p.nRanks) + " does not fit the cluster: " +
                                                p.topo.name + " x " + std::to_string(p.topo.nodes) + " node(s) has " +
                                                std::to_string(p.topo.totalGpus()) + " GPUs");
  return p;
}

}  // namespace mk
