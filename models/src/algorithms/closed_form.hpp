// mkernel — internal: the vocabulary every generator's closed form is written in (docs/cost-model.md; the
// derivations are in docs/algorithms-allreduce.md and docs/algorithms-collectives.md).
//
// Every closed form is the longest path through the lanes of the uncontended timeline (cost.hpp,
// simulateUncontended) of the schedule its generator emits, evaluated without building that schedule: a lane
// runs its steps back to back, every step costs alpha + bytes / (bw / share) (rule 3 of StepCosts), and a
// rank's share of a resource is the number of its lanes using it, i.e. the channel count C' = min(C, count).
// Prices are those of the largest piece (channel 0, chunk 0) and, where nodes differ, of the largest node:
// exact for even splits and equal nodes, an upper bound otherwise (the longest path only grows with step
// prices).
//
// A path is built from the prices of single messages with +, a scalar * and "the longer of" (the first on
// ties, so results are deterministic), in one of two forms:
//  * counted (PathCounts under UnitPrices, estimate()): a path holds how many of each message price it
//    takes, alphas and bytes terms apart, and is priced once at the end, so the formula string can print the
//    critical path it found ("critical path = D + 32*t_net"). The all-reduce generators use it; their
//    recurrences (ring lattice, hierarchical, rhd) compare thousands of paths and stay exact in counts.
//  * priced (Term under ChunkPrices, ChunkPrices::finish()): a path holds microseconds in its latency,
//    bandwidth and reduce parts, added as it is built; the gather/scatter family uses it.
// The two forms add the same terms in a different order, so they round differently in the last bit: each
// family keeps its own form so that every prediction stays identical to the digit.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>

#include "builder.hpp"

namespace mk::detail {

// ---- what a formula reads ----------------------------------------------------------------------------------

/// The largest channel part (channel 0) and the node-size facts every formula needs.
struct ClosedFormShape {
  uint32_t p = 0;      ///< ranks
  uint32_t nodes = 0;  ///< M
  uint32_t gMax = 0;   ///< largest node (G)
  uint32_t gMin = 0;   ///< smallest node
  bool evenNodes = true;
  Range part0;  ///< channel 0's part of [0, count)
};
ClosedFormShape shapeOf(const CostContext& c);

/// Non-empty chunks of a piece of `size` elements: min(size, chunks).
double chunkCount(uint64_t size, uint32_t chunks);

// ---- counted paths -------------------------------------------------------------------------------------------

/// Unit prices of the four kinds of message one step moves, for the largest piece.
struct UnitPrices {
  double bytes = 0;  ///< payload of one piece
  double share = 1;  ///< lanes of one rank sharing each resource (the channel count)
  double nvLat = 0, nvBw = 0, netLat = 0, netBw = 0, redLat = 0, redBw = 0, copyLat = 0, copyBw = 0, flag = 0,
         dispatch = 0;
  /// A network message lands this long after its lane time (netLat + netBw) ends: proxyLandsAfterUs.
  double netLand = 0;
  double nv() const { return nvLat + nvBw; }
  double net() const { return netLat + netBw; }
  double red() const { return redLat + redBw; }
  double copy() const { return copyLat + copyBw; }
};

/// A path through the timeline as counts of unit prices. Latency (alpha) and bytes terms are counted apart:
/// most messages carry one piece (both counts grow together), but hierarchical's phase-1/3 messages carry a
/// group of g units in one or two pieces (g bytes terms, one or two alphas).
/// A network message's lane time (netA, netB) and its landing (netL: counted where another lane waits for it).
struct PathCounts {
  double nvA = 0, nvB = 0, netA = 0, netB = 0, redA = 0, redB = 0, copyA = 0, copyB = 0, flag = 0, netL = 0;
  double value(const UnitPrices& u) const {
    return nvA * u.nvLat + nvB * u.nvBw + netA * u.netLat + netB * u.netBw + redA * u.redLat + redB * u.redBw +
           copyA * u.copyLat + copyB * u.copyBw + flag * u.flag + netL * u.netLand;
  }
};
PathCounts operator+(PathCounts a, const PathCounts& b);
PathCounts operator*(double k, PathCounts a);
/// One message of each class: an NVLink put, a proxy put, a local reduce, a local copy.
PathCounts nvMsg();
PathCounts netMsg();
PathCounts redMsg();
PathCounts copyMsg();
/// The landing of a network message after its lane time: what a lane waiting for it pays on top (netLand).
PathCounts netLands();
/// One signal between lanes of one GPU (F: a reducer lane signalling a lane of its own GPU).
PathCounts flagHop();
/// An NVLink message of `units` units in `pieces` steps.
PathCounts nvGroup(double pieces, double units);
/// A network message of `units` units in `pieces` steps.
PathCounts netGroup(double pieces, double units);
/// Local reductions of `units` units in `pieces` steps.
PathCounts redGroup(double pieces, double units);

/// Chooses the longer of paths under fixed unit prices (the first on ties, so results are deterministic).
class Longest {
 public:
  explicit Longest(const UnitPrices* u) : u_(u) {}
  PathCounts operator()(const PathCounts& a, const PathCounts& b) const { return b.value(*u_) > a.value(*u_) ? b : a; }
  PathCounts operator()(std::initializer_list<PathCounts> all) const {
    PathCounts best = *all.begin();
    for (const auto& c : all) best = (*this)(best, c);
    return best;
  }

 private:
  const UnitPrices* u_;
};

/// The least fraction of profile.network.bwGBs a sending rank gets from its node's shared NICs
/// (rankNetworkShares) while every rank sends (`ringEdges` false) or only the ranks whose ring successor is on
/// another node (true: the flat rings); 1 on one node.
double networkShare(const CostContext& c, bool ringEdges);
/// The bytes term of one network message of `messageBytes` on a rank whose network lanes number `share`: its
/// wire bytes (transportEfficiency) at the lane's part of the shared network rate.
double networkMessageUs(const CostContext& c, double messageBytes, double share, bool ringEdges);

/// Prices for pieces of `elems` elements of the spec's dtype; throws Error(InvalidArgument) for a profile
/// rate they need that is not > 0 (the network's only when `needsNet`). `ringEdges`: only the ranks whose ring
/// successor is on another node send over the network (networkShare).
UnitPrices unitPrices(const CostContext& c, uint64_t elems, bool needsNet, bool ringEdges = false);

/// Fill a CostEstimate from the critical path; `symbolic` is the algorithm's formula.
CostEstimate estimate(const UnitPrices& u, const PathCounts& path, const std::string& symbolic);

/// The all-reduce of one rank: a copy of its part, "p = 1: D + t_copy(n/C)".
CostEstimate costLocalCopy(const CostContext& c, const ClosedFormShape& s);

/// The longest path of the all-reduce ring's lattice over the ranks of `g` in rank order, `k` chunks per block
/// (allreduce_ring.cpp; the hierarchical all-reduce with one rank per node is this ring over its nodes).
PathCounts ringLongest(const UnitPrices& u, const GenContext& g, double k);

// ---- priced paths --------------------------------------------------------------------------------------------

/// A time split into its alpha (latency), beta (bandwidth) and gamma (reduction) parts.
struct Term {
  double lat = 0, bw = 0, red = 0;
  double total() const { return lat + bw + red; }
  Term operator+(const Term& o) const { return Term{lat + o.lat, bw + o.bw, red + o.red}; }
  Term operator*(double f) const { return Term{lat * f, bw * f, red * f}; }
};

/// The longest of `terms` (the first on ties).
Term maxOf(std::initializer_list<Term> terms);

/// Sizes and per-chunk prices of the gather/scatter family's formulas. With C' channels each rank runs C'
/// lanes per resource, so every transfer gets 1/C' of its link (rule 2).
struct ChunkPrices {
  const CostContext& c;
  double channels = 1;  ///< C'
  double chunks = 1;    ///< K' of the largest part
  double partBytes = 0, chunkBytes = 0;
  Term t0, nvl, net, copy, reduce;  ///< dispatch; one chunk over NVLink / network; copy of a part; reduce of a chunk
  Term netLand;                     ///< a network chunk lands this long after its lane time (net) ends
  Term netRing;                     ///< one chunk over the network when only the ranks of ring edges across nodes send
  Term nvlRing;                     ///< one chunk over NVLink on a ring (nvl; fewer lanes under rail rings)

  explicit ChunkPrices(const CostContext& ctx);
  /// `n` network chunks back to back on one lane until the last has landed (0 for none).
  Term netSends(double n) const { return n > 0 ? net * n + netLand : Term{}; }
  /// "p=8 M=2 G=4 n=4096B C=1 K=1 nc=4096B ...": the symbols every formula string uses (G = largest node).
  std::string symbols() const;
  /// The estimate of the path t0 + `critical`, with `formula`, the symbols and the total as its text.
  CostEstimate finish(const Term& critical, const std::string& formula) const;
};

/// Ranks of a ring in rank order that stand for all (rank i for every rank i + m*count): G with equal
/// node-major nodes (the ranks of one local index run the same times, their successors alike), else every
/// rank up to kExactRingRanks; beyond that one representative, its own predecessor, that prices every hop as
/// the slowest class present and lands every send (`bound`: an upper bound, O(p K) instead of O(p^2 K)).
struct RingReps {
  uint32_t count = 1;
  bool bound = false;
  /// Whether representative i's send crosses nodes (in a bound: whether any send does).
  bool crosses(const GenContext& g, uint32_t i) const;
  /// Whether representative i's send stays on its node (in a bound: whether any send does).
  bool stays(const GenContext& g, uint32_t i) const;
};
inline constexpr uint32_t kExactRingRanks = 1024;
RingReps ringRepresentatives(const GenContext& g);

/// The ring flow line of the gather/scatter rings: every rank's one lane runs p-1 steps of K chunks, chunk c of
/// step s (s >= 1) once that chunk of step s-1 has landed from its predecessor, then (`reduces`) a Reduce, then
/// its hop (T_nvl, or T_net to another node, landing netLand later); it ends with the last step's arrivals
/// (reduced into output when `reduces`). Evaluated over ringRepresentatives: exact for equal node-major nodes
/// and up to kExactRingRanks ranks otherwise, an upper bound beyond; O(representatives x p x K).
Term ringFlowLine(const ChunkPrices& x, bool reduces);

}  // namespace mk::detail
