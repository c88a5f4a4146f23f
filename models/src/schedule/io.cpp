// placeholder (being written): link stubs
#include "mk/schedule/io.hpp"
#include "mk/error.hpp"
namespace mk {
#define MK_STUB throw Error(ErrorCode::Internal, "not implemented yet")
std::string scheduleToJson(const Schedule&, int) { MK_STUB; }
Schedule scheduleFromJson(const std::string&) { MK_STUB; }
Schedule loadSchedule(const std::string&) { MK_STUB; }
void saveSchedule(const Schedule&, const std::string&) { MK_STUB; }
void writeFileAtomic(const std::string&, const std::string&) { MK_STUB; }
std::string readFile(const std::string&) { MK_STUB; }
}
