// mkernel — the layered baseline's registry, profile view and "nccl auto" rule (mk/algorithms/nccl.hpp).
#include <algorithm>
#include <cmath>
#include <optional>
#include <string>

#include "builder.hpp"
#include "mk/algorithms/nccl.hpp"
#include "mk/algorithms/nccl_topo.hpp"
#include "mk/algorithms/policy.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/schedule/schedule.hpp"

namespace mk {

namespace detail {
const std::vector<AlgorithmDef>& layeredRegistry() {
  static const std::vector<AlgorithmDef> all = {ncclRing(CollOp::AllReduce), ncclTree(),
                                                ncclRing(CollOp::AllGather), ncclRing(CollOp::ReduceScatter),
                                                ncclP2p(CollOp::AllToAll),   ncclP2p(CollOp::Broadcast)};
  return all;
}
}  // namespace detail

bool isLayered(Algorithm a) noexcept {
  return a == Algorithm::NcclRing || a == Algorithm::NcclTree || a == Algorithm::NcclP2p;
}

bool layeredRuns(Algorithm a, Protocol p) noexcept { return !(a == Algorithm::NcclP2p && p == Protocol::LL128); }

std::vector<Algorithm> layeredAlgorithmsFor(CollOp op) {
  std::vector<Algorithm> out;
  for (const auto& d : detail::layeredRegistry())
    if (d.op == op) out.push_back(*parseAlgorithm(d.name));
  return out;
}

uint8_t protocolFlags(Protocol p) noexcept {
  switch (p) {
    case Protocol::LL: return kStepLL;
    case Protocol::LL128: return kStepLL128;
    default: return 0;
  }
}

Profile layeredProfile(const Profile& p, Protocol proto) {
  Profile v = p;
  // One kernel per op: its fixed cost by protocol takes the place of the resident kernel's dispatch.
  v.dispatchUs = proto == Protocol::LL      ? p.nccl.baseLlUs
                 : proto == Protocol::LL128 ? p.nccl.baseLl128Us
                                            : p.nccl.baseSimpleUs;
  // A plain put is NCCL's Simple protocol step; the engine-specific terms of our puts and ops do not apply.
  v.nvlink.alphaUs = p.simple.latencyUs;
  v.putIssueUs = 0;
  v.userPutUs = 0;
  v.peerUserUs = 0;
  // NCCL reduces inside its receive loop (recvReduceSend): no separate step start-up, no hand-off between lanes.
  v.local.alphaUs = 0;
  v.localFlagUs = 0;
  v.waitUs = 0;  // our interpreter's Wait step; NCCL's waits are inside its protocol loops (their latencies above)
  return v;
}

double layeredOpUs(double gpuUs, const Profile& p, uint32_t launchesPerOp) noexcept {
  return std::max(gpuUs, static_cast<double>(launchesPerOp) * (p.nccl.hostOpUs + p.nccl.groupGpuUs));
}

GenOptions layeredGenOptions(CollOp op, Algorithm algo, Protocol proto, uint64_t bytes, uint32_t nRanks) noexcept {
  (void)algo;
  GenOptions g = defaultGenOptions(op, Algorithm::Ring, bytes, nRanks);
  g.protocol = proto;
  return g;
}

GenOptions layeredGenOptions(CollOp op, Algorithm algo, Protocol proto, uint64_t bytes, uint32_t nRanks,
                             const Topology& topo) {
  GenOptions g = layeredGenOptions(op, algo, proto, bytes, nRanks);
  const uint32_t gpus = std::max<uint32_t>(topo.node.gpus, 1);
  const uint32_t nodes = (nRanks + gpus - 1) / gpus;
  // NCCL's channels spread over the NICs only where a node holds several ranks (equal nodes: the rail rings of
  // nccl-ring, the spread heads of nccl-tree); one rank per node keeps the engine's rule.
  const bool ring = algo == Algorithm::NcclRing;
  constexpr uint64_t kNcclStepBytes = (uint64_t{4} << 20) / 8;
  if (ring && nodes == 1 && nRanks > 1) {
    // One node: one schedule channel stands for NCCL's channels, which split each ring block between them; a
    // block moves in as many pipelined steps as a channel's share needs (NCCL's chunks, below), at most the
    // engine's chunks.
    const NcclGraph graph = ncclTopoGraph(topo.node, 1);
    const uint64_t perChannel =
        bytes / (static_cast<uint64_t>(nRanks) *
                 ncclOpChannels(graph, proto == Protocol::Auto ? Protocol::Simple : proto, bytes, nRanks));
    const uint64_t steps = std::max<uint64_t>(1, (perChannel + kNcclStepBytes - 1) / kNcclStepBytes);
    g.chunks = static_cast<uint32_t>(std::min<uint64_t>(steps, g.chunks));
    return g;
  }
  if (!(ring || algo == Algorithm::NcclTree) || nodes < 2 || gpus < 2 || nRanks % gpus != 0) return g;
  const NcclGraph graph = ncclTopoGraph(topo.node, nodes);
  const uint32_t used = ncclOpChannels(graph, proto == Protocol::Auto ? Protocol::Simple : proto, bytes, nRanks);
  // One schedule channel per rail ring; the tree's channels come in pairs (its two trees) per NIC.
  g.channels = std::max<uint32_t>(1, std::min(used, (ring ? 1 : 2) * graph.railRings));
  // A block of a schedule channel (a ring step's, or the tree's whole part) moves in NCCL's chunks of one step
  // (enqueue.cc): a channel's 4 MiB buffer (DEFAULT_BUFFSIZE, init.cc) over NCCL_STEPS = 8 (device.h). The ring:
  // at most the engine's chunks (its steps grow with ranks x chunks). The tree: at least the engine's chunks (its
  // pipeline is 2 (G - 1 + log2 M) hops deep; NCCL's threads pipeline within a chunk), at most kMaxTreeChunks (its
  // steps grow with chunks only).
  constexpr uint64_t kMaxTreeChunks = 64;
  const uint64_t block = bytes / (static_cast<uint64_t>(g.channels) * (ring ? nRanks : 1));
  const uint64_t steps = std::max<uint64_t>(1, (block + kNcclStepBytes - 1) / kNcclStepBytes);
  g.chunks = static_cast<uint32_t>(ring ? std::min<uint64_t>(steps, g.chunks)
                                        : std::clamp<uint64_t>(steps, g.chunks, kMaxTreeChunks));
  return g;
}

Protocol resolveProtocol(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                         const Profile& profile) {
  // Every other generator ignores the protocol: it is left as given.
  if (opt.protocol != Protocol::Auto || !isLayered(spec.algo)) return opt.protocol;
  const auto& def = detail::findAlgorithm(spec.op, spec.algo);
  static const Topology kNoTopology{};  // the nccl-* closed forms read the placement and the profile only
  Protocol best = Protocol::Simple;
  double bestUs = 0;
  for (Protocol p : {Protocol::Simple, Protocol::LL, Protocol::LL128}) {
    if (!layeredRuns(spec.algo, p)) continue;
    GenOptions o = opt;
    o.protocol = p;
    const detail::GenContext ctx = detail::makeContext(spec, nodeOf, o);
    const double t = def.cost(detail::CostContext{spec, o, kNoTopology, ctx, profile}).totalUs;
    if (p == Protocol::Simple || t < bestUs) {
      best = p;
      bestUs = t;
    }
  }
  return best;
}

std::vector<LayeredChoice> layeredCandidates(CollOp op, uint64_t count, DType dtype, const Topology& topo,
                                             uint32_t nRanks, const Profile& profile, double spread) {
  const std::vector<Algorithm> algos = layeredAlgorithmsFor(op);
  if (algos.empty()) throw Error(ErrorCode::NotFound, std::string("no layered (nccl-*) generator for ") + toString(op));
  CollectiveSpec spec;
  spec.op = op;
  spec.count = count;
  spec.dtype = dtype;
  const uint64_t bytes = opBytes(spec, nRanks);
  std::vector<LayeredChoice> all;
  for (Algorithm a : algos) {
    spec.algo = a;
    for (Protocol p : {Protocol::LL, Protocol::LL128, Protocol::Simple}) {
      if (!layeredRuns(a, p)) continue;
      const GenOptions gen = layeredGenOptions(op, a, p, bytes, nRanks, topo);
      const double t = closedForm(spec, gen, topo, nRanks, profile).totalUs;
      if (std::isfinite(t)) all.push_back(LayeredChoice{a, gen, t});
    }
  }
  if (all.empty()) throw Error(ErrorCode::Internal, std::string("no finite layered closed form for ") + toString(op));
  // Lowest first; the earlier in the (algorithm, protocol) order on ties.
  std::stable_sort(all.begin(), all.end(),
                   [](const LayeredChoice& x, const LayeredChoice& y) { return x.closedFormUs < y.closedFormUs; });
  const double limit = spread * all.front().closedFormUs;
  all.erase(std::remove_if(all.begin() + 1, all.end(), [&](const LayeredChoice& c) { return c.closedFormUs > limit; }),
            all.end());
  return all;
}

LayeredChoice chooseLayered(CollOp op, uint64_t count, DType dtype, const Topology& topo, uint32_t nRanks,
                            const Profile& profile) {
  // The tree's closed form is an estimate (within 0.5-1.5x of its timeline), so a pick by closed forms alone can
  // flip to a slower candidate when a rate changes (a faster NIC then slowed a planned step). Where schedules
  // stay small, the candidates the closed forms cannot separate are decided by their exact uncontended timeline;
  // the choice keeps its closed form for the report.
  constexpr uint32_t kTimelineMaxRanks = 256;
  const std::vector<LayeredChoice> close = layeredCandidates(op, count, dtype, topo, nRanks, profile);
  if (close.size() == 1 || nRanks > kTimelineMaxRanks) return close.front();
  CollectiveSpec spec;
  spec.op = op;
  spec.count = count;
  spec.dtype = dtype;
  const std::vector<uint32_t> nodeOf = topo.layout(nRanks);
  std::optional<double> bestTimeline;
  LayeredChoice pick = close.front();
  for (const LayeredChoice& c : close) {
    spec.algo = c.algo;
    const double t =
        simulateUncontended(generate(spec, nodeOf, c.gen), layeredProfile(profile, c.gen.protocol)).totalUs;
    if (!bestTimeline || t < *bestTimeline) {
      bestTimeline = t;
      pick = c;
    }
  }
  return pick;
}

CollectivePlan planNccl(CollectiveSpec spec, GenOptions gen, const Topology& topo, uint32_t nRanks,
                        const Profile& profile) {
  const std::vector<uint32_t> nodeOf = topo.layout(nRanks);
  const uint64_t bytes = opBytes(spec, nRanks);
  const uint32_t nodes = nodeOf.empty() ? 1 : nodeOf.back() + 1;
  Protocol proto = gen.protocol;
  if (spec.op == CollOp::AllToAll || spec.op == CollOp::Broadcast) {
    spec.algo = Algorithm::NcclP2p;
    // enqueue.cc: LL while a peer's bytes stay within P2P_LL_THRESHOLD (16 KiB) per channel (one channel here).
    constexpr uint64_t kP2pLlThreshold = 16 * 1024;
    const uint64_t perPeer = spec.op == CollOp::AllToAll ? bytes / nRanks : bytes;
    if (proto == Protocol::Auto) proto = perPeer <= kP2pLlThreshold ? Protocol::LL : Protocol::Simple;
  } else {
    const NcclGraph graph = ncclTopoGraph(topo.node, nodes);
    double best = -1;
    for (Algorithm a : {Algorithm::NcclRing, Algorithm::NcclTree})
      for (Protocol p : {Protocol::LL, Protocol::LL128, Protocol::Simple}) {
        if (gen.protocol != Protocol::Auto && p != gen.protocol) continue;
        const double t = ncclAlgoTimeUs(graph, spec.op, a, p, bytes, nRanks, topo.node.nic.latencyUs);
        if (t < 0 || (best >= 0 && t >= best)) continue;
        best = t;
        spec.algo = a;
        proto = p;
      }
    if (best < 0)
      throw Error(ErrorCode::NotFound, std::string("NCCL's tuning model has no algorithm for ") + toString(spec.op));
  }
  const GenOptions table = layeredGenOptions(spec.op, spec.algo, proto, bytes, nRanks, topo);
  if (gen.chunks == 0) gen.chunks = table.chunks;
  if (gen.channels == 0) gen.channels = table.channels;
  gen.protocol = proto;
  gen.inter = resolveInter(spec, nodeOf, gen, profile);
  CollectivePlan plan;
  plan.spec = spec;
  plan.gen = gen;
  return plan;
}

}  // namespace mk
