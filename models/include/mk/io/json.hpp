// mkernel — the one way a reader turns text into JSON, and the typed getters every reader checks fields with.
//
// Every file mkernel reads may be hostile (a truncated download, a fuzzer, a typo): parseJson bounds the size
// and the nesting depth before nlohmann sees the text, and turns every nlohmann failure into Error(ParseError)
// naming the document. The getters check a value at the field — type, range, finiteness, integer width — and
// report "<field> must be <rule> (got <excerpt>)", where the excerpt is bounded: a message never carries a whole value.
// Needs nlohmann_json (every reader links it).
#pragma once

#include <cstddef>
#include <cstdint>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

#include "mk/io/limits.hpp"

namespace mk {

/// Parse `text` as one JSON document called `what` in messages (a path, or "profile"). Throws
/// Error(ParseError) "<what>: ..." when the text is longer than `maxBytes`, nests deeper than kMaxJsonDepth, or
/// is not JSON (nlohmann's position included). Numbers beyond double's range parse as infinities: the getters
/// reject them at the field.
nlohmann::json parseJson(const std::string& text, const std::string& what, std::size_t maxBytes = kMaxJsonBytes);

/// Whether a document's "schema" string `got` is the `supported` one ("mkernel.measurement.v1"): exactly it, or it
/// with a minor version ("mkernel.measurement.v1.2"). Name and major version must match whole: a prefix check once
/// took "mkernel.measurement.v10" and "mkernel.measurement.v1xyz" for v1.
bool schemaMatches(const std::string& got, const std::string& supported);

/// `s` cut to `maxChars` characters ("..." appended when cut).
std::string excerpt(const std::string& s, std::size_t maxChars = kExcerptChars);
/// A bounded description of a value for messages: `number 1e+400`, `string "abc..."`, `array of 3 elements`,
/// `object with 2 members` (containers are never dumped: a deep or huge value costs nothing to describe).
std::string describeJson(const nlohmann::json& v);

/// Error(ParseError) "<field> <rule> (got <describeJson(v)>)"; rules read "must be ...".
[[noreturn]] void failField(const std::string& field, const std::string& rule, const nlohmann::json& v);

namespace json_get {

/// The name of a field for a message: a string as is, or any path type with `str()` (formatted only on error).
inline const std::string& nameOf(const std::string& s) { return s; }
inline std::string nameOf(const char* s) { return s; }
template <typename Path>
std::string nameOf(const Path& p) {
  return p.str();
}

[[noreturn]] void failUnsigned(const std::string& field, const nlohmann::json& v, uint64_t min, uint64_t max);
[[noreturn]] void failNumber(const std::string& field, const nlohmann::json& v, double min, double max, bool minOpen);
[[noreturn]] void failString(const std::string& field, const nlohmann::json& v, std::size_t maxLen);
[[noreturn]] void failBool(const std::string& field, const nlohmann::json& v);

/// A whole number in [min, max] written as an integer literal (3.0, -1, "3" and 2^64 are refused).
template <typename Name>
uint64_t unsignedInt(const nlohmann::json& v, const Name& field, uint64_t max = std::numeric_limits<uint64_t>::max(),
                     uint64_t min = 0) {
  if (v.is_number_unsigned()) {
    const uint64_t x = v.get<uint64_t>();
    if (x >= min && x <= max) return x;
  }
  failUnsigned(nameOf(field), v, min, max);
}

/// unsignedInt that fits 32 bits (4294967298 is refused, never wrapped to 2).
template <typename Name>
uint32_t u32(const nlohmann::json& v, const Name& field, uint32_t max = std::numeric_limits<uint32_t>::max(),
             uint32_t min = 0) {
  return static_cast<uint32_t>(unsignedInt(v, field, max, min));
}

/// A finite number in [min, max] (or (min, max] with `minOpen`): 1e400 (read as inf), NaN and strings are
/// refused. Integer literals are accepted.
template <typename Name>
double number(const nlohmann::json& v, const Name& field, double min, double max, bool minOpen = false) {
  if (v.is_number()) {
    const double x = v.get<double>();
    if (x == x && x <= max && (minOpen ? x > min : x >= min) && x != std::numeric_limits<double>::infinity() &&
        x != -std::numeric_limits<double>::infinity())
      return x;
  }
  failNumber(nameOf(field), v, min, max, minOpen);
}

/// A string of at most `maxLen` bytes.
template <typename Name>
const std::string& text(const nlohmann::json& v, const Name& field, std::size_t maxLen = 4096) {
  if (v.is_string() && v.get_ref<const std::string&>().size() <= maxLen) return v.get_ref<const std::string&>();
  failString(nameOf(field), v, maxLen);
}

/// true or false.
template <typename Name>
bool boolean(const nlohmann::json& v, const Name& field) {
  if (v.is_boolean()) return v.get<bool>();
  failBool(nameOf(field), v);
}

}  // namespace json_get

}  // namespace mk
