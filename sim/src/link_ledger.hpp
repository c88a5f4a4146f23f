// mkernel — internal to the replay: transfers timed without SimGrid, per link, and the proof that SimGrid would
// have timed them the same (docs/simulator.md "Exact mode: transfers timed, then proven").
//
// A transfer capped at its lane's rate gets exactly that rate from SimGrid's max-min sharing as long as, on every
// link of its route, the rates of the transfers in flight together never exceed the link's bandwidth. The ledger
// keeps the transfers the replay timed at their caps and checks that condition whenever one is added.
#pragma once

#include <cstdint>
#include <vector>

namespace mk::sim::detail {

class LinkLedger {
 public:
  /// One entry per link of the platform: its bandwidth in bytes per second.
  explicit LinkLedger(std::vector<double> capacityBps);

  /// Record a transfer at `rateBps` over [start, end) (seconds) on each link of `route` (indices as in the
  /// constructor), forgetting first the transfers that ended by `now` (no transfer added later starts before the
  /// engine's clock). False when a link of the route then carries more than its bandwidth at some instant
  /// (relative tolerance 1e-9: a rate rounded up by the last bit is no oversubscription).
  bool add(const std::vector<uint32_t>& route, double start, double end, double rateBps, double now);

  /// The largest sum of rates seen in flight on `link` (bytes per second), over every add() so far.
  double peakBps(uint32_t link) const { return peak_[link]; }

 private:
  struct Flow {
    double start, end, rate;
  };
  std::vector<double> capacity_;
  std::vector<double> peak_;
  std::vector<std::vector<Flow>> inFlight_;  ///< per link: transfers not known to have ended
};

}  // namespace mk::sim::detail
