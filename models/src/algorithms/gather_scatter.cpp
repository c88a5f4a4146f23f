// placeholder (being written): link stubs
#include "builder.hpp"
namespace mk::detail {
const std::vector<AlgorithmDef>& gatherScatterAlgorithms() { static const std::vector<AlgorithmDef> v; return v; }
}
