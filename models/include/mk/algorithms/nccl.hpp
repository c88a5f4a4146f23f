// mkernel — the layered baseline: what NCCL does, as ordinary schedules (docs/algorithms-nccl.md).
//
// Capacity planning compares our fused operators with what users run today, a layered library: NCCL launches one
// kernel per GPU per op and moves data with a ring (pipelined slices over channels) or a tree (a chain inside a
// node, a double binary tree across nodes), each with one of three protocols chosen by size (LL, LL128,
// Simple). The nccl-ring and nccl-tree generators emit that structure as Schedules, with the protocol as the puts'
// cost flavour (kStepLL, kStepLL128); the same timeline, SimGrid replay and closed forms price them. They are not
// candidates of our `auto` (policy.hpp): our engine does not run them as NCCL does.
#pragma once

#include <cstdint>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/cost/cost.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// Whether `a` is one of the layered (nccl-*) algorithms.
bool isLayered(Algorithm a) noexcept;

/// The layered algorithms that exist for `op`, in the order chooseLayered() considers them: nccl-ring for
/// allreduce, allgather and reducescatter, then nccl-tree for allreduce (NCCL's tree is an all-reduce only);
/// nccl-p2p (NCCL's point-to-point sends) for alltoall and broadcast.
std::vector<Algorithm> layeredAlgorithmsFor(CollOp op);

/// Whether layered algorithm `a` runs protocol `p`: every one but LL128 on nccl-p2p (NCCL's p2p runs LL or Simple).
bool layeredRuns(Algorithm a, Protocol p) noexcept;

/// Step::flags protocol bits of `p` (kStepLL, kStepLL128; none for Simple and Auto).
uint8_t protocolFlags(Protocol p) noexcept;

/// `p` as the nccl-* algorithms of protocol `proto` (concrete) are priced with: an op starts after
/// LayeredCosts' fixed cost of a kernel of that protocol (dispatchUs = nccl.base*Us), and no engine-specific
/// completion term (peerUserUs 0). The host's launches are not in it: layeredOpUs() adds them.
Profile layeredProfile(const Profile& p, Protocol proto);

/// Time per op of back-to-back layered ops when one host thread launches a kernel on each of `launchesPerOp`
/// GPUs for every op (mk-bench and nccl-tests -g N: the GPUs of the node; one process per GPU: 1): the host
/// runs NCCL's enqueue, plan and launch path for every GPU, launchesPerOp x (nccl.hostOpUs + nccl.groupGpuUs) per
/// op, while the GPUs run the previous op, so the slower of the two sets the pace. `gpuUs` is the op's modelled
/// time under layeredProfile().
double layeredOpUs(double gpuUs, const Profile& p, uint32_t launchesPerOp) noexcept;

/// Chunks and channels of nccl-* at `bytes` (opBytes) on `nRanks` ranks: the engine's size rule
/// (defaultGenOptions), so that both sides of a fused-vs-layered comparison pipeline alike.
GenOptions layeredGenOptions(CollOp op, Algorithm algo, Protocol proto, uint64_t bytes, uint32_t nRanks) noexcept;

/// Chunks and channels of nccl-* at `bytes` on `nRanks` ranks of `topo` (placed node-major): on one node the
/// engine's channels, and for nccl-ring chunks of NCCL's 512 KiB steps per channel of ncclOpChannels (at most the
/// engine's chunks); with one rank per node and for nccl-p2p the engine's rule above; across nodes nccl-ring and
/// nccl-tree run NCCL's channels (ncclOpChannels of ncclTopoGraph, nccl_topo.hpp, for `proto`, Simple's rule for Auto):
/// one schedule channel per distinct rail ring (NCCL's duplicated channels of one ring share its lanes: the same
/// rates), two per NIC for the tree; chunks: a block in NCCL's 512 KiB steps, at most the engine's chunks.
GenOptions layeredGenOptions(CollOp op, Algorithm algo, Protocol proto, uint64_t bytes, uint32_t nRanks,
                             const Topology& topo);

/// The protocol `opt.protocol` stands for when nccl-* `spec` is generated on `nodeOf`: itself when concrete,
/// else the one whose closed form under layeredProfile(profile, that protocol) is lowest (Simple on ties);
/// `opt.protocol` unchanged for an algorithm that is not nccl-* (which ignores it).
Protocol resolveProtocol(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                         const Profile& profile);

/// What "nccl auto" runs (NCCL's tuner, modelled): the algorithm and protocol with the lowest modelled time.
struct LayeredChoice {
  Algorithm algo = Algorithm::NcclRing;
  GenOptions gen;           ///< layeredGenOptions, protocol concrete
  double closedFormUs = 0;  ///< its closed form under layeredProfile(profile, gen.protocol)
};

/// The pairs of layeredAlgorithmsFor(op) x {LL, LL128, Simple} whose closed form under layeredProfile() is
/// within `spread` times the lowest one, lowest first (the earlier pair on ties): the candidates a model of NCCL's
/// tuner cannot separate by closed forms alone (the tree's is an estimate). Throws as chooseLayered().
std::vector<LayeredChoice> layeredCandidates(CollOp op, uint64_t count, DType dtype, const Topology& topo,
                                             uint32_t nRanks, const Profile& profile, double spread = 1.5);

/// Of layeredAlgorithmsFor(op) x {LL, LL128, Simple}, the pair whose closed form under layeredProfile() is the
/// lowest (the first on ties, in that order); on up to 256 ranks, the pairs whose closed form is within 1.5x of
/// that lowest one are decided by their uncontended timeline instead (the tree's closed form is an estimate).
/// Throws Error(NotFound) when no layered algorithm exists for `op`.
LayeredChoice chooseLayered(CollOp op, uint64_t count, DType dtype, const Topology& topo, uint32_t nRanks,
                            const Profile& profile);

/// `--algo nccl`: what NCCL itself runs for `spec` on `nRanks` ranks of `topo` (placed node-major). All-reduce,
/// all-gather and reduce-scatter: the algorithm and protocol of NCCL's tuner (ncclTune over ncclTopoGraph,
/// nccl_topo.hpp; among the pairs of protocol gen.protocol where it is concrete); all-to-all and broadcast: NCCL's
/// p2p (nccl-p2p), LL up to 16 KiB per peer, Simple above. gen.chunks and gen.channels that are 0 become
/// layeredGenOptions'. Throws Error(InvalidArgument) for nRanks that do not fit `topo`.
CollectivePlan planNccl(CollectiveSpec spec, GenOptions gen, const Topology& topo, uint32_t nRanks,
                        const Profile& profile);

}  // namespace mk
