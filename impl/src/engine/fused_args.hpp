// mkernel — internal: the checks of a fused call (Communicator::gemmReduceScatter, allGatherGemm, gemmAllReduce)
// made before anything is generated, bound or enqueued. Pure C++ (no CUDA): unit-tested without a GPU.
#pragma once

#include <cstdint>

#include "mk/algorithms/fused.hpp"
#include "mk/cost/cost.hpp"
#include "mk/topology/topology.hpp"

namespace mk::runtime {

/// Elements of a rank's a, b and c (docs/fused-operators.md, "Buffers"; dense: lda = the row length).
struct FusedOperandCounts {
  uint64_t a = 0, b = 0, c = 0;
};
FusedOperandCounts fusedOperandCounts(const FusedSpec& spec, uint32_t nRanks, uint32_t rank);

/// Fewest rows of C per Gemm step the engine takes by default. Each step streams all of its B (K_r x n, or
/// k x N_r) through the GPU for `rows` rows of A, so a step does `rows` FLOPs per byte of B: far below ~1000 it is
/// bound by memory, not by the tensor cores (H200: 989 TFLOP/s over 4.8 TB/s ~ 206 FLOP/B before A and C). Measured
/// on one H200, 2 ranks sharing it (docs/results.md, "Fused operators"): gemm-rs 16384 x 16384 x 8192 took 11.7 ms
/// with 256-row tiles (the one-wave default) and 9.4 ms with 512..2048; ag-gemm 12.5 ms (128), 10.1 (512), 7.3 (2048);
/// gemm-ar 8192 x 8192 x 4096 3.4 ms (128), 1.5 (512..1024).
inline constexpr uint64_t kEngineMinTileRows = 1024;
/// ag-gemm's floor: its steps are m-tile x N_r x k (a narrower, deeper step than gemm-rs's), and larger ones were
/// faster every time they were measured (2 ranks sharing one H200, 16384 x 16384 x 8192: 12.5 ms with 128-row tiles,
/// 11.5 with 1024, 7.3 with 2048; 4096 x 4096 x 2048: 207 us with 1024, 164 with 2048).
inline constexpr uint64_t kEngineMinTileRowsAgGemm = 2048;

/// The tile a fused call takes when FusedOptions::tileRows is 0: on one rank the whole m (one Gemm step: nothing to
/// overlap); otherwise fusedDefaultTileRows (one wave of `ctas` output tiles) but at least kEngineMinTileRows rows
/// (ag-gemm: kEngineMinTileRowsAgGemm), and at most the largest shard's rows.
uint32_t engineTileRows(const FusedSpec& spec, uint32_t nRanks, uint32_t ctas);

/// What a fused call on a communicator of `nRanks` ranks, whose resident kernels have `workers` worker CTAs each,
/// runs: planFused with ctas = workers and, when opt.tileRows is 0, engineTileRows (FusedPlan::tileDefault set).
/// Refuses, with Error naming the op and what to change:
///  * a communicator without compute lanes (`computeLanes` false; Unsupported);
///  * the spec's bad input (validateFusedSpec: InvalidArgument naming the dimension and its divisor);
///  * a dtype the GPU tile engine does not take: bfloat16 only (float16 runs on the CPU executor; Unsupported);
///  * opt.ctas other than 0 or `workers` (the split divides the resident kernel's workers; InvalidArgument);
///  * a split that leaves the compute lane or a communication lane without CTAs (generate()'s check).
FusedPlan planFusedCall(const FusedSpec& spec, const FusedOptions& opt, const Topology& topo, uint32_t nRanks,
                        const Profile& profile, uint32_t workers, bool computeLanes);

/// The operands of rank `rank`: a, b and c non-null and 16-byte aligned (the tile engine's TMA), and c overlapping
/// neither a nor b (the output is written while the inputs are read). Throws Error(InvalidArgument) naming the
/// operand.
void checkFusedOperands(const FusedSpec& spec, uint32_t nRanks, uint32_t rank, const void* a, const void* b,
                        const void* c);

}  // namespace mk::runtime
