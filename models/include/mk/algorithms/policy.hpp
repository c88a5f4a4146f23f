// mkernel — the algorithm policy: which generator "auto" runs, and the chunks and channels an op gets when the
// caller leaves them open. One copy, shared by the GPU engine, mk-schedule, mk-sim and the planner, so that a
// prediction of "auto" describes the schedule the engine runs.
#pragma once

#include <cstdint>
#include <optional>

#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/topology/topology.hpp"

namespace mk {

/// Chunks and channels for `algo` of `op` at `bytes` (nccl-tests size: the larger buffer of one rank, opBytes)
/// on `nRanks` ranks; inter is left Auto.
///
/// Pipelining pays once a transfer is long against a flag round trip, but more chunks mean more flags and sync
/// points: the sizes where the count steps up are measured on 2 x H200, the caps at large node counts modelled
/// (the rules and their numbers: docs/algorithms-collectives.md, "Default chunks and channels").
GenOptions defaultGenOptions(CollOp op, Algorithm algo, uint64_t bytes, uint32_t nRanks, uint32_t nodes = 1) noexcept;

/// What "auto" runs.
struct AlgorithmChoice {
  Algorithm algo = Algorithm::Ring;
  GenOptions gen;  ///< defaultGenOptions of `algo` (inter Auto)
  /// The closed form that won, priced at `gen`; empty when no candidate had one (the first algorithm is taken).
  std::optional<double> closedFormUs;
};

/// The algorithm "auto" runs for `op` on `count` elements of `dtype` placed on topo.layout(nRanks): of
/// algorithmsFor(op), in that order, the one whose closedForm under `profile`, priced at its
/// defaultGenOptions (redop sum, root 0), is the lowest finite one; the earlier one on a tie; a candidate whose
/// closed form throws mk::Error (none exists, or it does not apply) is skipped; the first algorithm when no
/// candidate is left. Throws Error(NotFound) when no generator exists for `op`.
AlgorithmChoice chooseAlgorithm(CollOp op, uint64_t count, DType dtype, const Topology& topo, uint32_t nRanks,
                                const Profile& profile);

/// A collective with everything decided: the schedule generate(spec, topo.layout(nRanks), gen) describes.
struct CollectivePlan {
  CollectiveSpec spec;        ///< spec.algo concrete
  GenOptions gen;             ///< chunks and channels >= 1, inter Ring or Rhd
  bool chosenByAuto = false;  ///< spec.algo came from chooseAlgorithm
};

/// Decide what a request leaves open, as the engine does for a submitted collective: when `algo` is empty
/// ("auto"), chooseAlgorithm's pick replaces spec.algo; gen.chunks and gen.channels that are 0 become the
/// algorithm's defaultGenOptions; gen.inter Auto becomes resolveInter's variant under `profile`.
CollectivePlan planCollective(CollectiveSpec spec, std::optional<Algorithm> algo, GenOptions gen, const Topology& topo,
                              uint32_t nRanks, const Profile& profile);

}  // namespace mk
