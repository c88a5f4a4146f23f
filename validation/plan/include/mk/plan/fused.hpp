// mkernel — the price of a fused operator that replaces a GEMM and the tensor-parallel collective next to it
// (AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce), or a whole group of operations (a fused block: moe-ffn for a
// MoE layer's dispatch, experts and combine, ring-attention for an attention and its K/V ring; docs/planner.md,
// "The fused operators' prices").
//
// The planner knows which pairs fuse (mk::lowerStep's FusedCandidate) and how a fused operator's time enters the
// step (step_model.hpp); what a fused operator costs belongs to the fused operators' own model, next to their
// generators in models/src/algorithms: makeFusedOpPricer() prices with it (mk::sim::predictFused). A pricer that is
// not available() makes mk-plan report the fused variant as unavailable, never a number of its own.
#pragma once

#include <memory>
#include <string>

#include "mk/cost/cost.hpp"
#include "mk/plan/placement.hpp"
#include "mk/workload/lowering.hpp"

namespace mk::plan {

/// One fused operator to price: the GEMM as the layered variant runs it on one rank, the collective it absorbs,
/// and where its instances run.
struct FusedOpRequest {
  FusedKind kind = FusedKind::GemmReduceScatter;
  ComputeOp gemm;                     ///< m, n, k, FLOPs, bytes of the GEMM on one rank
  CommOp comm;                        ///< the collective (count in the generators' convention, dtype)
  ConcurrentPlacement placement;      ///< instance 0 of the tensor-parallel group and what it shares NICs with
  const Topology* cluster = nullptr;  ///< the whole cluster at this scale
  const Profile* profile = nullptr;   ///< the profile the layered collectives are priced with
  /// The GEMM's price on one rank as the layered variant pays it (the planner's compute model, priceCompute): the
  /// fused operator computes at that rate, so that the two variants differ by the overlap, not by a second GEMM
  /// rule.
  double gemmUs = 0;
};

/// What a fused operator costs, as the fused operators' model reports it.
struct FusedOpPrice {
  double us = 0;             ///< the operator's time (one instance, concurrent ones included)
  double gemmUs = 0;         ///< of which computing
  double exposedCommUs = 0;  ///< communication not hidden behind the GEMM
  std::string split;         ///< how it divides the work (chunks, SMs for compute vs communication)
  std::string source;        ///< the model that priced it
};

/// One fused block to price (mk::FusedBlock: a MoE layer's expert part as moe-ffn, an attention with its K/V ring as
/// ring-attention), and where its instances run.
struct FusedBlockRequest {
  FusedBlock block;                   ///< the shape of the operator on one rank and the pass it prices
  ConcurrentPlacement placement;      ///< instance 0 of its group (ep, or cp's ring) and what it shares NICs with
  const Topology* cluster = nullptr;  ///< the whole cluster at this scale
  const Profile* profile = nullptr;   ///< the profile the layered collectives are priced with
  /// One run of the layered kernels whose work the operator's compute steps do, on one rank (the planner's compute
  /// model): the expert GEMMs of moe-ffn (their data- and weight-gradient GEMMs for a mirror block), the attention
  /// kernels of ring-attention (the attention backward for a mirror). The operator computes at the rate that gives
  /// its compute steps this time: the two variants differ by the overlap, not by a second compute rule.
  double computeUs = 0;
};

/// The seam (see the file comment).
class FusedOpPricer {
 public:
  virtual ~FusedOpPricer() = default;
  /// Whether this build can price fused operators.
  virtual bool available() const = 0;
  /// Why not (shown in the report and plan.json) when !available().
  virtual std::string unavailableReason() const = 0;
  /// The price of one fused operator; only called when available(). Throws mk::Error for a request the model
  /// cannot price (the planner then reports that pair as not available).
  virtual FusedOpPrice price(const FusedOpRequest& request) = 0;
  /// The price of one run of a fused block; only called when available(). Throws mk::Error for a block the
  /// operator cannot express (the planner then keeps that block layered and says why). The default prices none.
  virtual FusedOpPrice priceBlock(const FusedBlockRequest& request);
};

/// The pricer of this build.
std::unique_ptr<FusedOpPricer> makeFusedOpPricer();

/// The fused block's price by its operator's own model: the generator's schedule (generateMoeFfn,
/// generateRingAttention) of the block's shape on the placement's ranks, its compute steps at the rate that gives
/// them `computeUs`, timed by the schedule's uncontended timeline (mk::simulateUncontended, its closed form) inside a
/// node and by the SimGrid replay when the group spans nodes. A mirror block (the backward pass) is the forward
/// operator's schedule with the backward's bytes (docs/planner.md, "The fused variant"): modelled, not generated.
/// Throws Error(Unsupported) for a block the lowering marks unfusable and what the generators' validate functions
/// throw for a shape they refuse.
FusedOpPrice priceFusedBlock(const FusedBlockRequest& request);

}  // namespace mk::plan
