// mkernel — one way of pricing a communication, and what a price says of its origin (docs/planner.md,
// "Communication"). The planner's pricer (comm_pricer.hpp) decides which way prices each distinct
// collective: the SimGrid replay inside one node, the simulator's fast mode across nodes, the closed form for a
// schedule above the step budget or the memory share. Each way is one class behind the `Pricer` interface; a new
// way is one more class and one more `PriceSource`.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "mk/algorithms/policy.hpp"
#include "mk/cost/cost.hpp"
#include "mk/plan/placement.hpp"
#include "mk/sim/replay.hpp"

namespace mk::plan {

/// Which pricer priced a communication.
enum class PriceSource : uint8_t {
  SimGrid,      ///< the SimGrid replay of the whole schedule (inside one node)
  SimGridFast,  ///< the simulator's fast mode: network flows through SimGrid, NVLink steps on the timeline
  ClosedForm,   ///< the algorithm's closed form (no link sharing), standing in for a simulation above the limits
  None,         ///< nothing to price: a group of one rank
};
/// "simgrid", "simgrid-fast", "closed-form", "none": the spelling of plan.json and the shard files.
const char* toString(PriceSource s) noexcept;
/// The source spelled `text` by toString, nullopt for another text.
std::optional<PriceSource> parsePriceSource(const std::string& text);

/// Where a communication runs.
enum class CommDomain : uint8_t {
  NvLink,   ///< inside one node
  Network,  ///< across nodes
};
/// "nvlink", "network": the spelling of plan.json and of the confidence classes ("comm.nvlink.allreduce").
const char* toString(CommDomain d) noexcept;
/// The domain spelled `text` by toString, nullopt for another text.
std::optional<CommDomain> parseCommDomain(const std::string& text);

/// What limits a communication.
enum class CommBound : uint8_t {
  None,          ///< nothing to price
  NotSimulated,  ///< priced by its closed form: no link loads to say it
  Latency,       ///< no link busy at least half of its time: alphas, flags, proxy and synchronisation
  Bandwidth,     ///< its busiest link, busy at least half of its time
};

/// What one communication costs (all instances of its concurrent set at once).
struct CommPrice {
  double us = 0;     ///< one run
  std::string op;    ///< "allreduce", ..., "sendrecv"
  std::string algo;  ///< the generator and its shape: "hierarchical (rhd), 4 chunks"
  bool chosenByAuto = false;
  PriceSource source = PriceSource::None;
  std::string note;  ///< why a closed form stands in for the simulation (decided before generating anything)
  CommDomain domain = CommDomain::NvLink;
  uint32_t groupSize = 0, groupNodes = 0, concurrent = 0;
  uint64_t bytes = 0;  ///< nccl-tests size of one instance
  std::optional<double> closedFormUs;
  std::vector<sim::LinkLoad> busiest;  ///< up to 3, busiest first (simulated prices only)
  CommBound bound = CommBound::None;   ///< boundText says it with the busiest link
  // Cost of the simulation (kept out of plan.json: it varies run to run).
  uint64_t steps = 0;  ///< of the simulated schedule (every instance); a lower bound when priced by the closed form
  double wallS = 0;
};

/// What limits `p`, for people and plan.json: "-", "not simulated", "latency (no link carried bytes)", "latency and
/// synchronisation (busiest link L busy 12 %)", "NIC bandwidth (L busy 87 %)" (the link class of linkClass).
std::string boundText(const CommPrice& p);
/// The bound whose boundText with `p`'s busiest links is `text`, nullopt when none is.
std::optional<CommBound> parseBoundText(const std::string& text, const CommPrice& p);

/// "NIC bandwidth", "leaf uplink bandwidth", "PCIe bandwidth", "NVLink bandwidth" for a link name of the
/// platform (mk::sim::buildPlatform), "" for another.
std::string linkClass(const std::string& linkName);

/// One communication to price: the collective as generated, where its instances run, and the profile it runs
/// under (the layered library's for the nccl-* family).
struct CommJob {
  CollectiveSpec spec;
  GenOptions gen;
  ConcurrentPlacement placement;
  Profile profile;
};

/// One way of pricing a communication (see the file comment).
class Pricer {
 public:
  virtual ~Pricer() = default;
  /// What the prices of this pricer say they come from.
  virtual PriceSource source() const noexcept = 0;
  /// Price `job`: sets price.us, source, bound, busiest and steps; the other fields are the request's and are
  /// read, not written (the closed form stands in from price.closedFormUs). Throws mk::Error when it cannot.
  virtual void price(const CommJob& job, CommPrice& price) const = 0;
};

/// The pricer of `source` (one instance each, stateless). Throws Error(Internal) for PriceSource::None, which no
/// pricer produces.
const Pricer& pricerFor(PriceSource source);

}  // namespace mk::plan
