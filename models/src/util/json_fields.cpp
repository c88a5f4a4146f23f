// mkernel — JSON field reading with full paths in the errors (json_fields.hpp).
#include "json_fields.hpp"

#include <limits>
#include <utility>

#include "mk/error.hpp"
#include "mk/io/json.hpp"

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

// The checks are mk/io/json.hpp's getters; only the document prefix is added here.
std::string JsonFields::text(const char* key) const { return json_get::text(value(key), doc_ + ": " + name(key)); }

bool JsonFields::boolean(const char* key) const { return json_get::boolean(value(key), doc_ + ": " + name(key)); }

uint64_t JsonFields::count64(const char* key) const {
  return json_get::unsignedInt(value(key), doc_ + ": " + name(key));
}

uint32_t JsonFields::count32(const char* key) const { return json_get::u32(value(key), doc_ + ": " + name(key)); }

double JsonFields::number(const char* key) const {
  return json_get::number(value(key), doc_ + ": " + name(key), -std::numeric_limits<double>::max(),
                          std::numeric_limits<double>::max());
}

}  // namespace mk::detail
