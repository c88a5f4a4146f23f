// mkernel — JSON field reading with full paths in the errors (json_fields.hpp).
#include "json_fields.hpp"

#include <cmath>
#include <limits>
#include <utility>

#include "mk/error.hpp"

namespace mk::detail {

JsonFields::JsonFields(const Json& obj, std::string doc, std::string path)
    : obj_(obj), doc_(std::move(doc)), path_(std::move(path)) {
  if (!obj_.is_object())
    fail((path_.empty() ? std::string("the document") : path_) + " must be an object (got " + obj_.type_name() + ")");
}

std::string JsonFields::name(const char* key) const { return path_.empty() ? std::string(key) : path_ + "." + key; }

void JsonFields::fail(const std::string& what) const { throw Error(ErrorCode::ParseError, doc_ + ": " + what); }

void JsonFields::onlyKeys(std::initializer_list<const char*> keys) const {
  for (auto it = obj_.begin(); it != obj_.end(); ++it) {
    bool known = false;
    for (const char* k : keys) known = known || it.key() == k;
    if (known) continue;
    std::string list;
    for (const char* k : keys) list += (list.empty() ? "" : ", ") + std::string(k);
    fail("unknown field " + name(it.key().c_str()) + " (expected one of: " + list + ")");
  }
}

const JsonFields::Json& JsonFields::value(const char* key) const {
  auto it = obj_.find(key);
  if (it == obj_.end()) fail("missing field " + name(key));
  return *it;
}

JsonFields JsonFields::object(const char* key) const { return JsonFields(value(key), doc_, name(key)); }

std::string JsonFields::text(const char* key) const {
  const Json& j = value(key);
  if (!j.is_string()) fail(name(key) + " must be a string (got " + j.type_name() + ")");
  return j.get<std::string>();
}

bool JsonFields::boolean(const char* key) const {
  const Json& j = value(key);
  if (!j.is_boolean()) fail(name(key) + " must be true or false (got " + j.type_name() + ")");
  return j.get<bool>();
}

uint64_t JsonFields::count64(const char* key) const {
  const Json& j = value(key);
  if (!j.is_number_integer() || (!j.is_number_unsigned() && j.get<int64_t>() < 0))
    fail(name(key) + " must be a non-negative integer (got " + (j.is_number() ? j.dump() : j.type_name()) + ")");
  return j.get<uint64_t>();
}

uint32_t JsonFields::count32(const char* key) const {
  const uint64_t v = count64(key);
  if (v > std::numeric_limits<uint32_t>::max()) fail(name(key) + " is too large (got " + value(key).dump() + ")");
  return static_cast<uint32_t>(v);
}

double JsonFields::number(const char* key) const {
  const Json& j = value(key);
  if (!j.is_number()) fail(name(key) + " must be a number (got " + j.type_name() + ")");
  const double v = j.get<double>();
  if (!std::isfinite(v)) fail(name(key) + " must be finite (got " + j.dump() + ")");
  return v;
}

}  // namespace mk::detail
