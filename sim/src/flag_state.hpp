// mkernel — internal to the replay: flag counters and barriers of the simulated lanes (docs/simulator.md
// "The replay").
#pragma once

#include <cstdint>
#include <deque>
#include <iterator>
#include <limits>
#include <utility>
#include <vector>

namespace mk::sim::detail {

inline uint64_t saturatingAdd(uint64_t a, uint64_t b) {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

/// A lane suspended on a flag until `wakeAt` (infinity: until an increment makes the threshold reachable).
/// `generation` tells a current wake-up timer from one made stale by an earlier increment.
struct FlagWaiter {
  uint64_t threshold = 0;
  uint64_t lane = 0;
  double wakeAt = 0;
  uint64_t generation = 0;
};

/// A flag counter. Increments are known when they are sent, together with the time they become visible, so
/// the counter keeps `value` (visible by now) and `pending` (visible later, in time order): the time it reaches
/// a threshold is known without waking anybody per increment. Only a lane that must block costs a timer.
struct FlagState {
  uint64_t value = 0;
  std::deque<std::pair<double, uint64_t>> pending;  ///< (visibility time, increment), ascending time
  std::vector<FlagWaiter> waiters;

  /// Fold the increments visible at `now` into `value`.
  void settle(double now) {
    while (!pending.empty() && pending.front().first <= now) {
      value = saturatingAdd(value, pending.front().second);
      pending.pop_front();
    }
  }
  void add(double t, uint64_t inc) {
    // Increments arrive nearly in time order: insert from the back.
    auto it = pending.end();
    while (it != pending.begin() && std::prev(it)->first > t) --it;
    pending.insert(it, {t, inc});
  }
  /// Earliest time the counter is >= threshold with the increments sent so far (-inf: already; inf: never yet).
  double reachTime(uint64_t threshold) const {
    if (value >= threshold) return -std::numeric_limits<double>::infinity();
    uint64_t sum = value;
    for (const auto& [t, inc] : pending) {
      sum = saturatingAdd(sum, inc);
      if (sum >= threshold) return t;
    }
    return std::numeric_limits<double>::infinity();
  }
};

struct BarrierState {
  uint64_t arrived = 0;
  double lastArrival = 0;
  std::vector<uint64_t> waiting;  ///< lanes suspended until the last arrival
};

}  // namespace mk::sim::detail
