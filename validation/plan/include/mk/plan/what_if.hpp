// mkernel — what-if variants of a cluster (docs/planner.md, "What-ifs"): NIC bandwidth, NICs per node, fabric
// oversubscription, nodes per leaf, NVLink domain size, and stragglers / noise.
//
// A what-if is a comma-separated list of key=value changes, e.g. "nic-bw=2x,oversub=2":
//   nic-bw=2x | nic-bw=100     NIC bandwidth per direction: a factor, or GB/s
//   nics=N                     NICs per node (GPUs share them evenly when N < GPUs per node)
//   oversub=X                  leaf-to-spine oversubscription (>= 1)
//   nodes-per-leaf=N           nodes under one rail leaf
//   nvlink-domain=N            GPUs per NVLink domain (= per node; 1: no NVLink at all); NICs per GPU kept
//   noise=S                    every GPU's compute of every step slowed by 1 + S |Z|, Z standard normal
//   stragglers=F:X             a fraction F of the GPUs (picked once, seeded) always X times slower
//   seed=N                     seed of noise and stragglers (default 1)
//   mtbf=, rack=, restart=, checkpoint=, ckptbw=, ckptinterval=, spares=, repair=: failures (goodput.hpp)
// The profile follows a network change: its network bandwidth (calibrated or datasheet) is scaled by the change
// of the path's bottleneck, min(NIC, PCIe), so a measured efficiency against line rate is kept.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/plan/goodput.hpp"
#include "mk/topology/topology.hpp"

namespace mk::plan {

/// The domain of each what-if value (parseWhatIf refuses anything outside, naming the bound): wide enough for any
/// cluster worth planning, narrow enough that no variant can make a time infinite.
inline constexpr double kMinNicBwFactor = 1e-3, kMaxNicBwFactor = 1e3;  ///< nic-bw=Fx
inline constexpr double kMinNicBwGBs = 1e-3, kMaxNicBwGBs = 1e6;        ///< nic-bw=GBs
inline constexpr double kMaxOversubscription = 1e3;                     ///< oversub=X (the topology's own bound)
inline constexpr double kMaxNoiseSigma = 10;                            ///< noise=S
inline constexpr double kMaxStragglerSlowdown = 100;  ///< stragglers=F:X; a GPU 100x slower is a failed one

/// Per-GPU slowdowns (seeded, reproducible).
struct NoiseSpec {
  double sigma = 0;              ///< noise: compute x (1 + sigma |Z|) per GPU per step
  double stragglerFraction = 0;  ///< fraction of GPUs that are persistently slow
  double stragglerSlowdown = 1;  ///< their compute x this
  uint64_t seed = 1;
  bool any() const noexcept { return sigma > 0 || (stragglerFraction > 0 && stragglerSlowdown > 1); }
};

/// One what-if variant.
struct WhatIf {
  std::string name;  ///< the text it was parsed from
  std::optional<double> nicBwFactor, nicBwGBs, oversub;
  std::optional<uint32_t> nics, nodesPerLeaf, nvlinkDomain;
  NoiseSpec noise;
  FailureSpec failures;  ///< the failure model's keys: a goodput estimate at every scale when any is given
  /// Whether it changes the cluster (else only the noise).
  bool changesCluster() const noexcept {
    return nicBwFactor || nicBwGBs || oversub || nics || nodesPerLeaf || nvlinkDomain;
  }
};

/// Parse "key=value,key=value"; throws Error(InvalidArgument) naming the key and what was expected.
WhatIf parseWhatIf(const std::string& text);

/// Apply the cluster changes of `w` to a node type and fabric (the node count is the planner's), and the profile
/// to the changed cluster (profileOnCluster: its rates follow the datasheet's). nics= and nvlink-domain= turn a
/// NIC list into the uniform form (the first NIC's rate); nic-bw= sets every NIC's. Throws Error(InvalidArgument)
/// naming the what-if when the result is not a valid topology. The baseline (no cluster change) is left as is.
void applyWhatIf(const WhatIf& w, Topology& topo, Profile& profile);

/// The result of the noise model over `steps` sampled steps.
struct NoiseResult {
  double meanStepUs = 0;    ///< mean step time with the slowdowns
  double maxStepUs = 0;     ///< slowest sampled step
  double goodput = 1;       ///< nominal step / mean noisy step: the fraction of the nominal throughput kept
  uint32_t stragglers = 0;  ///< GPUs picked as stragglers
  uint32_t steps = 0;
};

/// Every step is synchronous, so it runs at the pace of its slowest GPU: the compute on the step's critical
/// path (`criticalComputeUs`) is multiplied by the largest per-GPU slowdown of that step; communication is
/// unchanged. Deterministic for a given (spec, gpus, steps).
NoiseResult applyNoise(const NoiseSpec& spec, uint32_t gpus, double stepUs, double criticalComputeUs,
                       uint32_t steps = 200);

}  // namespace mk::plan
