// Fuzz target: the topology reader (topologyFromJson). An accepted topology must be written and read back.
#include "fuzz_target.hpp"
#include "mk/topology/topology.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return mk::fuzz::run(data, size, [](const std::string& text) {
    const mk::Topology t = mk::topologyFromJson(text);
    const mk::Topology back = mk::topologyFromJson(mk::topologyToJson(t, -1));
    if (back.nodes != t.nodes || back.node.gpus != t.node.gpus || back.fabric.nodesPerLeaf != t.fabric.nodesPerLeaf)
      mk::fuzz::violated("fuzz_topology", "the written topology reads back differently");
  });
}
