// placeholder (being written): link stubs
#include "mk/schedule/pack.hpp"
#include "mk/error.hpp"
namespace mk {
#define MK_STUB throw Error(ErrorCode::Internal, "not implemented yet")
std::vector<uint8_t> pack(const Schedule&) { MK_STUB; }
std::vector<uint8_t> packRank(const Schedule&, uint32_t) { MK_STUB; }
Schedule unpack(const uint8_t*, std::size_t) { MK_STUB; }
void fillCostAttributes(Schedule&) {}
}
