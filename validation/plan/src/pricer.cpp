// mkernel — the ways of pricing a communication and the spelling of where a price comes from (pricer.hpp).
#include "mk/plan/pricer.hpp"

#include <algorithm>
#include <utility>

#include "mk/algorithms/nccl.hpp"
#include "mk/error.hpp"
#include "mk/plan/embed.hpp"

namespace mk::plan {

namespace {

// One name table per enum: toString and the parsers read the same rows, so what plan.json and the shard files
// write is what the merge reads back.
constexpr std::pair<PriceSource, const char*> kSourceNames[] = {
    {PriceSource::SimGrid, "simgrid"},
    {PriceSource::SimGridFast, "simgrid-fast"},
    {PriceSource::ClosedForm, "closed-form"},
    {PriceSource::None, "none"},
};
constexpr std::pair<CommDomain, const char*> kDomainNames[] = {
    {CommDomain::NvLink, "nvlink"},
    {CommDomain::Network, "network"},
};
constexpr CommBound kBounds[] = {CommBound::None, CommBound::NotSimulated, CommBound::Latency, CommBound::Bandwidth};

template <typename E, std::size_t N>
const char* nameIn(const std::pair<E, const char*> (&table)[N], E value) noexcept {
  for (const auto& [v, name] : table)
    if (v == value) return name;
  return "?";
}

template <typename E, std::size_t N>
std::optional<E> valueIn(const std::pair<E, const char*> (&table)[N], const std::string& text) {
  for (const auto& [v, name] : table)
    if (text == name) return v;
  return std::nullopt;
}

std::string pct(double x) { return std::to_string(static_cast<int>(x * 100 + 0.5)) + " %"; }

/// The schedule simulated for `p`: its instances embedded into one. One instance on ranks in its own order is
/// the generated schedule on the reduced cluster's nodes, moved rather than copied (a 512-rank ring is millions
/// of steps: the copy was a tenth of the simulation's time).
Schedule simulatedSchedule(Schedule part, const ConcurrentPlacement& p) {
  const bool alone = p.maps.size() == 1 && p.maps[0].size() == part.nRanks && p.nodeOf.size() == part.nRanks &&
                     std::is_sorted(p.maps[0].begin(), p.maps[0].end()) &&
                     (p.maps[0].empty() || p.maps[0].back() + 1 == part.nRanks);
  if (!alone) return embedConcurrent(part, p.maps, p.nodeOf);
  part.nodeOf = p.nodeOf;
  return part;
}

/// The SimGrid replay of the job's schedule (every instance embedded into one), in full or in the simulator's
/// fast mode.
class ReplayPricer final : public Pricer {
 public:
  explicit ReplayPricer(bool fast) : fast_(fast) {}
  PriceSource source() const noexcept override { return fast_ ? PriceSource::SimGridFast : PriceSource::SimGrid; }

  void price(const CommJob& job, CommPrice& price) const override {
    const Schedule all = simulatedSchedule(generate(job.spec, job.placement.partNodeOf, job.gen), job.placement);
    price.steps = all.stepCount();
    sim::SimOptions so;
    so.trace = false;
    so.linkLoad = true;
    so.fast = fast_;
    const sim::Prediction pred = sim::predict(all, job.placement.reduced, job.profile, so);
    // A layered op also pays its kernel's launch on the host (one process per GPU: one launch per op).
    price.us = isLayered(job.spec.algo) ? layeredOpUs(pred.totalUs, job.profile, 1) : pred.totalUs;
    price.source = source();
    price.busiest.clear();
    for (std::size_t i = 0; i < pred.links.size() && i < 3; ++i) price.busiest.push_back(pred.links[i]);
    // A link busy at least half of the op's time limits it by its bandwidth; otherwise the op waits on latencies
    // (alphas, flags, proxy) and synchronisation more than on any link.
    const bool linkBound = !price.busiest.empty() && price.busiest.front().utilization >= 0.5 &&
                           !linkClass(price.busiest.front().name).empty();
    price.bound = linkBound ? CommBound::Bandwidth : CommBound::Latency;
  }

 private:
  bool fast_;
};

/// The algorithm's closed form, computed when the job was requested (price.closedFormUs): no schedule is generated.
class ClosedFormPricer final : public Pricer {
 public:
  PriceSource source() const noexcept override { return PriceSource::ClosedForm; }

  void price(const CommJob& job, CommPrice& price) const override {
    if (!price.closedFormUs)
      throw Error(ErrorCode::Internal, "closed-form pricer: " + price.op + " has no closed form");
    price.us = isLayered(job.spec.algo) ? layeredOpUs(*price.closedFormUs, job.profile, 1) : *price.closedFormUs;
    price.source = source();
    price.bound = CommBound::NotSimulated;
  }
};

}  // namespace

const char* toString(PriceSource s) noexcept { return nameIn(kSourceNames, s); }
std::optional<PriceSource> parsePriceSource(const std::string& text) { return valueIn(kSourceNames, text); }
const char* toString(CommDomain d) noexcept { return nameIn(kDomainNames, d); }
std::optional<CommDomain> parseCommDomain(const std::string& text) { return valueIn(kDomainNames, text); }

std::string boundText(const CommPrice& p) {
  switch (p.bound) {
    case CommBound::None: return "-";
    case CommBound::NotSimulated: return "not simulated";
    case CommBound::Latency:
      if (p.busiest.empty()) return "latency (no link carried bytes)";
      return "latency and synchronisation (busiest link " + p.busiest.front().name + " busy " +
             pct(p.busiest.front().utilization) + ")";
    case CommBound::Bandwidth: {
      const sim::LinkLoad& l = p.busiest.at(0);
      return linkClass(l.name) + " (" + l.name + " busy " + pct(l.utilization) + ")";
    }
  }
  return "?";
}

std::optional<CommBound> parseBoundText(const std::string& text, const CommPrice& p) {
  CommPrice probe;
  probe.busiest = p.busiest;
  for (CommBound b : kBounds) {
    if (b == CommBound::Bandwidth && probe.busiest.empty()) continue;
    probe.bound = b;
    if (boundText(probe) == text) return b;
  }
  return std::nullopt;
}

std::string linkClass(const std::string& name) {
  if (name.find(".up_") != std::string::npos) return "leaf uplink bandwidth";
  if (name.find(".nic") != std::string::npos) return "NIC bandwidth";
  if (name.find(".pcie") != std::string::npos) return "PCIe bandwidth";
  if (name.find(".nvl") != std::string::npos) return "NVLink bandwidth";
  return "";
}

const Pricer& pricerFor(PriceSource source) {
  static const ReplayPricer simgrid(false), fast(true);
  static const ClosedFormPricer closedForm;
  switch (source) {
    case PriceSource::SimGrid: return simgrid;
    case PriceSource::SimGridFast: return fast;
    case PriceSource::ClosedForm: return closedForm;
    case PriceSource::None: break;
  }
  throw Error(ErrorCode::Internal, "pricerFor: no pricer prices a group of one rank (source none)");
}

}  // namespace mk::plan
