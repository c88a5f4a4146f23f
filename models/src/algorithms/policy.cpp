#include "mk/algorithms/policy.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "mk/algorithms/nccl.hpp"
#include "mk/error.hpp"

namespace mk {

namespace {

/// Nodes of the placement of `nRanks` ranks on `topo`; 1 when they do not fit it (the closed forms then refuse).
uint32_t nodesOf(const Topology& topo, uint32_t nRanks) {
  std::vector<uint32_t> nodeOf;
  try {
    nodeOf = topo.layout(nRanks);
  } catch (const Error&) {
    return 1;
  }
  std::vector<uint32_t> sorted(nodeOf);
  std::sort(sorted.begin(), sorted.end());
  return static_cast<uint32_t>(std::unique(sorted.begin(), sorted.end()) - sorted.begin());
}

/// Hierarchical all-reduce: from this many nodes on, at most kLargeHierChunks chunks on a power-of-two node count
/// and kLargeHierOddChunks on others (policy.hpp).
constexpr uint32_t kLargeHierNodes = 512;
constexpr uint32_t kLargeHierChunks = 4;
constexpr uint32_t kLargeHierOddChunks = 6;

}  // namespace

GenOptions defaultGenOptions(CollOp op, Algorithm algo, uint64_t bytes, uint32_t nRanks, uint32_t nodes) noexcept {
  constexpr uint64_t MiB = uint64_t{1} << 20;
  GenOptions g;
  g.channels = 1;
  g.chunks = bytes >= 64 * MiB ? 8 : bytes >= 4 * MiB ? 4 : bytes >= MiB ? 2 : 1;
  if (op == CollOp::AllReduce && algo == Algorithm::TwoShot) {
    const uint64_t shard = bytes / std::max<uint32_t>(nRanks, 1);
    g.chunks = std::min(g.chunks, static_cast<uint32_t>(std::clamp<uint64_t>(shard / (16 * MiB), 2, 4)));
  }
  if (op == CollOp::AllReduce && algo == Algorithm::Hierarchical && nodes >= kLargeHierNodes)
    g.chunks = std::min(g.chunks, (nodes & (nodes - 1)) == 0 ? kLargeHierChunks : kLargeHierOddChunks);
  return g;
}

AlgorithmChoice chooseAlgorithm(CollOp op, uint64_t count, DType dtype, const Topology& topo, uint32_t nRanks,
                                const Profile& profile) {
  const std::vector<Algorithm> algos = algorithmsFor(op);
  if (algos.empty()) throw Error(ErrorCode::NotFound, std::string("no generator exists for ") + toString(op));
  CollectiveSpec spec;
  spec.op = op;
  spec.count = count;
  spec.dtype = dtype;
  const uint64_t bytes = opBytes(spec, nRanks);
  const uint32_t nodes = nodesOf(topo, nRanks);
  std::optional<AlgorithmChoice> best;
  for (Algorithm a : algos) {
    spec.algo = a;
    const GenOptions gen = defaultGenOptions(op, a, bytes, nRanks, nodes);
    try {
      const double t = closedForm(spec, gen, topo, nRanks, profile).totalUs;
      if (std::isfinite(t) && (!best || t < *best->closedFormUs)) best = AlgorithmChoice{a, gen, t};
    } catch (const Error&) {
      // No closed form for this generator (or it does not apply here): not a candidate.
    }
  }
  if (best) return *best;
  return AlgorithmChoice{algos.front(), defaultGenOptions(op, algos.front(), bytes, nRanks, nodes), std::nullopt};
}

CollectivePlan planCollective(CollectiveSpec spec, std::optional<Algorithm> algo, GenOptions gen, const Topology& topo,
                              uint32_t nRanks, const Profile& profile) {
  CollectivePlan plan;
  plan.chosenByAuto = !algo;
  spec.algo = algo ? *algo : chooseAlgorithm(spec.op, spec.count, spec.dtype, topo, nRanks, profile).algo;
  const GenOptions table =
      isLayered(spec.algo)
          ? layeredGenOptions(spec.op, spec.algo, gen.protocol, opBytes(spec, nRanks), nRanks, topo)
          : defaultGenOptions(spec.op, spec.algo, opBytes(spec, nRanks), nRanks, nodesOf(topo, nRanks));
  if (gen.chunks == 0) gen.chunks = table.chunks;
  if (gen.channels == 0) gen.channels = table.channels;
  gen.inter = resolveInter(spec, topo.layout(nRanks), gen, profile);
  gen.protocol = resolveProtocol(spec, topo.layout(nRanks), gen, profile);
  plan.spec = spec;
  plan.gen = gen;
  return plan;
}

}  // namespace mk
