// mkernel — parseJson and the field getters (mk/io/json.hpp).
#include "mk/io/json.hpp"

#include <cmath>
#include <cstdio>
#include <cstdlib>

#include "mk/error.hpp"
#include "mk/util/format.hpp"

namespace mk {

namespace {

/// The byte offset where the nesting first exceeds `maxDepth`, or npos. A linear scan that skips strings: the
/// text need not be valid JSON (nlohmann judges that afterwards), it only must not be deep.
std::size_t tooDeepAt(const std::string& text, unsigned maxDepth) {
  unsigned depth = 0;
  bool inString = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (inString) {
      if (c == '\\')
        ++i;
      else if (c == '"')
        inString = false;
      continue;
    }
    if (c == '"') {
      inString = true;
    } else if (c == '[' || c == '{') {
      if (++depth > maxDepth) return i;
    } else if ((c == ']' || c == '}') && depth > 0) {
      --depth;
    }
  }
  return std::string::npos;
}

/// The shortest of %.15g..%.17g that reads back as `x`: -0.7, not -0.69999999999999996.
std::string formatDouble(double x) {
  std::string s;
  for (int precision = 15; precision <= 17; ++precision) {
    s = strprintf("%.*g", precision, x);
    if (std::strtod(s.c_str(), nullptr) == x) break;
  }
  return s;
}

}  // namespace

nlohmann::json parseJson(const std::string& text, const std::string& what, std::size_t maxBytes) {
  if (text.size() > maxBytes)
    throw Error(ErrorCode::ParseError, what + ": " + std::to_string(text.size()) + " bytes exceeds the limit of " +
                                           std::to_string(maxBytes) + " bytes for this kind of file");
  // nlohmann's lexer takes a NUL byte for the end of the input: "{...}\0garbage" would parse as "{...}" and the
  // rest be silently dropped. A NUL is never valid JSON (not even inside a string), so any one is refused.
  if (const std::size_t nul = text.find('\0'); nul != std::string::npos)
    throw Error(ErrorCode::ParseError, what + ": not valid JSON: a NUL byte at byte " + std::to_string(nul) +
                                           " (a JSON file is text; is this a binary or a damaged file?)");
  if (const std::size_t at = tooDeepAt(text, kMaxJsonDepth); at != std::string::npos)
    throw Error(ErrorCode::ParseError, what + ": arrays and objects nest deeper than " + std::to_string(kMaxJsonDepth) +
                                           " levels (at byte " + std::to_string(at) + ")");
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    // e.what() carries nlohmann's byte position, what a user needs to find the fault; it quotes at most a few
    // bytes of the text around it.
    throw Error(ErrorCode::ParseError,
                what + ": not valid JSON (malformed or truncated): " + excerpt(e.what(), 4 * kExcerptChars));
  }
}

bool schemaMatches(const std::string& got, const std::string& supported) {
  if (got.compare(0, supported.size(), supported) != 0) return false;
  if (got.size() == supported.size()) return true;
  // A minor version: ".<digits>", nothing after it.
  if (got[supported.size()] != '.' || got.size() == supported.size() + 1) return false;
  for (std::size_t i = supported.size() + 1; i < got.size(); ++i)
    if (got[i] < '0' || got[i] > '9') return false;
  return true;
}

std::string excerpt(const std::string& s, std::size_t maxChars) {
  if (s.size() <= maxChars) return s;
  return s.substr(0, maxChars) + "...";
}

std::string describeJson(const nlohmann::json& v) {
  using T = nlohmann::json::value_t;
  switch (v.type()) {
    case T::null: return "null";
    case T::boolean: return v.get<bool>() ? "true" : "false";
    case T::number_unsigned: return "number " + std::to_string(v.get<uint64_t>());
    case T::number_integer: return "number " + std::to_string(v.get<int64_t>());
    case T::number_float: {
      const double x = v.get<double>();
      return std::isfinite(x) ? "number " + formatDouble(x) : "a number beyond double's range";
    }
    case T::string: return "string \"" + excerpt(v.get_ref<const std::string&>()) + "\"";
    case T::array: return "array of " + std::to_string(v.size()) + " elements";
    case T::object: return "object with " + std::to_string(v.size()) + " members";
    case T::binary:
    case T::discarded: break;
  }
  return v.type_name();
}

void failField(const std::string& field, const std::string& rule, const nlohmann::json& v) {
  throw Error(ErrorCode::ParseError, field + " " + rule + " (got " + describeJson(v) + ")");
}

namespace json_get {

void failUnsigned(const std::string& field, const nlohmann::json& v, uint64_t min, uint64_t max) {
  std::string rule = "must be a whole number";
  if (min > 0 || max != std::numeric_limits<uint64_t>::max())
    rule += " in [" + std::to_string(min) + ", " + std::to_string(max) + "]";
  else
    rule += " >= 0 that fits 64 bits";
  failField(field, rule, v);
}

void failNumber(const std::string& field, const nlohmann::json& v, double min, double max, bool minOpen) {
  failField(field,
            "must be a finite number in " + std::string(minOpen ? "(" : "[") + formatDouble(min) + ", " +
                formatDouble(max) + "]",
            v);
}

void failString(const std::string& field, const nlohmann::json& v, std::size_t maxLen) {
  if (v.is_string()) failField(field, "must be a string of at most " + std::to_string(maxLen) + " bytes", v);
  failField(field, "must be a string", v);
}

void failBool(const std::string& field, const nlohmann::json& v) { failField(field, "must be true or false", v); }

}  // namespace json_get

}  // namespace mk
