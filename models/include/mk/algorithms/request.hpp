// mkernel — from what a user asks on a command line (cluster, nodes, ranks, bytes) to a placement and a count.
//
// Shared by every tool (mk-schedule, mk-sim, ...) so that "--ranks 8 --bytes 1MiB" means the same thing in all.
#pragma once

#include <cstdint>
#include <string>

#include "mk/algorithms/algorithms.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// Count argument of `op` whose larger per-rank buffer holds at most `bytes` (nccl-tests' "size"), rounded down
/// to whole elements — per rank block for allgather, reducescatter and alltoall. 0 when `bytes` holds less than
/// one element (per rank block).
uint64_t countForBytes(CollOp op, uint64_t bytes, DType dtype, uint32_t nRanks) noexcept;

/// Smallest `bytes` for which countForBytes() is at least 1.
uint64_t minBytesFor(CollOp op, DType dtype, uint32_t nRanks) noexcept;

/// Where a request runs.
struct Placement {
  Topology topo;
  uint32_t nRanks = 0;
};

/// The cluster `cluster` (preset or topology file) with `nodes` nodes — 0 means the cluster's own count, grown to
/// hold `ranks` and to at least `minNodes` — and `ranks` ranks placed node-major (0 means every GPU). Throws
/// Error(InvalidArgument) when `ranks` does not fit explicit `nodes`, plus whatever loadTopology throws.
Placement placeRanks(const std::string& cluster, uint32_t nodes, uint32_t ranks, uint32_t minNodes = 0);

}  // namespace mk
