// placeholder (being written): link stubs
#include "mk/exec/executor.hpp"
#include "mk/error.hpp"
namespace mk {
HostMemory HostMemory::allocate(const Schedule&) { throw Error(ErrorCode::Internal, "not implemented yet"); }
void execute(const Schedule&, HostMemory&, const ExecOptions&) { throw Error(ErrorCode::Internal, "not implemented yet"); }
}
