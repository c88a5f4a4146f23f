// placeholder (being written): link stubs
#include "mk/schedule/schedule.hpp"
#include "mk/error.hpp"
namespace mk {
int Schedule::bufferIndex(const std::string&) const noexcept { return -1; }
uint64_t Schedule::stepCount() const noexcept { return 0; }
LinkClass linkBetween(const Schedule&, uint32_t, uint32_t) noexcept { return LinkClass::None; }
std::string describeStep(const Schedule&, uint32_t, uint32_t, uint32_t) { return "?"; }
}
