// The SimGrid platform built from a topology: routes, link capacities, latencies, pinned network model. Every
// test builds its platform in a child process of its own (one SimGrid engine per process).
#include <doctest/doctest.h>

#include <simgrid/s4u.hpp>
#include <xbt/config.hpp>

#include <sstream>
#include <string>
#include <vector>

#include "mk/sim/platform.hpp"
#include "mk/sim/replay.hpp"
#include "sim_test_util.hpp"

namespace sg4 = simgrid::s4u;

namespace {

/// Build `topo` in a fresh engine inside a child and return what `inspect` prints about it.
template <class F>
std::string inChild(const mk::Topology& topo, F inspect, const mk::Profile& prof = simtest::profile()) {
  return mk::sim::runIsolated([&] {
    auto* engine = new sg4::Engine("platform-test");
    mk::sim::configureEngine(mk::sim::EngineConfig{});
    const mk::sim::Platform p = mk::sim::buildPlatform(topo, prof);
    std::ostringstream os;
    inspect(*engine, p, os);
    return os.str();
  });
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : " ") + s;
  return out;
}

}  // namespace

TEST_CASE("platform: an nvswitch node routes gpu a to b through a's up link and b's down link") {
  const std::string out =
      inChild(simtest::cluster(1, 4), [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
        os << join(mk::sim::routeLinks(p.gpu[1], p.gpu[3])) << "|" << join(mk::sim::routeLinks(p.gpu[3], p.gpu[1]));
      });
  CHECK(out == "n0.nvl1_UP n0.nvl3_DOWN|n0.nvl3_UP n0.nvl1_DOWN");
}

TEST_CASE("platform: a two gpu node without a switch uses one direct split duplex link") {
  const std::string out = inChild(simtest::cluster(1, 2, 32, 1.0, /*switched=*/false),
                                  [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
                                    os << join(mk::sim::routeLinks(p.gpu[0], p.gpu[1])) << "|"
                                       << join(mk::sim::routeLinks(p.gpu[1], p.gpu[0]));
                                  });
  CHECK(out == "n0.nvl0-1_UP|n0.nvl0-1_DOWN");
}

TEST_CASE("platform: direct links of a larger node split the per gpu bandwidth over its peers") {
  const std::string out = inChild(simtest::cluster(1, 3, 32, 1.0, /*switched=*/false),
                                  [](sg4::Engine& e, const mk::sim::Platform& p, std::ostream& os) {
                                    os << join(mk::sim::routeLinks(p.gpu[2], p.gpu[0])) << "|"
                                       << e.link_by_name("n0.nvl0-2_UP")->get_bandwidth();
                                  });
  CHECK(out == "n0.nvl0-2_DOWN|5e+10");  // 100 GB/s per GPU over 2 peers
}

TEST_CASE("platform: a same rail same leaf network route is the pcie and nic of both ends") {
  const std::string out =
      inChild(simtest::cluster(2, 2), [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
        os << join(mk::sim::routeLinks(p.net[1], p.net[3]));
      });
  CHECK(out == "n0.pcie1_UP n0.nic1_UP n1.nic1_DOWN n1.pcie1_DOWN");
}

TEST_CASE("platform: a route to another leaf crosses both leaf uplinks") {
  const std::string out =
      inChild(simtest::cluster(3, 1, /*perLeaf=*/2), [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
        os << join(mk::sim::routeLinks(p.net[0], p.net[2])) << "|" << join(mk::sim::routeLinks(p.net[0], p.net[1]));
      });
  CHECK(out ==
        "n0.pcie0_UP n0.nic0_UP rail0.leaf0.up_UP rail0.leaf1.up_DOWN n2.nic0_DOWN n2.pcie0_DOWN|"
        "n0.pcie0_UP n0.nic0_UP n1.nic0_DOWN n1.pcie0_DOWN");
}

TEST_CASE("platform: a cross rail route goes through the spine") {
  const std::string out =
      inChild(simtest::cluster(2, 2), [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
        os << join(mk::sim::routeLinks(p.net[0], p.net[3]));
      });
  CHECK(out == "n0.pcie0_UP n0.nic0_UP rail0.leaf0.up_UP rail1.leaf0.up_DOWN n1.nic1_DOWN n1.pcie1_DOWN");
}

TEST_CASE("platform: gpus sharing a nic share its link") {
  const std::string out = inChild(simtest::cluster(2, 4, 32, 1.0, true, /*nics=*/2),
                                  [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
                                    os << p.railOf(0) << p.railOf(1) << p.railOf(2) << p.railOf(3) << "|"
                                       << join(mk::sim::routeLinks(p.net[1], p.net[5]));
                                  });
  CHECK(out == "0011|n0.pcie1_UP n0.nic0_UP n1.nic0_DOWN n1.pcie1_DOWN");
}

TEST_CASE("platform: every link has zero latency") {
  const std::string out =
      inChild(simtest::cluster(3, 4, 2), [](sg4::Engine& e, const mk::sim::Platform&, std::ostream& os) {
        int nonzero = 0;
        for (const sg4::Link* l : e.get_all_links()) nonzero += l->get_latency() != 0.0;
        os << e.get_link_count() << " " << nonzero;
      });
  std::istringstream in(out);
  std::size_t links = 0;
  int nonzero = -1;
  in >> links >> nonzero;
  CHECK(links > 20);
  CHECK(nonzero == 0);
}

TEST_CASE("platform: the network model is pinned to cm02 without crosstraffic and tcp window") {
  const std::string out = inChild(simtest::cluster(1, 2), [](sg4::Engine&, const mk::sim::Platform&, std::ostream& os) {
    os << simgrid::config::get_value<std::string>("network/model") << " "
       << simgrid::config::get_value<bool>("network/crosstraffic") << " "
       << simgrid::config::get_value<double>("network/TCP-gamma");
  });
  CHECK(out == "CM02 0 0");
}

TEST_CASE("platform: link bandwidths follow the profile and the oversubscription") {
  mk::Profile prof = simtest::profile();
  prof.nvlink.bwGBs = 80;   // calibrated below the topology's 100
  prof.network.bwGBs = 40;  // path bottleneck: NIC 50 -> scale 0.8
  const std::string out = inChild(
      simtest::cluster(4, 2, /*perLeaf=*/2, /*oversub=*/4.0),
      [](sg4::Engine& e, const mk::sim::Platform&, std::ostream& os) {
        os << e.link_by_name("n0.nvl1_UP")->get_bandwidth() << " " << e.link_by_name("n3.nic1_DOWN")->get_bandwidth()
           << " " << e.link_by_name("n3.pcie1_UP")->get_bandwidth() << " "
           << e.link_by_name("rail1.leaf1.up_UP")->get_bandwidth();
      },
      prof);
  // NVLink 80; NIC 50 x 0.8 = 40; PCIe 100 x 0.8 = 80; uplink 2 nodes x 40 / 4 = 20 (GB/s)
  CHECK(out == "8e+10 4e+10 8e+10 2e+10");
}

TEST_CASE("platform: extra switch hops are zero inside a leaf and two across leaves or rails") {
  const std::string out =
      inChild(simtest::cluster(3, 2, /*perLeaf=*/2), [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
        os << p.extraSwitchHops(0, 2) << p.extraSwitchHops(0, 4) << p.extraSwitchHops(0, 3);
      });
  CHECK(out == "022");
}

TEST_CASE("platform: a single node cluster has no network world") {
  const std::string out =
      inChild(simtest::cluster(1, 8), [](sg4::Engine& e, const mk::sim::Platform& p, std::ostream& os) {
        os << p.net.size() << " " << e.get_host_count() << " " << p.gpu[0]->get_core_count();
      });
  CHECK(out == "0 8 2");
}

TEST_CASE("platform: a multi node cluster without nics is rejected") {
  mk::Topology t = simtest::cluster(2, 2);
  t.node.nics = 0;
  const mk::Error e = simtest::errorOf([&] { mk::sim::platformRates(t, simtest::profile()); });
  CHECK(e.code() == mk::ErrorCode::InvalidArgument);
  CHECK(e.message().find("nics") != std::string::npos);
}

TEST_CASE("platform: a gpu with several nics gets an endpoint per nic, on their rails") {
  const std::string out = inChild(simtest::cluster(2, 2, 32, 1.0, true, /*nics=*/4),
                                  [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
                                    os << p.netVia[1].size() << " " << p.railOf(1, 0) << p.railOf(1, 1) << "|"
                                       << join(mk::sim::routeLinks(p.netVia[1][1], p.netVia[3][1]));
                                  });
  CHECK(out == "2 23|n0.pcie1_UP n0.nic3_UP n1.nic3_DOWN n1.pcie1_DOWN");
}

TEST_CASE("platform: a pcie switch uplink joins the routes of the gpus behind it") {
  mk::Topology t = simtest::cluster(2, 2);
  t.node.pcieSwitches.push_back(mk::PcieSwitchSpec{100, {0, 1}, {}});
  const std::string out = inChild(t, [](sg4::Engine&, const mk::sim::Platform& p, std::ostream& os) {
    os << join(mk::sim::routeLinks(p.net[1], p.net[3]));
  });
  CHECK(out == "n0.pcie1_UP n0.pcieSw0_UP n0.nic1_UP n1.nic1_DOWN n1.pcieSw0_DOWN n1.pcie1_DOWN");
}

TEST_CASE("platform: a profile with zero nvlink bandwidth is rejected naming the field") {
  mk::Profile prof = simtest::profile();
  prof.nvlink.bwGBs = 0;
  const mk::Error e = simtest::errorOf([&] { mk::sim::platformRates(simtest::cluster(1, 2), prof); });
  CHECK(e.code() == mk::ErrorCode::InvalidArgument);
  CHECK(e.message().find("profile.nvlink.bwGBs") != std::string::npos);
}

TEST_CASE("platform: a simulation builds only the nodes up to the last one its ranks use") {
  const mk::Topology topo = mk::topologyPreset("dgx-h100", 4000);
  mk::Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 0};
  CHECK(mk::sim::usedPart(topo, s).nodes == 1);
  s.nodeOf = {0, 2};
  CHECK(mk::sim::usedPart(topo, s).nodes == 3);
  s.nodeOf = {0, 3999};
  CHECK(mk::sim::usedPart(topo, s).nodes == 4000);
  // Everything but the node count is the cluster's.
  CHECK(mk::sim::usedPart(topo, s).fabric.nodesPerLeaf == topo.fabric.nodesPerLeaf);
}
