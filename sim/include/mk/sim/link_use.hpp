// mkernel — the simulated links' load as resource use (mk/cost/bottleneck.hpp), for the "what bounds it" line.
#pragma once

#include <string>
#include <vector>

#include "mk/cost/bottleneck.hpp"
#include "mk/sim/replay.hpp"

namespace mk::sim {

/// The kind of a platform link, from its name (platform.cpp names them): "n0.nvl2_UP" and "n0.nvl0-1_DOWN"
/// NVLink, "n3.nic5_UP" network, "n1.pcie0_UP" and "n1.pcieSw0_UP" PCIe, "rail1.leaf0.up_UP" fabric.
std::string linkKind(const std::string& name);

/// Every loaded link as a ResourceUse (busy = its utilization).
std::vector<ResourceUse> linkResourceUse(const std::vector<LinkLoad>& links);

}  // namespace mk::sim
