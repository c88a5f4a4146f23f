// mkernel — the closed form of the hierarchical all-reduce with a dissemination inter-node phase, bruck or
// bruck-half (docs/algorithms-allreduce.md, "hierarchical, bruck"): the longest path through the lanes of the
// schedule allreduce_hierarchical_bruck.cpp emits, in the same order, without building it.
#include <string>
#include <vector>

#include "allreduce_hierarchical.hpp"

namespace mk::detail {

namespace {

/// The bruck variant's longest path: a max-plus recurrence over the K chunks and the 2J rounds of each, one
/// representative per node (its busiest rank's loads) fed by its partners' representatives, in the order the
/// lanes run their steps (reducer and sender in wavefront order, as rhdLongest; mover: every phase-1 round,
/// then phase 3 chunk by chunk), for either plan. A round's message of c_k blocks costs c_k * ceil(chunk / M) /
/// chunk units and one alpha (an all-gather range of two or more blocks two); the partial goes into the rotated
/// copy in two pieces. Exact when the chunk divides by M and nodes are equal, an upper bound otherwise.
PathCounts bruckLongest(const UnitPrices& u, const BruckPlan& plan, uint32_t K, uint64_t chunkMax,
                        const std::vector<HierNodeLoad>& nodes) {
  const Longest longest(&u);
  const uint32_t M = plan.nodes;
  const uint32_t J = plan.rounds;
  const double blockUnits = double((chunkMax + M - 1) / M) / double(chunkMax);
  const PathCounts zero, land = netLands();
  // Parts 0 and 1 of a chunk (relative blocks [h, M) and [0, h), h = 2^(J-1)): their messages and units.
  // On 2 nodes part 0 is the whole chunk (one NVLink message, two reduce steps) and part 1 empty.
  const uint32_t r0 = plan.firstRound(), c0 = plan.blocks(r0);
  const bool two = M == 2;
  const double partPieces[2] = {two ? 1.0 : c0 >= 2 ? 2.0 : 1.0, two ? 0.0 : M - c0 >= 2 ? 2.0 : 1.0};
  const double partUnits[2] = {two ? 1.0 : c0 * blockUnits, two ? 0.0 : (M - c0) * blockUnits};
  const uint32_t h = plan.distance(J - 1);
  const double reducePieces[2] = {
      two ? 2.0 : partPieces[0],
      plan.swapped() ? (M - h >= 2 ? 2.0 : 1.0) + (plan.distance(J - 2) >= 2 ? 2.0 : 1.0) : partPieces[1]};
  PathCounts partCopy[2];  // a part of the input into the rotated copy (a node of one rank)
  for (const uint32_t w : {0u, 1u}) {
    partCopy[w].copyA = reducePieces[w];
    partCopy[w].copyB = partUnits[w];
  }
  struct Chunk {
    std::vector<PathCounts> ready, send;  ///< after reducer stage s; the end of sender stage s
  };
  struct Node {
    PathCounts red, snd, mu, arrivals;
    std::vector<Chunk> chunk;
  };
  std::vector<Node> st(M);
  // Phase 1 through part 0 of chunk t (roundsA) and through all of it (rounds).
  std::vector<std::vector<PathCounts>> roundsA(M, std::vector<PathCounts>(K)), rounds = roundsA;
  for (uint32_t n = 0; n < M; ++n) {
    st[n].chunk.assign(K, Chunk{std::vector<PathCounts>(J + 1), std::vector<PathCounts>(2 * J)});
    for (uint32_t t = 0; t < K; ++t) {
      roundsA[n][t] = (t ? rounds[n][t - 1] : zero) + nodes[n].p1Puts * nvGroup(partPieces[0], partUnits[0]);
      rounds[n][t] = roundsA[n][t] + nodes[n].p1Puts * nvGroup(partPieces[1], partUnits[1]);
    }
    st[n].mu = rounds[n][K - 1];
  }
  auto reducerStage = [&](uint32_t n, uint32_t t, uint32_t stage) {
    Node& s = st[n];
    if (stage == 0) {  // part 0 (signalled: the first round sends it), then part 1
      for (const uint32_t w : {0u, 1u}) {
        s.red = nodes[n].phases ? longest(s.red, w == 0 ? roundsA[n][t] : rounds[n][t]) +
                                      nodes[n].perOwner * redGroup(reducePieces[w], partUnits[w])
                                : s.red + nodes[n].owned * partCopy[w];
        if (w == 0) s.chunk[t].ready[0] = s.red + flagHop();
      }
      return;
    }
    const uint32_t rho = stage - 1, k = plan.rsRound(rho);
    const PathCounts in = st[(n + M - plan.distance(k)) % M].chunk[t].send[rho] + land;
    s.red = longest(s.red, in) + nodes[n].owned * redGroup(1, plan.blocks(k) * blockUnits);
    s.chunk[t].ready[stage] = s.red + flagHop();
  };
  auto senderStage = [&](uint32_t n, uint32_t t, uint32_t stage) {
    Node& s = st[n];
    Chunk& c = s.chunk[t];
    if (stage < J) {
      const uint32_t k = plan.rsRound(stage);
      c.send[stage] = s.snd =
          longest(s.snd, c.ready[stage]) + nodes[n].owned * netGroup(1, plan.blocks(k) * blockUnits);
      return;
    }
    const uint32_t q = stage - J, k = plan.agRound(q);
    PathCounts need = c.ready[J];
    for (uint32_t earlier = 0; earlier < q; ++earlier)
      need = longest(need, st[(n + plan.distance(plan.agRound(earlier))) % M].chunk[t].send[J + earlier] + land);
    c.send[stage] = s.snd =
        longest(s.snd, need) + nodes[n].owned * netGroup(plan.agMessages(k), plan.blocks(k) * blockUnits);
  };
  // Wavefront order, as the lanes run (rhdWavefront): per (chunk, stage) every node's reducer stage, then every
  // node's sender stage (the reducer's pairs are the sender's with stage <= J, in the same order).
  rhdWavefront(K, 2 * J, [&](uint32_t t, uint32_t stage) {
    if (stage <= J)
      for (uint32_t n = 0; n < M; ++n) reducerStage(n, t, stage);
    for (uint32_t n = 0; n < M; ++n) senderStage(n, t, stage);
  });
  // Phase 3 per chunk: part 1 once final (the own block, every all-gather round but the last), then part 0
  // (the last round's arrival).
  for (uint32_t t = 0; t < K; ++t)
    for (uint32_t n = 0; n < M; ++n) {
      Node& s = st[n];
      // all-gather emission position q brings round agRound(q) from node n + 2^k; the last position round r0
      PathCounts keptFinal = s.chunk[t].ready[J];
      for (uint32_t q = 0; q + 1 < J; ++q)
        keptFinal = longest(keptFinal, st[(n + plan.distance(plan.agRound(q))) % M].chunk[t].send[J + q] + land);
      const PathCounts last = st[(n + plan.distance(r0)) % M].chunk[t].send[2 * J - 1] + land;
      if (nodes[n].phases)
        s.mu = longest(longest(s.mu, keptFinal) + nodes[n].perOwner * nvGroup(partPieces[1], partUnits[1]), last) +
               nodes[n].perOwner * nvGroup(partPieces[0], partUnits[0]);
      else
        s.arrivals = longest({s.arrivals, keptFinal, last});
    }
  PathCounts total = zero;
  for (uint32_t n = 0; n < M; ++n) {
    const Node& s = st[n];
    const PathCounts end = longest({s.red, s.snd, nodes[n].phases ? s.mu : s.arrivals});
    total = n ? longest(total, end) : end;
  }
  return total;
}

}  // namespace

CostEstimate costHierarchicalBruck(const CostContext& c, const ClosedFormShape& s) {
  const Range shard0 = splitRange(s.part0, s.gMax, 0);
  const uint64_t chunkMax = splitRange(shard0, c.opt.chunks, 0).size;
  const UnitPrices u = unitPrices(c, chunkMax, true);
  const BruckPlan plan = bruckPlan(s.nodes, c.gen.opt.inter);
  const bool half = c.gen.opt.inter == InterPhase::BruckHalf;
  return estimate(
      u, bruckLongest(u, plan, c.opt.chunks, chunkMax, hierNodeLoads(c, s.nodes)),
      std::string("hierarchical, ") + toString(c.gen.opt.inter) +
          ": longest path of the chunk/round recurrence in wavefront order (docs); per chunk J = " +
          std::to_string(plan.rounds) + " reduce-scatter and J all-gather rounds, round k moving " +
          (half ? "floor(L/2) of the L blocks still live (the first floor(M/2))" : "min(2^k, M-2^k) blocks") +
          " of ceil(chunk/M) in one message (all-gather: two from two blocks on), S1 = (G-1)*t_nv(chunk), "
          "unit = chunk n/(C*G*K)");
}

}  // namespace mk::detail
