// placeholder (being written): link stubs
#include "mk/schedule/types.hpp"
#include "mk/error.hpp"
namespace mk {
#define MK_STUB throw Error(ErrorCode::Internal, "not implemented yet")
const char* toString(DType) noexcept { return "?"; }
const char* toString(RedOp) noexcept { return "?"; }
const char* toString(LaneRole) noexcept { return "?"; }
const char* toString(LinkClass) noexcept { return "?"; }
const char* toString(StepKind) noexcept { return "?"; }
const char* toString(BufferKind) noexcept { return "?"; }
std::optional<DType> parseDType(std::string_view) noexcept { return std::nullopt; }
std::optional<RedOp> parseRedOp(std::string_view) noexcept { return std::nullopt; }
std::optional<LaneRole> parseLaneRole(std::string_view) noexcept { return std::nullopt; }
std::optional<LinkClass> parseLinkClass(std::string_view) noexcept { return std::nullopt; }
std::optional<StepKind> parseStepKind(std::string_view) noexcept { return std::nullopt; }
std::optional<BufferKind> parseBufferKind(std::string_view) noexcept { return std::nullopt; }
}
