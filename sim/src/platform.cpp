// mkernel — topology -> SimGrid 3.32 platform (platform.hpp, docs/simulator.md).
#include "mk/sim/platform.hpp"

#include <xbt/log.h>
#include <simgrid/s4u.hpp>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "mk/error.hpp"
#include "mk/topology/topology.hpp"

XBT_LOG_NEW_DEFAULT_CATEGORY(mk_platform, "mkernel: topology -> SimGrid platform");

namespace sg4 = simgrid::s4u;

namespace mk::sim {

namespace {

using Direction = sg4::LinkInRoute::Direction;

constexpr double kBytesPerGB = 1e9;
// The GPU host's cores are abstract "work" units: an Exec's amount is its duration at full rate in
// nanoseconds (replay.cpp), so one core delivers 1e9 units per second.
constexpr double kGpuCoreSpeed = 1e9;

double positiveRate(const char* field, double gbs) {
  requirePositive(field, gbs, "the platform");
  return gbs * kBytesPerGB;
}

std::string nodeName(uint32_t node) { return "n" + std::to_string(node); }

}  // namespace

void configureEngine(const EngineConfig& cfg) {
  xbt_log_control_set(cfg.verbose ? "root.thres:info" : "root.thres:critical");
  // LV08 (the default) multiplies latency by 13 and caps flows by a TCP window fit: wrong for NVLink and RDMA.
  // CM02 keeps max-min sharing with factors 1; crosstraffic would charge 5% of every flow to the reverse
  // direction (TCP ACKs); TCP-gamma 0 removes the window bound (3.32 ignores a bound of 0).
  sg4::Engine::set_config("network/model:CM02");
  sg4::Engine::set_config("network/crosstraffic:0");
  sg4::Engine::set_config("network/TCP-gamma:0");
  sg4::Engine::set_config("contexts/stack-size", static_cast<int>(cfg.actorStackKiB));
  // A guard page splits each actor stack into two memory mappings; 8192 GPUs have ~25k lane actors and the
  // default vm.max_map_count (65536) then runs out. Lane actors are shallow loops: no guard page.
  sg4::Engine::set_config("contexts/guard-size", 0);
}

PlatformRates platformRates(const Topology& topo, const Profile& profile) {
  validateTopology(topo);
  PlatformRates r;
  const NodeSpec& n = topo.node;
  const double perGpu = positiveRate("profile.nvlink.bwGBs", profile.nvlink.bwGBs);
  // Direct links: the per-GPU total is split evenly over its gpus-1 peers (NV18 on a 2-GPU node: all of it).
  r.nvlinkBps = (n.nvlink.switched || n.gpus <= 2) ? perGpu : perGpu / static_cast<double>(n.gpus - 1);
  if (topo.nodes > 1) {
    const double pcie = positiveRate("topology node.pcie.bwGBs", n.pcie.bwGBs);
    const double alone = positiveRate("topology node.nics (the network path of one GPU)", nodeNetworkAloneGBs(n));
    const double wanted = positiveRate("profile.network.bwGBs", profile.network.bwGBs);
    r.networkScale = wanted / alone;
    r.pcieBps = pcie * r.networkScale;
    for (const NicSpec& nic : nicsOf(n)) r.nicBpsOf.push_back(nic.bwGBs * kBytesPerGB * r.networkScale);
    for (const PcieSwitchSpec& sw : n.pcieSwitches) r.switchBpsOf.push_back(sw.bwGBs * kBytesPerGB * r.networkScale);
    r.nicBps = r.nicBpsOf.empty() ? 0 : r.nicBpsOf[0];
    r.leafUplinkBps = static_cast<double>(topo.fabric.nodesPerLeaf) * r.nicBps / topo.fabric.oversubscription;
  }
  return r;
}

uint32_t Platform::railOf(uint32_t local) const noexcept { return railOf(local, 0); }

uint32_t Platform::railOf(uint32_t local, uint32_t stripe) const noexcept {
  if (local < gpuRails.size() && !gpuRails[local].empty()) return gpuRails[local][stripe % gpuRails[local].size()];
  if (nicsPerNode == 0 || gpusPerNode == 0) return 0;
  return static_cast<uint32_t>(static_cast<uint64_t>(local) * nicsPerNode / gpusPerNode);
}

uint32_t Platform::extraSwitchHops(uint32_t gpuA, uint32_t gpuB) const noexcept {
  return extraSwitchHops(gpuA, gpuB, 0);
}

uint32_t Platform::extraSwitchHops(uint32_t gpuA, uint32_t gpuB, uint32_t stripe) const noexcept {
  const uint32_t nodeA = gpuA / gpusPerNode, nodeB = gpuB / gpusPerNode;
  const bool sameRail = railOf(gpuA % gpusPerNode, stripe) == railOf(gpuB % gpusPerNode, stripe);
  const bool sameLeaf = nodeA / nodesPerLeaf == nodeB / nodesPerLeaf;
  return sameRail && sameLeaf ? 0 : 2;
}

Platform buildPlatform(const Topology& topo, const Profile& profile, bool nvlink) {
  validateTopology(topo);
  const NodeSpec& spec = topo.node;
  Platform p;
  p.nodes = topo.nodes;
  p.gpusPerNode = spec.gpus;
  p.nodesPerLeaf = topo.fabric.nodesPerLeaf;
  p.nicsPerNode = spec.nics;
  p.gpuRails = gpuNics(spec);
  p.switchLatencyUs = topo.fabric.switchLatencyUs;
  p.rates = platformRates(topo, profile);
  const uint32_t total = topo.totalGpus();
  p.gpu.resize(total, nullptr);

  auto* root = sg4::create_star_zone("cluster");

  // ---- NVLink world: a star zone per node (full zone for direct links) -----------------------------------
  for (uint32_t node = 0; node < topo.nodes; ++node) {
    const std::string nn = nodeName(node);
    const bool star = spec.nvlink.switched;
    const bool links = nvlink && spec.gpus > 1;
    sg4::NetZone* zone = star ? sg4::create_star_zone(nn) : sg4::create_full_zone(nn);
    zone->set_parent(root);
    for (uint32_t g = 0; g < spec.gpus; ++g) {
      // Two cores: Copy/Reduce (memory pipe) and Gemm (tensor pipe) run side by side, as in the timeline model.
      sg4::Host* h = zone->create_host(nn + ".gpu" + std::to_string(g), kGpuCoreSpeed)->set_core_count(2)->seal();
      p.gpu[node * spec.gpus + g] = h;
      if (star && links) {
        sg4::Link* nvl = zone->create_split_duplex_link(nn + ".nvl" + std::to_string(g), p.rates.nvlinkBps)->seal();
        // Star route = source up-links + destination down-links: GPU a -> b is nvl_a UP, nvl_b DOWN, through a
        // non-blocking NVSwitch centre.
        zone->add_route(h->get_netpoint(), nullptr, nullptr, nullptr, {{nvl, Direction::UP}}, true);
      }
    }
    // Direct links: one split-duplex link per pair, UP in the a -> b direction for a < b.
    if (!star && links) {
      for (uint32_t a = 0; a < spec.gpus; ++a)
        for (uint32_t b = a + 1; b < spec.gpus; ++b) {
          sg4::Link* l = zone->create_split_duplex_link(nn + ".nvl" + std::to_string(a) + "-" + std::to_string(b),
                                                        p.rates.nvlinkBps)
                             ->seal();
          zone->add_route(p.gpu[node * spec.gpus + a]->get_netpoint(), p.gpu[node * spec.gpus + b]->get_netpoint(),
                          nullptr, nullptr, {{l, Direction::UP}}, false);
          zone->add_route(p.gpu[node * spec.gpus + b]->get_netpoint(), p.gpu[node * spec.gpus + a]->get_netpoint(),
                          nullptr, nullptr, {{l, Direction::DOWN}}, false);
        }
    }
    zone->seal();
  }

  // ---- network world: rail leaves under an aggregated spine ----------------------------------------------
  // Only multi-node clusters have one: a ProxyPut never stays inside a node.
  if (topo.nodes > 1) {
    p.net.resize(total, nullptr);
    p.netVia.resize(total);
    for (uint32_t gpu = 0; gpu < total; ++gpu) p.netVia[gpu].resize(p.gpuRails[gpu % spec.gpus].size(), nullptr);
    const auto nics = nicsOf(spec);
    // The PCIe switches on each GPU's way to each of its NICs: its own, then the NIC's when that is another.
    std::vector<int64_t> gpuSwitch(spec.gpus, -1), nicSwitch(nics.size(), -1);
    for (uint32_t sw = 0; sw < spec.pcieSwitches.size(); ++sw) {
      for (uint32_t g : spec.pcieSwitches[sw].gpus) gpuSwitch[g] = sw;
      for (uint32_t i : spec.pcieSwitches[sw].nics) nicSwitch[i] = sw;
    }
    std::vector<sg4::Link*> pcie(total, nullptr);  // created with the GPU's first endpoint, shared by the rest
    std::vector<sg4::Link*> switches(spec.pcieSwitches.size() * topo.nodes, nullptr);
    auto* fabric = sg4::create_star_zone("fabric");
    fabric->set_parent(root);
    const uint32_t leaves = (topo.nodes + p.nodesPerLeaf - 1) / p.nodesPerLeaf;
    for (uint32_t rail = 0; rail < nics.size(); ++rail) {
      for (uint32_t leaf = 0; leaf < leaves; ++leaf) {
        const std::string ln = "rail" + std::to_string(rail) + ".leaf" + std::to_string(leaf);
        auto* zone = sg4::create_star_zone(ln);
        zone->set_parent(fabric);
        auto* sw = zone->create_router(ln + ".sw");
        const uint32_t lastNode = std::min(topo.nodes, (leaf + 1) * p.nodesPerLeaf);
        for (uint32_t node = leaf * p.nodesPerLeaf; node < lastNode; ++node) {
          const std::string nn = nodeName(node);
          sg4::Link* nic =
              zone->create_split_duplex_link(nn + ".nic" + std::to_string(rail), p.rates.nicBpsOf[rail])->seal();
          auto switchLink = [&](int64_t s) -> sg4::Link* {
            sg4::Link*& l = switches[node * spec.pcieSwitches.size() + s];
            if (!l)
              l = zone->create_split_duplex_link(nn + ".pcieSw" + std::to_string(s), p.rates.switchBpsOf[s])->seal();
            return l;
          };
          for (uint32_t g : nics[rail].gpus) {
            const uint32_t gpu = node * spec.gpus + g;
            const auto& mine = p.gpuRails[g];
            const uint32_t stripe = static_cast<uint32_t>(std::find(mine.begin(), mine.end(), rail) - mine.begin());
            const std::string en = nn + ".gpu" + std::to_string(g) + ".net" + (stripe == 0 ? "" : std::to_string(rail));
            sg4::Host* ep = zone->create_host(en, kGpuCoreSpeed)->seal();
            if (!pcie[gpu])
              pcie[gpu] = zone->create_split_duplex_link(nn + ".pcie" + std::to_string(g), p.rates.pcieBps)->seal();
            std::vector<sg4::LinkInRoute> up{{pcie[gpu], Direction::UP}};
            if (gpuSwitch[g] >= 0) up.emplace_back(switchLink(gpuSwitch[g]), Direction::UP);
            if (nicSwitch[rail] >= 0 && nicSwitch[rail] != gpuSwitch[g])
              up.emplace_back(switchLink(nicSwitch[rail]), Direction::UP);
            up.emplace_back(nic, Direction::UP);
            zone->add_route(ep->get_netpoint(), nullptr, nullptr, nullptr, up, true);
            p.netVia[gpu][stripe] = ep;
            if (stripe == 0) p.net[gpu] = ep;
          }
        }
        // The leaf switch is a non-blocking crossbar: no link between the NICs of one leaf.
        zone->add_route(sw, nullptr, nullptr, nullptr, {}, true);
        zone->seal();
        const double uplink =
            static_cast<double>(p.nodesPerLeaf) * p.rates.nicBpsOf[rail] / topo.fabric.oversubscription;
        sg4::Link* up = fabric->create_split_duplex_link(ln + ".up", uplink)->seal();
        fabric->add_route(zone->get_netpoint(), nullptr, sw, nullptr, {{up, Direction::UP}}, true);
      }
    }
    fabric->seal();
  }
  XBT_INFO(
      "platform %s: %u nodes x %u GPUs, nvlink %g GB/s, nic %g GB/s, pcie %g GB/s, leaf uplink %g GB/s, "
      "%s",
      topo.name.c_str(), topo.nodes, spec.gpus, p.rates.nvlinkBps / kBytesPerGB, p.rates.nicBps / kBytesPerGB,
      p.rates.pcieBps / kBytesPerGB, p.rates.leafUplinkBps / kBytesPerGB,
      spec.nvlink.switched ? "NVSwitch" : "direct NVLink");
  root->seal();
  return p;
}

std::vector<std::string> routeLinks(const sg4::Host* from, const sg4::Host* to) {
  std::vector<sg4::Link*> links;
  double latency = 0;
  from->route_to(to, links, &latency);
  std::vector<std::string> names;
  names.reserve(links.size());
  for (const sg4::Link* l : links) names.push_back(l->get_name());
  return names;
}

}  // namespace mk::sim
