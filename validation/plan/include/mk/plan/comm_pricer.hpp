// mkernel — the price of every communication of a plan: each distinct collective simulated once by SimGrid at the
// cluster's scale (placement.hpp says which ranks and which part of the cluster), then looked up.
//
// The layered variant runs each all-reduce, all-gather and reduce-scatter as NCCL does, modelled by the nccl-*
// family (mk/algorithms/nccl.hpp: chooseLayered, NCCL's tuner modelled; priced under layeredProfile plus one
// kernel launch per op); an all-to-all the same way with nccl-p2p (NCCL's p2p sends); a pipeline send as nccl-p2p
// of two ranks with the protocol NCCL picks by size (mk::planNccl). Instances inside one node replay exactly;
// instances across nodes replay in the simulator's fast mode (steps inside a node timed by the uncontended
// timeline, network flows and synchronisation through SimGrid: identical when nothing contends inside a node). A
// schedule of more steps than the budget is priced by its closed form instead and says so (no contention in that
// number). Each of these ways is a Pricer (pricer.hpp); this class decides which prices what, once per key.
#pragma once

#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "mk/algorithms/policy.hpp"
#include "mk/cost/cost.hpp"
#include "mk/plan/placement.hpp"
#include "mk/plan/pricer.hpp"
#include "mk/sim/replay.hpp"
#include "mk/workload/lowering.hpp"

namespace mk::plan {

/// How prices are computed.
struct PricerSettings {
  unsigned jobs = 2;               ///< simulations at once (each a forked process)
  uint64_t budgetSteps = 4000000;  ///< larger schedules are priced by their closed form (0: no limit)
  /// Bytes all simulations at once may take (0: no limit); each of the `jobs` gets an equal share, and a schedule
  /// whose estimated simulation (mk::memoryNeed) is above its share is priced by its closed form as well.
  uint64_t maxMemory = 0;
  /// Called after each finished simulation: done, total, wall seconds since runAll started.
  std::function<void(std::size_t, std::size_t, double)> onProgress;
  /// Prices by key already known (mk-plan merge: the shards' simulations, shard.hpp): taken instead of simulating.
  const std::map<std::string, CommPrice>* known = nullptr;
  /// Filled by runAll with the price of every key (mk-plan --shard writes them for the merge).
  std::map<std::string, CommPrice>* record = nullptr;
  /// Simulate every instance of a group set instead of its class's representative (placeConcurrent): the full
  /// simulation the reduction is checked against.
  bool everyInstance = false;
};

/// Prices by key; request first, runAll, then look up.
class CommPricer {
 public:
  explicit CommPricer(PricerSettings settings) : settings_(std::move(settings)) {}

  /// Register `op` of a stage whose groups are `groups`, on `cluster` under `profile`; returns the key of its
  /// price. Cheap (no simulation): generator choice, placement, and the schedule counted (mk::countSchedule, up to
  /// the budget) to decide whether its simulation fits --sim-budget and its share of the memory. Throws
  /// Error(Unsupported) for placements the reduction cannot represent (placeConcurrent) and for a schedule above
  /// the budget or the memory that has no closed form to stand in.
  std::string request(const CommOp& op, const GroupSet& groups, const Topology& cluster, const Profile& profile);

  /// The cluster and profile a plan's scale prices on, registered once (a plan of thousands of layouts has a few):
  /// requests of one context share their placements and keys. Equal clusters and profiles get the same id.
  std::size_t context(const Topology& cluster, const Profile& profile);
  /// request() on a registered context. A request equal to an earlier one in everything that changes its price
  /// (the context, the op's kind, count and type, every instance's ranks) returns the earlier key at once, and
  /// requests on equal groups share one placement. The key is the pricer's own (valid while it lives): a search
  /// keeps tens of thousands of uses of a few hundred keys, each kilobytes long.
  const std::string& request(const CommOp& op, const GroupSet& groups, std::size_t context);

  /// Simulate every requested price not known yet, `settings.jobs` at a time. Throws the first simulation error.
  void runAll();

  /// The price of a key from request() (after runAll()).
  const CommPrice& price(const std::string& key) const;

  std::size_t simulations() const noexcept { return simulations_; }   ///< simulated so far
  std::size_t requests() const noexcept { return requests_; }         ///< request() calls so far
  std::size_t distinct() const noexcept { return entries_.size(); }   ///< distinct keys
  std::size_t placements() const noexcept { return placed_.size(); }  ///< distinct (context, groups) placed
  /// Steps runAll() will simulate (counted when requested; the closed-form prices take none): the work ahead.
  uint64_t plannedSteps() const noexcept;

 private:
  /// A job, its price and the pricer that prices it.
  struct Entry : CommJob {
    CommPrice price;
    bool done = false;
    /// pricerFor(by) prices it: SimGrid inside a node, its fast mode across nodes, the closed form above the step
    /// budget or the memory share (never generated).
    PriceSource by = PriceSource::SimGrid;
  };
  /// Choose `e`'s pricer: count its simulated schedule up to what the settings allow and, above them, make the
  /// closed form its price (with a note saying why) before anything is generated.
  void planSimulation(Entry& e) const;
  /// Price one entry by its pricer; only touches `e`.
  void simulate(Entry& e) const;
  /// Copy every price known into settings_.record (when set).
  void recordPrices() const;
  /// Key `e` by everything its simulation depends on and keep it (an existing entry of that key is kept);
  /// `placed`: placementKey(e.placement).
  std::string addEntry(Entry e, const Profile& profile, const std::string& placed);
  /// The key of `op` on a placement of a context (what request() computes the first time).
  std::string priceOn(const CommOp& op, const ConcurrentPlacement& p, const std::string& placed,
                      const Profile& profile);

  /// A cluster and profile requests are priced on.
  struct Context {
    Topology cluster;
    Profile profile;
    std::string text;  ///< their JSON: what makes two contexts equal
  };
  /// The placement of one group set on a context, with the ranks it was placed from.
  struct Placed {
    std::size_t context = 0;
    std::vector<uint32_t> sizes, ranks;  ///< each instance's size, then every instance's ranks in order
    ConcurrentPlacement placement;
    std::string key;  ///< placementKey(placement)
  };
  /// The placement of `groups` on `context` (into placed_), placed the first time it is asked for.
  std::size_t placed(const GroupSet& groups, std::size_t context);
  /// A request's identity: (placement, kind, count, dtype) -> its key.
  using RequestKey = std::tuple<std::size_t, CommKind, uint64_t, DType>;

  PricerSettings settings_;
  std::map<std::string, Entry> entries_;
  /// Keys priced as the fastest of several entries (the layered variant's close candidates).
  std::map<std::string, std::vector<std::string>> fastestOf_;
  std::vector<Context> contexts_;
  std::deque<Placed> placed_;                                    ///< a deque: growing it moves no placement
  std::unordered_multimap<uint64_t, std::size_t> placedByHash_;  ///< hash of (context, ranks) -> into placed_
  std::map<RequestKey, std::string> requested_;
  std::size_t simulations_ = 0, requests_ = 0;
};

}  // namespace mk::plan
