// mkernel — NCCL's topology search and tuning model, as pure functions of the topology (docs/algorithms-nccl.md,
// "Channels across nodes").
//
// Read from NCCL 2.30.7 (github.com/NVIDIA/nccl): src/graph/search.cc (ncclTopoCompute, ncclTopoDupChannels,
// the sm90 speed arrays), src/graph/connect.cc (ncclTopoPostset: the channels doubled once more),
// src/graph/tuning.cc (ncclTopoTuneModel, ncclTopoGetAlgoTime) and src/enqueue.cc (the channel count per op).
// NVLS, CollNet and PAT are not modelled: ncclTune() prices the ring and the tree only.
#pragma once

#include <cstdint>

#include "mk/algorithms/algorithms.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// What NCCL's topology search gives a communicator of `nNodes` nodes of one node type.
struct NcclGraph {
  uint32_t rings = 1;      ///< ring graph channels (graphs[RING]->nChannels): one per NIC across nodes
  uint32_t channels = 1;   ///< the communicator's channels (comm->nChannels) after ncclTopoPostset's doubling
  double bwIntraGBs = 0;   ///< ring graph bandwidth per channel inside a node (graph->bwIntra)
  double bwInterGBs = 0;   ///< ring graph bandwidth per channel across nodes (graph->bwInter)
  uint32_t railRings = 1;  ///< distinct ring orders the channels use (rings, at most one per local GPU)
  uint32_t nNodes = 1;
  uint32_t compCapIndex = 2;  ///< NCCL's tuning-table row: 0 Volta, 1 Ampere, 2 Hopper, 3 Blackwell
};

/// NCCL's ring graph on `nNodes` nodes of `node` (search.cc): across nodes one ring per NIC at the fastest sm90
/// speed a NIC carries (the search stops once every NIC holds one), doubled when that speed allows
/// (ncclTopoDupChannels), then doubled again by ncclTopoPostset (at most 64, MAXCHANNELS); on one node one
/// ring per GPU at the NVLink speed. Throws Error(InvalidArgument) for nNodes == 0 or a node without GPUs.
NcclGraph ncclTopoGraph(const NodeSpec& node, uint32_t nNodes);

/// Channels NCCL runs one op of `bytes` with (enqueue.cc): comm->nChannels, less one while bytes <
/// channels x threads x the protocol's per-thread threshold (LL: 8 x nRanks, LL128: 8, Simple: 64 bytes).
uint32_t ncclOpChannels(const NcclGraph& g, Protocol proto, uint64_t bytes, uint32_t nRanks) noexcept;

/// NCCL's own prediction of one op (tuning.cc): the algorithm and protocol its tuner picks and the time it
/// predicts for them, latency + bytes / bandwidth.
struct NcclTuning {
  Algorithm algo = Algorithm::NcclRing;
  Protocol proto = Protocol::Simple;
  uint32_t channels = 1;  ///< ncclOpChannels of the pick
  double timeUs = 0;      ///< what NCCL's tuner predicts for the pick
};

/// NCCL's tuner time of (`algo`, `proto`) for `op` of `bytes` (opBytes) on `nRanks` ranks over g.nNodes nodes,
/// µs; negative where NCCL does not offer the pair (the tree is all-reduce only). `netLatencyUs`: the NIC's
/// latency NCCL adds per inter-node step (graph->latencyInter).
double ncclAlgoTimeUs(const NcclGraph& g, CollOp op, Algorithm algo, Protocol proto, uint64_t bytes, uint32_t nRanks,
                      double netLatencyUs = 0);

/// The pair of {nccl-ring, nccl-tree} x {LL, LL128, Simple} with the lowest ncclAlgoTimeUs (the first on ties,
/// in that order). Throws Error(NotFound) for an op NCCL's ring does not run (all-to-all, send/recv: p2p).
NcclTuning ncclTune(const NcclGraph& g, CollOp op, uint64_t bytes, uint32_t nRanks, double netLatencyUs = 0);

}  // namespace mk
