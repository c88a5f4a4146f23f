// mkernel — internal: what the topology's translation units share (presets, NIC lists, validation).
#pragma once

#include <string>

#include "mk/topology/topology.hpp"

namespace mk::detail {

/// The preset `name` with one node; throws Error(NotFound) listing the presets for an unknown name.
Topology presetOneNode(const std::string& name);
/// "h200x2, dgx-h100, ...": the list every "unknown preset" message shows.
std::string presetList();
/// The NIC rules of validateTopology: the uniform NIC or the NIC list, a NIC for every GPU of a multi-node
/// cluster, the PCIe switches. Throws Error(InvalidArgument) naming the field.
void validateNics(const Topology& t);

}  // namespace mk::detail
