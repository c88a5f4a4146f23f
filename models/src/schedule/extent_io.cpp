// mkernel — runtime extent values from JSON ("mkernel.extents.v1"): a routing given to the simulator or a tool.
#include <nlohmann/json.hpp>
#include <string>

#include "mk/error.hpp"
#include "mk/io/json.hpp"
#include "mk/schedule/io.hpp"

namespace mk {
namespace {

constexpr const char* kExtentsSchema = "mkernel.extents.v1";

[[noreturn]] void bad(const std::string& what, const std::string& msg) {
  throw Error(ErrorCode::ParseError, what + ": " + msg);
}

}  // namespace

ExtentValues extentValuesFromJson(const Schedule& s, const std::string& text, const std::string& what) {
  const nlohmann::json root = parseJson(text, what);
  if (!root.is_object()) bad(what, "expected an object {\"schema\": \"" + std::string(kExtentsSchema) + "\", ...}");
  for (auto it = root.begin(); it != root.end(); ++it)
    if (it.key() != "schema" && it.key() != "values" && it.key().rfind('_', 0) != 0)
      bad(what, "unknown field '" + it.key() + "' (expected schema, values)");
  const auto schema = root.find("schema");
  if (schema == root.end() || !schema->is_string() || schema->get<std::string>() != kExtentsSchema)
    bad(what, "schema must be \"" + std::string(kExtentsSchema) + "\"");
  const auto values = root.find("values");
  if (values == root.end() || !values->is_object())
    bad(what, "values must be an object: extent name -> one value for every rank, or one per rank");
  ExtentValues out(s.nRanks, std::vector<uint64_t>(s.extents.size(), 0));
  std::vector<char> given(s.extents.size(), 0);
  for (auto it = values->begin(); it != values->end(); ++it) {
    const int e = extentIndex(s, it.key());
    const std::string field = "values." + it.key();
    if (e < 0) bad(what, field + ": the schedule declares no extent '" + it.key() + "'");
    const uint64_t bound = s.extents[e].bound;
    if (it->is_array()) {
      if (it->size() != s.nRanks)
        bad(what, field + " has " + std::to_string(it->size()) + " values, expected one per rank (" +
                      std::to_string(s.nRanks) + ")");
      for (uint32_t r = 0; r < s.nRanks; ++r)
        out[r][e] = json_get::unsignedInt((*it)[r], what + ": " + field + "[" + std::to_string(r) + "]", bound);
    } else {
      const uint64_t v = json_get::unsignedInt(*it, what + ": " + field, bound);
      for (uint32_t r = 0; r < s.nRanks; ++r) out[r][e] = v;
    }
    given[e] = 1;
  }
  for (std::size_t e = 0; e < s.extents.size(); ++e)
    if (!given[e]) bad(what, "values has no entry for extent '" + s.extents[e].name + "' (every extent needs one)");
  return out;
}

ExtentValues loadExtentValues(const Schedule& s, const std::string& path) {
  return extentValuesFromJson(s, readFile(path), path);
}

}  // namespace mk
