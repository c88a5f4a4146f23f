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
/// Pipelining pays once a transfer is long against a flag round trip (~1.25 us = ~400 KB at NVLink rate); more
/// chunks also mean more flags and sync points. The sizes come from measurements on 2 x H200
/// (impl/tools/bw_sweep.sh, validation/data/measured/2026-11-30-h200x2-*-sweep*.tsv, docs/results.md
/// "Chunks per size"):
///  * generally 1 / 2 / 4 / 8 chunks from 0 / 1 / 4 / 64 MiB on (one-shot all-reduce and direct reduce-scatter
///    measured best at 8 chunks from 64 MiB to 512 MiB; all-gather was not swept);
///  * two-shot all-reduce: never more than the general rule, and pieces of about 16 MiB of the rank's shard,
///    2 to 4 chunks (measured 32-512 MiB: the general rule cost more than the best of 2 or 4, and the closed
///    forms priced at the general rule made two-shot dearer than one-shot, so "auto" took one-shot, which
///    measured slower);
///  * one channel: 2 or 4 channels measured slightly slower at 512 MiB.
///  * hierarchical all-reduce on `nodes` >= 512 nodes: at most 4 chunks on a power-of-two node count, at most 6
///    on others. Modelled, not measured (closed form and SimGrid replay under the datasheet DGX-H100 profile,
///    docs/results.md "Scaling of the hierarchical all-reduce"): 512 MiB reaches 343-346 GB/s busbw with 4
///    chunks on 512-1024 nodes against 351-353 with 8, and 4 chunks simulate half the steps (1024 nodes: 32 s
///    and 1.6 GB instead of 101 s and 2.0 GB). Other node counts run the bruck phase, whose sender with 4
///    chunks waits for arrivals whose latency differs by node (partners on another leaf), so the nodes fall
///    out of step and NICs receive two rounds at once (496 nodes: replay 1.24x the closed form); with 6 it
///    always has another chunk's message to send (1000 nodes: replay = closed form, 342 GB/s). Channels stay
///    1: under timeline rule 2 C channels of K chunks price as one channel of K.
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
