// mkernel — the price of a fused operator (AllGather+GEMM, GEMM+ReduceScatter, GEMM+AllReduce) that replaces a GEMM
// and the tensor-parallel collective next to it (docs/planner.md, "The fused operators' prices").
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
};

/// The pricer of this build.
std::unique_ptr<FusedOpPricer> makeFusedOpPricer();

}  // namespace mk::plan
