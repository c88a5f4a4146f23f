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

// Aliases only: the canonical names are the tables' (element.hpp).
constexpr std::array<std::pair<std::string_view, DType>, 11> kDTypeAliases{{
    {"fp32", DType::Float32},
    {"f32", DType::Float32},
    {"bf16", DType::BFloat16},
    {"fp16", DType::Float16},
    {"f16", DType::Float16},
    {"half", DType::Float16},
    {"fp8_e4m3", DType::Float8E4M3},
    {"e4m3", DType::Float8E4M3},
    {"fp8_e5m2", DType::Float8E5M2},
    {"e5m2", DType::Float8E5M2},
    {"i32", DType::Int32},
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
const char* toString(DType v) noexcept { return isDType(static_cast<uint8_t>(v)) ? dtypeInfo(v).name : "?"; }

const char* toString(RedOp v) noexcept { return isRedOp(static_cast<uint8_t>(v)) ? redOpInfo(v).name : "?"; }

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

std::optional<DType> parseDType(std::string_view s) noexcept {
  for (const DTypeInfo& t : kDTypes)
    if (s == t.name) return t.type;
  return lookup(kDTypeAliases, s);
}

std::optional<RedOp> parseRedOp(std::string_view s) noexcept {
  for (const RedOpInfo& r : kRedOps)
    if (s == r.name) return r.op;
  return std::nullopt;
}
std::optional<LaneRole> parseLaneRole(std::string_view s) noexcept { return lookup(kLaneRoleNames, s); }
std::optional<LinkClass> parseLinkClass(std::string_view s) noexcept { return lookup(kLinkClassNames, s); }
std::optional<BufferKind> parseBufferKind(std::string_view s) noexcept { return lookup(kBufferKindNames, s); }

namespace {
[[noreturn]] void throwUnknown(std::string_view what, std::string_view s, const char* expected) {
  throw Error(ErrorCode::InvalidArgument,
              "unknown " + std::string(what) + " '" + std::string(s) + "' (expected " + expected + ")");
}

/// The names of the element types with `integer` as given ("float32, bfloat16, ..." for the data types).
std::string dtypeNamesWhere(bool integer) {
  std::string out;
  for (const DTypeInfo& t : kDTypes)
    if (t.integer == integer) out += (out.empty() ? "" : ", ") + std::string(t.name);
  return out;
}
}  // namespace

const char* dtypeNames() noexcept {
  static const std::string names = dtypeNamesWhere(false) + ", " + dtypeNamesWhere(true);
  return names.c_str();
}

const char* collectiveRedOpNames() noexcept {
  static const std::string names = [] {
    std::string out;
    for (const RedOpInfo& r : kRedOps)
      if (r.collective) out += (out.empty() ? "" : ", ") + std::string(r.name);
    return out;
  }();
  return names.c_str();
}

DType requireDType(std::string_view s, std::string_view what) {
  static const std::string dataNames = dtypeNamesWhere(false);
  const auto v = parseDType(s);
  if (v && !dtypeInfo(*v).integer) return *v;
  if (v)
    throw Error(ErrorCode::InvalidArgument, std::string(what) + " '" + std::string(s) +
                                                "' is an integer type, for routing data in schedule buffers (expert "
                                                "ids, counts); an operation's elements are " +
                                                dataNames);
  throwUnknown(what, s, dataNames.c_str());
}

RedOp requireRedOp(std::string_view s, std::string_view what) {
  if (const auto v = parseRedOp(s); v && redOpInfo(*v).collective) return *v;
  throwUnknown(what, s, collectiveRedOpNames());
}

}  // namespace mk
