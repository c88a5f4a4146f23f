// mkernel — scalar vocabulary of the Schedule IR: element types, reduction ops, lane roles, link classes.
//
// Every enum here has a fixed underlying width and fixed values because they cross into the packed
// binary form (see pack.hpp) and into JSON by name. Never renumber; append.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

#include "mk/schedule/element.hpp"
#include "mk/schedule/step_kind.hpp"

namespace mk {

/// What a lane's CTAs are for; the runtime maps roles to CTA groups, the simulator to actors.
enum class LaneRole : uint8_t { Compute = 0, Intra = 1, InterSend = 2, InterRecv = 3 };
/// Which physical path a step's bytes take. `None` for pure synchronisation (Wait, Barrier).
enum class LinkClass : uint8_t { None = 0, Local = 1, NVLink = 2, Network = 3 };
/// Role of a buffer in an op; `InOut` is read and written (in-place variants).
enum class BufferKind : uint8_t { Input = 0, Output = 1, Scratch = 2, InOut = 3 };

/// Stable names used in JSON, CLIs and traces ("float32", "sum", "intra", "nvlink", "put", ...).
const char* toString(DType v) noexcept;
const char* toString(RedOp v) noexcept;
const char* toString(LaneRole v) noexcept;
const char* toString(LinkClass v) noexcept;
const char* toString(BufferKind v) noexcept;

/// Parsers for the names above; accept a few common aliases (fp32, f32, bf16, fp16, half).
std::optional<DType> parseDType(std::string_view s) noexcept;
std::optional<RedOp> parseRedOp(std::string_view s) noexcept;
std::optional<LaneRole> parseLaneRole(std::string_view s) noexcept;
std::optional<LinkClass> parseLinkClass(std::string_view s) noexcept;
std::optional<BufferKind> parseBufferKind(std::string_view s) noexcept;

/// The element type of an operation's data (a collective's, a fused operator's, a measured record's): parseDType,
/// or Error(InvalidArgument) "unknown <what> '<s>' (expected float32, bfloat16, float16, float8_e4m3,
/// float8_e5m2)": the one spelling of a bad element type name, for tools (what = "--dtype") and readers (what =
/// "dtype"). An integer type (int32: routing data in schedule buffers) is refused the same way, saying so.
DType requireDType(std::string_view s, std::string_view what = "dtype");
/// A collective's reduction operator: parseRedOp, or Error(InvalidArgument) "unknown <what> '<s>' (expected sum,
/// max, min)"; a row operator (lse-merge: Reduce steps only, it needs a row width) is refused the same way.
RedOp requireRedOp(std::string_view s, std::string_view what = "redop");

/// The names of every element type ("float32, bfloat16, ..., int32") and of the collective reduction operators ("sum,
/// max, min"), for messages.
const char* dtypeNames() noexcept;
const char* collectiveRedOpNames() noexcept;

}  // namespace mk
