// placeholder (being written): link stubs
#include "mk/topology/topology.hpp"
#include "mk/error.hpp"
namespace mk {
#define MK_STUB throw Error(ErrorCode::Internal, "not implemented yet")
std::vector<uint32_t> Topology::layout(uint32_t) const { MK_STUB; }
std::vector<std::string> topologyPresets() { return {}; }
Topology topologyPreset(const std::string&, uint32_t) { MK_STUB; }
void validateTopology(const Topology&) {}
std::string topologyToJson(const Topology&, int) { MK_STUB; }
Topology topologyFromJson(const std::string&) { MK_STUB; }
Topology loadTopology(const std::string&, uint32_t) { MK_STUB; }
}
