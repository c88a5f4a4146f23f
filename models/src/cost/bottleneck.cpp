#include "mk/cost/bottleneck.hpp"
#include "mk/util/format.hpp"

#include <algorithm>
#include <cstdio>
#include <map>

namespace mk {
namespace {

std::string percent(double busy) { return strprintf("%.1f %%", 100.0 * busy); }

}  // namespace

std::string bottleneckText(const std::vector<ResourceUse>& uses) {
  if (uses.empty()) return "latency-bound: no bytes crossed a link (per-step latency and synchronisation only)";
  // The busiest resource of each kind, busiest kind first.
  std::map<std::string, const ResourceUse*> byKind;
  for (const ResourceUse& u : uses) {
    const ResourceUse*& best = byKind[u.kind];
    if (best == nullptr || u.busy > best->busy) best = &u;
  }
  std::vector<const ResourceUse*> kinds;
  for (const auto& [kind, u] : byKind) kinds.push_back(u);
  std::stable_sort(kinds.begin(), kinds.end(),
                   [](const ResourceUse* a, const ResourceUse* b) { return a->busy > b->busy; });
  const ResourceUse& top = *kinds.front();
  std::string s = top.busy >= kBandwidthBoundBusy
                      ? top.kind + "-bound: " + top.name + " is " + percent(top.busy) + " busy"
                      : "latency-bound: no link is half busy; the busiest, " + top.name + ", is " + percent(top.busy) +
                            " (per-step latency, synchronisation and pipeline fill take the rest)";
  for (std::size_t i = 1; i < kinds.size(); ++i)
    s += "; " + kinds[i]->kind + " " + percent(kinds[i]->busy) + " (" + kinds[i]->name + ")";
  return s;
}

std::vector<ResourceUse> timelineResourceUse(const Schedule& s, const Timeline& t, const Profile& profile) {
  std::vector<ResourceUse> uses;
  if (t.totalUs <= 0) return uses;
  for (uint32_t r = 0; r < s.nRanks && r < s.lanes.size(); ++r) {
    double nvlink = 0, network = 0;
    for (const Lane& lane : s.lanes[r])
      for (const Step& st : lane.steps) {
        if (kindInfo(st.kind).extent == StepExtent::None) continue;  // synchronisation carries no payload
        if (st.link == LinkClass::NVLink) nvlink += static_cast<double>(st.bytes);
        if (st.link == LinkClass::Network) network += static_cast<double>(st.bytes);
      }
    // GB/s x us = 1e3 bytes.
    if (nvlink > 0 && profile.nvlink.bwGBs > 0)
      uses.push_back(
          {"rank " + std::to_string(r) + " NVLink out", "NVLink", nvlink / (profile.nvlink.bwGBs * 1e3 * t.totalUs)});
    if (network > 0 && profile.network.bwGBs > 0)
      uses.push_back({"rank " + std::to_string(r) + " network out", "network",
                      network / (profile.network.bwGBs * 1e3 * t.totalUs)});
  }
  return uses;
}

std::vector<ResourceUse> computeResourceUse(const Schedule& s, const Timeline& t, double totalUs) {
  std::vector<ResourceUse> uses;
  if (totalUs <= 0) return uses;
  std::map<std::pair<uint32_t, uint32_t>, double> busyUs;  // (rank, lane) -> time in compute steps
  for (const StepTime& st : t.steps) {
    if (pricedByFlops(s.lanes[st.rank][st.lane].steps[st.step].kind))
      busyUs[{st.rank, st.lane}] += st.endUs - st.startUs;
  }
  for (const auto& [lane, us] : busyUs)
    uses.push_back({"rank " + std::to_string(lane.first) + " lane " + std::to_string(lane.second) + " (compute)",
                    "compute", std::min(1.0, us / totalUs)});
  return uses;
}

}  // namespace mk
