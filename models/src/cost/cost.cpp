// placeholder (being written): link stubs
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
namespace mk {
#define MK_STUB throw Error(ErrorCode::Internal, "not implemented yet")
Profile defaultProfile(const Topology&) { MK_STUB; }
CostEstimate closedForm(const CollectiveSpec&, const GenOptions&, const Topology&, uint32_t, const Profile&) { MK_STUB; }
Timeline simulateUncontended(const Schedule&, const Profile&) { MK_STUB; }
double busBwFactor(CollOp, uint32_t) noexcept { return 1; }
uint64_t opBytes(const CollectiveSpec&, uint32_t) noexcept { return 0; }
}
