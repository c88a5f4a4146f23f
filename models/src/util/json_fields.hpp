// mkernel — reading the fields of a JSON configuration object with the full path of every field in the errors
// ("workload: layout.tp must be a whole number ... (got number -1)"). Private to models/: the workload reader;
// the checks themselves are mk/io/json.hpp's getters, shared by every reader.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <nlohmann/json.hpp>
#include <string>

namespace mk::detail {

/// One JSON object being read: the document kind for messages ("workload"), and the path of the object
/// ("" for the root, "layout" for a section).
class JsonFields {
 public:
  using Json = nlohmann::json;

  /// Throws Error(ParseError) "<doc>: <path> must be an object (got <type>)" unless `obj` is an object.
  JsonFields(const Json& obj, std::string doc, std::string path = {});

  /// "layout.tp": the full name of field `key` of this object.
  std::string name(const char* key) const;
  /// Whether the object has `key`.
  bool has(const char* key) const { return obj_.contains(key); }
  /// A misspelt key must not silently leave a default in place: Error(ParseError) naming the unknown field
  /// and the expected ones.
  void onlyKeys(std::initializer_list<const char*> keys) const;

  /// The sub-object `key` (required).
  JsonFields object(const char* key) const;
  /// Required fields, checked for type: Error(ParseError) "<doc>: missing field <name>" or "<name> must be ...".
  std::string text(const char* key) const;
  bool boolean(const char* key) const;
  /// A non-negative integer that fits 32 (64) bits.
  uint32_t count32(const char* key) const;
  uint64_t count64(const char* key) const;
  /// A finite number.
  double number(const char* key) const;

  /// The raw value of `key` (required).
  const Json& value(const char* key) const;

  /// Error(ParseError) "<doc>: <what>".
  [[noreturn]] void fail(const std::string& what) const;

 private:
  const Json& obj_;
  std::string doc_;
  std::string path_;
};

}  // namespace mk::detail
