// mkernel — the NICs of a node: the list form, its checks, and the one rule for sharing them (topology.hpp).
#include <algorithm>
#include <cmath>
#include <set>
#include <string>

#include "mk/error.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/size.hpp"
#include "topology_internal.hpp"

namespace mk {

namespace {

// Plausibility bounds of one NIC port, to catch unit mistakes (Gb/s written as GB/s, ms as us): the fastest
// ports announced are 1.6 Tb/s (200 GB/s); 10 TB/s is far beyond. A one-way latency above 1 ms is no NIC's.
constexpr double kMaxNicGBs = 10000;
constexpr double kMaxNicLatencyUs = 1000;

[[noreturn]] void bad(const std::string& what) { throw Error(ErrorCode::InvalidArgument, what); }

std::string idx(const char* base, std::size_t i) { return std::string(base) + "[" + std::to_string(i) + "]"; }

void checkRate(const std::string& field, double gbs) {
  if (!std::isfinite(gbs) || !(gbs > 0) || gbs > kMaxNicGBs)
    bad(field + " must be in (0, " + formatNumber(kMaxNicGBs) + "] GB/s per direction (got " + formatNumber(gbs) + ")");
}

void checkLatency(const std::string& field, double us) {
  if (!std::isfinite(us) || us < 0 || us > kMaxNicLatencyUs)
    bad(field + " must be in [0, " + formatNumber(kMaxNicLatencyUs) + "] us (got " + formatNumber(us) + ")");
}

void checkTransport(const std::string& field, const std::string& kind) {
  const auto known = nicTransports();
  if (std::find(known.begin(), known.end(), kind) != known.end()) return;
  std::string list;
  for (const auto& k : known) list += (list.empty() ? "" : ", ") + k;
  bad(field + " must be one of " + list + " (got \"" + kind + "\")");
}

/// Indices listed once each and all below `limit`.
void checkIndexList(const std::string& field, const std::vector<uint32_t>& list, uint32_t limit, const char* what,
                    const std::string& owner) {
  std::set<uint32_t> seen;
  for (uint32_t v : list) {
    if (v >= limit)
      bad(field + " names " + what + " " + std::to_string(v) + " but " + owner + " has " + std::to_string(limit) + " " +
          what + (limit == 1 ? "" : "s") + " (0.." + std::to_string(limit == 0 ? 0 : limit - 1) + ")");
    if (!seen.insert(v).second) bad(field + " lists " + what + " " + std::to_string(v) + " twice");
  }
}

/// [gpu] -> the switches on its network path: its own, then its NICs' (each once).
std::vector<std::vector<uint32_t>> switchesOnPath(const NodeSpec& n, const std::vector<std::vector<uint32_t>>& byGpu) {
  std::vector<int64_t> gpuSwitch(n.gpus, -1), nicSwitch(nicsOf(n).size(), -1);
  for (uint32_t s = 0; s < n.pcieSwitches.size(); ++s) {
    for (uint32_t g : n.pcieSwitches[s].gpus) gpuSwitch[g] = s;
    for (uint32_t i : n.pcieSwitches[s].nics) nicSwitch[i] = s;
  }
  std::vector<std::vector<uint32_t>> out(n.gpus);
  for (uint32_t g = 0; g < n.gpus; ++g) {
    std::set<uint32_t> on;
    if (gpuSwitch[g] >= 0) on.insert(static_cast<uint32_t>(gpuSwitch[g]));
    for (uint32_t i : byGpu[g])
      if (nicSwitch[i] >= 0) on.insert(static_cast<uint32_t>(nicSwitch[i]));
    out[g].assign(on.begin(), on.end());
  }
  return out;
}

}  // namespace

std::vector<std::string> nicTransports() { return {"ib", "roce", "efa", "tcp"}; }

std::vector<NicSpec> nicsOf(const NodeSpec& n) {
  if (!n.nicList.empty()) return n.nicList;
  std::vector<NicSpec> out(n.nics, NicSpec{n.nic.bwGBs, n.nic.latencyUs, n.nic.transport, {}, {}});
  if (n.gpus == 0 || n.nics == 0) return out;
  if (n.nics <= n.gpus) {
    for (uint32_t g = 0; g < n.gpus; ++g) out[static_cast<uint64_t>(g) * n.nics / n.gpus].gpus.push_back(g);
  } else {
    for (uint32_t i = 0; i < n.nics; ++i)
      out[i].gpus.push_back(static_cast<uint32_t>(static_cast<uint64_t>(i) * n.gpus / n.nics));
  }
  return out;
}

std::vector<std::vector<uint32_t>> gpuNics(const NodeSpec& n) {
  std::vector<std::vector<uint32_t>> byGpu(n.gpus);
  const auto nics = nicsOf(n);
  for (uint32_t i = 0; i < nics.size(); ++i)
    for (uint32_t g : nics[i].gpus)
      if (g < n.gpus) byGpu[g].push_back(i);
  return byGpu;
}

double gpuNetworkGBs(const NodeSpec& n, uint32_t gpu, const std::vector<bool>* sending) {
  if (gpu >= n.gpus) return 0;
  const auto nics = nicsOf(n);
  const auto byGpu = gpuNics(n);
  if (byGpu[gpu].empty()) return 0;
  auto sends = [&](uint32_t g) { return g == gpu || !sending || (g < sending->size() && (*sending)[g]); };
  // NICs: striped over its k NICs, a transfer moves at k x the least fair share among them.
  double least = 0;
  bool first = true;
  for (uint32_t i : byGpu[gpu]) {
    uint32_t users = 0;
    for (uint32_t g : nics[i].gpus) users += sends(g) ? 1 : 0;
    const double share = nics[i].bwGBs / users;
    least = first ? share : std::min(least, share);
    first = false;
  }
  double rate = least * static_cast<double>(byGpu[gpu].size());
  rate = std::min(rate, n.pcie.bwGBs);
  // PCIe switch uplinks on its path, each shared fairly by the sending GPUs whose path crosses it.
  if (!n.pcieSwitches.empty()) {
    const auto paths = switchesOnPath(n, byGpu);
    for (uint32_t s : paths[gpu]) {
      uint32_t crossers = 0;
      for (uint32_t g = 0; g < n.gpus; ++g)
        if (sends(g) && std::find(paths[g].begin(), paths[g].end(), s) != paths[g].end()) ++crossers;
      rate = std::min(rate, n.pcieSwitches[s].bwGBs / crossers);
    }
  }
  return rate;
}

double gpuNetworkAloneGBs(const NodeSpec& n, uint32_t gpu) {
  std::vector<bool> only(n.gpus, false);
  if (gpu < n.gpus) only[gpu] = true;
  return gpuNetworkGBs(n, gpu, &only);
}

double nodeNetworkAloneGBs(const NodeSpec& n) {
  double least = 0;
  for (uint32_t g = 0; g < n.gpus; ++g) {
    const double r = gpuNetworkAloneGBs(n, g);
    if (r > 0) least = least > 0 ? std::min(least, r) : r;
  }
  return least;
}

std::vector<double> rankNetworkShares(const Topology& t, const std::vector<uint32_t>& nodeOf,
                                      const std::vector<bool>& sends) {
  std::vector<double> share(nodeOf.size(), 1.0);
  const NodeSpec& n = t.node;
  const double alone = nodeNetworkAloneGBs(n);
  if (!(alone > 0)) return share;
  // Local GPU of every rank, and per node which local GPUs send.
  std::vector<uint32_t> local(nodeOf.size());
  std::vector<uint32_t> used;
  std::vector<std::vector<bool>> sending;
  for (std::size_t r = 0; r < nodeOf.size(); ++r) {
    const uint32_t node = nodeOf[r];
    if (node >= used.size()) {
      used.resize(node + 1, 0);
      sending.resize(node + 1, std::vector<bool>(n.gpus, false));
    }
    local[r] = used[node]++;
    if (local[r] < n.gpus && r < sends.size() && sends[r]) sending[node][local[r]] = true;
  }
  // Nodes with the same senders share the same answer: cache by pattern (most nodes of a schedule look alike).
  std::vector<std::pair<std::vector<bool>, std::vector<double>>> cache;
  for (std::size_t r = 0; r < nodeOf.size(); ++r) {
    if (r >= sends.size() || !sends[r] || local[r] >= n.gpus) continue;
    const std::vector<bool>& pattern = sending[nodeOf[r]];
    std::vector<double>* rates = nullptr;
    for (auto& [key, value] : cache)
      if (key == pattern) rates = &value;
    if (!rates) {
      std::vector<double> v(n.gpus, 0);
      for (uint32_t g = 0; g < n.gpus; ++g)
        if (pattern[g]) v[g] = gpuNetworkGBs(n, g, &pattern);
      cache.emplace_back(pattern, std::move(v));
      rates = &cache.back().second;
    }
    share[r] = std::min(1.0, (*rates)[local[r]] / alone);  // the replay caps a lane at the profile rate too
  }
  return share;
}

namespace detail {

void validateNics(const Topology& t) {
  const NodeSpec& n = t.node;
  const std::string node = "the node";
  if (n.nicList.empty()) {
    checkTransport("node.nic.transport", n.nic.transport);
    if (n.nics > 0) {
      checkRate("node.nic.bwGBs", n.nic.bwGBs);
    } else {
      requireNonNegative("node.nic.bwGBs", n.nic.bwGBs);  // unused without NICs, but must still be a sane number
    }
    checkLatency("node.nic.latencyUs", n.nic.latencyUs);
  } else {
    if (n.nics != n.nicList.size())
      bad("node.nics: the count (" + std::to_string(n.nics) + ") must equal the NIC list's length (" +
          std::to_string(n.nicList.size()) + "): edit the list");
    std::set<std::string> names;
    for (std::size_t i = 0; i < n.nicList.size(); ++i) {
      const NicSpec& nic = n.nicList[i];
      const std::string f = idx("node.nics", i);
      checkRate(f + ".bwGBs", nic.bwGBs);
      checkLatency(f + ".latencyUs", nic.latencyUs);
      checkTransport(f + ".transport", nic.transport);
      if (nic.transport != n.nicList[0].transport)
        bad(f + ".transport: every NIC of a node must use one transport (got \"" + n.nicList[0].transport +
            "\" and \"" + nic.transport + "\")");
      if (nic.gpus.empty()) bad(f + ".gpus must name at least one local GPU (got an empty list)");
      checkIndexList(f + ".gpus", nic.gpus, n.gpus, "GPU", node);
      if (!nic.name.empty() && !names.insert(nic.name).second)
        bad(f + ".name: duplicate NIC \"" + nic.name + "\" (each NIC is listed once)");
    }
  }
  if (n.nics == 0 && t.nodes > 1)
    bad("node.nics: " + (t.name.empty() ? std::string("this topology") : t.name) +
        " has no NICs: a multi-node cluster (nodes = " + std::to_string(t.nodes) +
        ") needs nics > 0 (use dgx-h200 or a JSON file)");
  const auto byGpu = gpuNics(n);
  if (t.nodes > 1)
    for (uint32_t g = 0; g < n.gpus; ++g)
      if (byGpu[g].empty())
        bad("node.nics: GPU " + std::to_string(g) + " has no NIC: in a multi-node cluster every GPU needs one");
  const uint32_t nicCount = static_cast<uint32_t>(nicsOf(n).size());
  std::set<uint32_t> gpusOnSwitch, nicsOnSwitch;
  for (std::size_t s = 0; s < n.pcieSwitches.size(); ++s) {
    const PcieSwitchSpec& sw = n.pcieSwitches[s];
    const std::string f = idx("node.pcieSwitches", s);
    checkRate(f + ".bwGBs", sw.bwGBs);
    if (sw.gpus.empty() && sw.nics.empty()) bad(f + " must list at least one GPU or NIC");
    checkIndexList(f + ".gpus", sw.gpus, n.gpus, "GPU", node);
    checkIndexList(f + ".nics", sw.nics, nicCount, "NIC", node);
    for (uint32_t g : sw.gpus)
      if (!gpusOnSwitch.insert(g).second) bad(f + ".gpus: GPU " + std::to_string(g) + " is behind two switches");
    for (uint32_t i : sw.nics)
      if (!nicsOnSwitch.insert(i).second) bad(f + ".nics: NIC " + std::to_string(i) + " is behind two switches");
  }
}

}  // namespace detail

}  // namespace mk
