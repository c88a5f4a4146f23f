// CPU tests of the NVLink probe's effect on the topology (the probe itself runs in mk_multiprocess_tests).
#include <doctest/doctest.h>

#include <string>

#include "device/topology_probe.hpp"
#include "mk/topology/topology.hpp"

TEST_CASE("topology: NVLink probes refine the local topology and say why when they cannot") {
  mk::runtime::NvlinkProbe direct;
  direct.available = true;
  direct.activeLinks = 12;
  direct.linksToPeer = {12};
  mk::Topology t = mk::topologyPreset("dgx-h200");
  CHECK(mk::runtime::applyNvlinkProbes(t, {direct, direct}, 8) == "12 NVLinks per GPU, direct");
  CHECK(t.node.nvlink.bwGBs == doctest::Approx(300));
  CHECK_FALSE(t.node.nvlink.switched);
  mk::runtime::NvlinkProbe none;
  none.why = "libnvidia-ml.so.1 cannot be loaded";
  mk::Topology u = mk::topologyPreset("dgx-h200");
  const double before = u.node.nvlink.bwGBs;
  CHECK(mk::runtime::applyNvlinkProbes(u, {direct, none}, 9).find("cannot be loaded") != std::string::npos);
  CHECK(u.node.nvlink.bwGBs == before);
}
