// mkernel — names of the Schedule IR's scalar vocabulary (JSON, CLIs, traces).
//
// The names are part of the file format (docs/schedule-format.md): never rename one, only add aliases.
#include "mk/schedule/types.hpp"

#include <array>
#include <string>
#include <utility>

#include "mk/error.hpp"

namespace mk {
namespace {

/// A case-sensitive name -> value table; the canonical name comes first for each value.
template <typename E, std::size_t N>
std::optional<E> lookup(const std::array<std::pair<std::string_view, E>, N>& table, std::string_view s) noexcept {
  for (const auto& [name, value] : table)
    if (name == s) return value;
  return std::nullopt;
}

constexpr std::array<std::pair<std::string_view, DType>, 9> kDTypeNames{{
    {"float32", DType::Float32},
    {"fp32", DType::Float32},
    {"f32", DType::Float32},
    {"bfloat16", DType::BFloat16},
    {"bf16", DType::BFloat16},
    {"float16", DType::Float16},
    {"fp16", DType::Float16},
    {"f16", DType::Float16},
    {"half", DType::Float16},
}};
constexpr std::array<std::pair<std::string_view, RedOp>, 3> kRedOpNames{{
    {"sum", RedOp::Sum},
    {"max", RedOp::Max},
    {"min", RedOp::Min},
}};
constexpr std::array<std::pair<std::string_view, LaneRole>, 4> kLaneRoleNames{{
    {"compute", LaneRole::Compute},
    {"intra", LaneRole::Intra},
    {"inter-send", LaneRole::InterSend},
    {"inter-recv", LaneRole::InterRecv},
}};
constexpr std::array<std::pair<std::string_view, LinkClass>, 4> kLinkClassNames{{
    {"none", LinkClass::None},
    {"local", LinkClass::Local},
    {"nvlink", LinkClass::NVLink},
    {"network", LinkClass::Network},
}};
constexpr std::array<std::pair<std::string_view, BufferKind>, 4> kBufferKindNames{{
    {"input", BufferKind::Input},
    {"output", BufferKind::Output},
    {"scratch", BufferKind::Scratch},
    {"inout", BufferKind::InOut},
}};

}  // namespace

// The switches have no default so -Wswitch flags a new enumerator; "?" covers values cast from bad input.
const char* toString(DType v) noexcept {
  switch (v) {
    case DType::Float32: return "float32";
    case DType::BFloat16: return "bfloat16";
    case DType::Float16: return "float16";
  }
  return "?";
}

const char* toString(RedOp v) noexcept {
  switch (v) {
    case RedOp::Sum: return "sum";
    case RedOp::Max: return "max";
    case RedOp::Min: return "min";
  }
  return "?";
}

const char* toString(LaneRole v) noexcept {
  switch (v) {
    case LaneRole::Compute: return "compute";
    case LaneRole::Intra: return "intra";
    case LaneRole::InterSend: return "inter-send";
    case LaneRole::InterRecv: return "inter-recv";
  }
  return "?";
}

const char* toString(LinkClass v) noexcept {
  switch (v) {
    case LinkClass::None: return "none";
    case LinkClass::Local: return "local";
    case LinkClass::NVLink: return "nvlink";
    case LinkClass::Network: return "network";
  }
  return "?";
}

const char* toString(BufferKind v) noexcept {
  switch (v) {
    case BufferKind::Input: return "input";
    case BufferKind::Output: return "output";
    case BufferKind::Scratch: return "scratch";
    case BufferKind::InOut: return "inout";
  }
  return "?";
}

std::optional<DType> parseDType(std::string_view s) noexcept { return lookup(kDTypeNames, s); }
std::optional<RedOp> parseRedOp(std::string_view s) noexcept { return lookup(kRedOpNames, s); }
std::optional<LaneRole> parseLaneRole(std::string_view s) noexcept { return lookup(kLaneRoleNames, s); }
std::optional<LinkClass> parseLinkClass(std::string_view s) noexcept { return lookup(kLinkClassNames, s); }
std::optional<BufferKind> parseBufferKind(std::string_view s) noexcept { return lookup(kBufferKindNames, s); }

namespace {
[[noreturn]] void throwUnknown(std::string_view what, std::string_view s, const char* expected) {
  throw Error(ErrorCode::InvalidArgument,
              "unknown " + std::string(what) + " '" + std::string(s) + "' (expected " + expected + ")");
}
}  // namespace

DType requireDType(std::string_view s, std::string_view what) {
  if (const auto v = parseDType(s)) return *v;
  throwUnknown(what, s, "float32, bfloat16, float16");
}

RedOp requireRedOp(std::string_view s, std::string_view what) {
  if (const auto v = parseRedOp(s)) return *v;
  throwUnknown(what, s, "sum, max, min");
}

}  // namespace mk
