// mkernel — internal: the JSON helpers of the schedule reader (io_read.cpp): a lazily formatted JSON path, typed
// field getters, "unknown field" checks. Every error is Error(ParseError) starting with the field's path.
#pragma once

#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/util/format.hpp"

namespace mk::io_read {

using nlohmann::json;

/// Longest name (buffer, op, algorithm) a schedule may carry.
inline constexpr std::size_t kMaxNameBytes = 256;

/// A JSON path kept as a chain of stack frames; formatted only when an error is thrown.
struct Path {
  const Path* parent = nullptr;
  const char* key = nullptr;  ///< member name, or nullptr for an array index
  std::size_t index = 0;

  Path operator[](const char* k) const { return Path{this, k, 0}; }
  Path operator[](std::size_t i) const { return Path{this, nullptr, i}; }

  std::string str() const {
    if (parent == nullptr) return "(top level)";
    std::string prefix = parent->parent == nullptr ? std::string() : parent->str();
    if (key != nullptr) return prefix.empty() ? std::string(key) : prefix + "." + key;
    return prefix + "[" + std::to_string(index) + "]";
  }
};

[[noreturn]] inline void fail(const Path& p, const std::string& msg) {
  throw Error(ErrorCode::ParseError, p.str() + ": " + msg);
}

inline const json& member(const json& obj, const char* key, const Path& p) {
  auto it = obj.find(key);
  if (it == obj.end()) fail(p[key], "required field is missing");
  return *it;
}

inline const json* optionalMember(const json& obj, const char* key) {
  auto it = obj.find(key);
  return it == obj.end() ? nullptr : &*it;
}

inline void expectObject(const json& v, const Path& p) {
  if (!v.is_object()) fail(p, "expected an object, got " + describeJson(v));
}
inline void expectArray(const json& v, const Path& p) {
  if (!v.is_array()) fail(p, "expected an array, got " + describeJson(v));
}

/// Element counts and offsets: at most kMaxElements, so that bytes (count x element size) and offset + count
/// never overflow and stay exact in a double (the cost model's unit).
inline uint64_t asU64(const json& v, const Path& p, uint64_t max = kMaxElements) {
  return json_get::unsignedInt(v, p, max);
}
inline uint32_t asU32(const json& v, const Path& p) { return json_get::u32(v, p); }
/// Names (buffers, ops, algorithms) are identifiers, not documents.
inline const std::string& asString(const json& v, const Path& p) { return json_get::text(v, p, kMaxNameBytes); }
inline bool asBool(const json& v, const Path& p) { return json_get::boolean(v, p); }

/// "a, b, c" from a name table, for "expected one of" messages.
template <typename E>
std::string namesOf(std::initializer_list<E> values) {
  std::string out;
  for (E v : values) {
    if (!out.empty()) out += ", ";
    out += toString(v);
  }
  return out;
}

template <typename E, typename Parser>
E asEnum(const json& v, const Path& p, Parser parse, const char* what, const std::string& expected) {
  const std::string& s = asString(v, p);
  auto e = parse(s);
  if (!e) fail(p, std::string("unknown ") + what + " '" + excerpt(s) + "' (expected one of " + expected + ")");
  return *e;
}

/// Rejects members not in `allowed`; keys starting with '_' are annotations and always ignored.
inline void checkKeys(const json& obj, const Path& p, std::initializer_list<const char*> allowed,
                      std::initializer_list<const char*> ignored = {}) {
  for (auto it = obj.begin(); it != obj.end(); ++it) {
    const std::string& k = it.key();
    if (!k.empty() && k[0] == '_') continue;
    bool ok = false;
    for (const char* a : allowed) ok = ok || k == a;
    for (const char* a : ignored) ok = ok || k == a;
    if (ok) continue;
    std::string list;
    for (const char* a : allowed) list += list.empty() ? std::string(a) : std::string(", ") + a;
    fail(p, "unknown field '" + excerpt(k) + "' (expected " + list + ")");
  }
}

}  // namespace mk::io_read
