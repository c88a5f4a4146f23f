// placeholder (being written): link stubs
#include "builder.hpp"
namespace mk::detail {
const std::vector<AlgorithmDef>& allReduceAlgorithms() { static const std::vector<AlgorithmDef> v; return v; }
}
