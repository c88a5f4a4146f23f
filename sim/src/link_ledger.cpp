// mkernel — transfers timed at their caps, per link, and the check that no link is oversubscribed (link_ledger.hpp).
#include "link_ledger.hpp"

#include <algorithm>
#include <utility>

namespace mk::sim::detail {

namespace {

constexpr double kRelativeTolerance = 1e-9;

}  // namespace

LinkLedger::LinkLedger(std::vector<double> capacityBps)
    : capacity_(std::move(capacityBps)), peak_(capacity_.size(), 0.0), inFlight_(capacity_.size()) {}

bool LinkLedger::add(const std::vector<uint32_t>& route, double start, double end, double rateBps, double now) {
  bool fits = true;
  for (const uint32_t link : route) {
    auto& flows = inFlight_[link];
    flows.erase(std::remove_if(flows.begin(), flows.end(), [now](const Flow& f) { return f.end <= now; }), flows.end());
    // The sum of rates in flight is piecewise constant and only rises where a transfer starts: its largest value
    // over [start, end) is reached at `start` or at the start of another transfer inside that span.
    double most = 0;
    auto sumAt = [&](double at) {
      double sum = rateBps;
      for (const Flow& f : flows)
        if (f.start <= at && at < f.end) sum += f.rate;
      most = std::max(most, sum);
    };
    sumAt(start);
    for (const Flow& f : flows)
      if (f.start > start && f.start < end) sumAt(f.start);
    peak_[link] = std::max(peak_[link], most);
    if (most > capacity_[link] * (1 + kRelativeTolerance)) fits = false;
    flows.push_back({start, end, rateBps});
  }
  return fits;
}

}  // namespace mk::sim::detail
