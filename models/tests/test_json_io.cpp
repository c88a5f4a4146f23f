// The one JSON entry point and the field getters (mk/io/json.hpp), and what every reader does with hostile text:
// nesting that once crashed four tools, numbers that once wrapped or reached the simulator as inf.
#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "expect_error.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/io/json.hpp"
#include "mk/io/measurement.hpp"
#include "mk/schedule/io.hpp"
#include "mk/topology/topology.hpp"
#include "mk/workload/workload.hpp"

using namespace mk;
using mk::test::expectError;

namespace {

std::string nested(std::size_t levels, char open, char close) {
  return std::string(levels, open) + std::string(levels, close);
}

}  // namespace

TEST_CASE("json io: 100,000 nested levels are a parse error in every reader, not a crash") {
  // nlohmann parses this depth, but dump() and copies recurse and overflow the stack: the readers once dumped
  // such a value into their error message.
  const std::string deep = nested(100000, '[', ']');
  const std::vector<std::pair<const char*, std::function<void()>>> readers = {
      {"schedule", [&] { scheduleFromJson(deep); }},
      {"topology", [&] { topologyFromJson(deep); }},
      {"profile", [&] { profileFromJson(deep); }},
      {"workload", [&] { workloadFromJson(deep); }},
      {"measurement", [&] { parseMeasurementFile(deep, "m.json"); }},
  };
  for (const auto& [name, read] : readers) {
    CAPTURE(name);
    expectError(read, ErrorCode::ParseError, {"nest deeper than 256 levels"});
  }
}

TEST_CASE("json io: a NUL byte is refused with its offset in every reader, never the end of the text") {
  // nlohmann stops at a NUL: "{...}\0garbage" once parsed as "{...}" and the garbage was never looked at.
  expectError([] { parseJson(std::string("{\"a\": 1}\0xyz", 11), "x.json"); }, ErrorCode::ParseError,
              {"x.json: not valid JSON: a NUL byte at byte 8"});
  const std::string doc = std::string("{}\0garbage", 10);
  const std::vector<std::pair<const char*, std::function<void()>>> readers = {
      {"schedule", [&] { scheduleFromJson(doc); }},
      {"topology", [&] { topologyFromJson(doc); }},
      {"profile", [&] { profileFromJson(doc); }},
      {"workload", [&] { workloadFromJson(doc); }},
      {"measurement", [&] { parseMeasurementFile(doc, "m.json"); }},
  };
  for (const auto& [name, read] : readers) {
    CAPTURE(name);
    expectError(read, ErrorCode::ParseError, {"a NUL byte at byte 2"});
  }
}

TEST_CASE("json io: a schema string matches by whole name and major version, a minor version allowed") {
  CHECK(schemaMatches("mkernel.profile.v1", "mkernel.profile.v1"));
  CHECK(schemaMatches("mkernel.profile.v1.0", "mkernel.profile.v1"));
  CHECK(schemaMatches("mkernel.profile.v1.12", "mkernel.profile.v1"));
  for (const char* bad :
       {"mkernel.profile.v10", "mkernel.profile.v1xyz", "mkernel.profile.v1.", "mkernel.profile.v1.a",
        "mkernel.profile.v1.2.3", "mkernel.profile.v", "mkernel.profile", "", "mkernel.topology.v1"}) {
    CAPTURE(bad);
    CHECK_FALSE(schemaMatches(bad, "mkernel.profile.v1"));
  }
  // Every reader uses it: a prefix of the right name with another major is refused at "schema".
  expectError([] { profileFromJson(R"({"schema": "mkernel.profile.v10"})"); }, ErrorCode::ParseError, {"schema"});
  expectError([] { topologyFromJson(R"({"schema": "mkernel.topology.v1x", "name": "t"})"); }, ErrorCode::ParseError,
              {"schema"});
}

TEST_CASE("json io: the depth bound counts brackets, not brackets inside strings") {
  CHECK(parseJson(R"({"a": "[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[["})", "t")
            .is_object());
  CHECK(parseJson(nested(256, '[', ']'), "t").is_array());
  expectError([] { parseJson(nested(257, '[', ']'), "t.json"); }, ErrorCode::ParseError,
              {"t.json: arrays and objects nest deeper than 256 levels (at byte 256)"});
  // An escaped quote does not end a string: the brackets after it are still inside.
  CHECK(parseJson("[\"\\\"" + std::string(300, '[') + "\"]", "t").is_array());
}

TEST_CASE("json io: a document over the size bound is refused before parsing") {
  expectError([] { parseJson(std::string(100, ' ') + "1", "big.json", 64); }, ErrorCode::ParseError,
              {"big.json: 101 bytes exceeds the limit of 64 bytes"});
}

TEST_CASE("json io: not JSON, and numbers beyond double's range, are parse errors naming the document") {
  expectError([] { parseJson("{\"a\": 1e400}", "x.json"); }, ErrorCode::ParseError,
              {"x.json: not valid JSON", "1e400"});
  expectError([] { parseJson("{\"a\": ", "x.json"); }, ErrorCode::ParseError, {"x.json: not valid JSON"});
}

TEST_CASE("json io: getters check type, range and width at the field, with a bounded excerpt") {
  const nlohmann::json big = 4294967298u;
  expectError([&] { json_get::u32(big, std::string("ranks")); }, ErrorCode::ParseError,
              {"ranks must be a whole number in [0, 4294967295] (got number 4294967298)"});
  CHECK(json_get::unsignedInt(big, std::string("bytes")) == 4294967298u);
  expectError([] { json_get::unsignedInt(nlohmann::json(-1), std::string("n")); }, ErrorCode::ParseError,
              {"n must be a whole number >= 0 that fits 64 bits (got number -1)"});
  expectError([] { json_get::unsignedInt(nlohmann::json(3.0), std::string("n")); }, ErrorCode::ParseError,
              {"(got number 3)"});
  expectError([] { json_get::u32(nlohmann::json(0), std::string("n"), 10, 1); }, ErrorCode::ParseError,
              {"n must be a whole number in [1, 10]"});
  CHECK(json_get::number(nlohmann::json(2), std::string("x"), 0, 10) == 2.0);
  expectError([] { json_get::number(nlohmann::json(0.0), std::string("x"), 0, 10, true); }, ErrorCode::ParseError,
              {"x must be a finite number in (0, 10]"});
  expectError([] { json_get::number(nlohmann::json(1e308), std::string("x"), 0, 10); }, ErrorCode::ParseError,
              {"(got number 1e+308)"});
  expectError([] { json_get::number(nlohmann::json("fast"), std::string("x"), 0, 10); }, ErrorCode::ParseError,
              {"(got string \"fast\")"});
  const nlohmann::json longText = std::string(5000, 'x');
  try {
    json_get::text(longText, std::string("name"), 100);
    FAIL("a 5000-byte string passed a 100-byte bound");
  } catch (const Error& e) {
    CHECK(e.message().find("name must be a string of at most 100 bytes") != std::string::npos);
    CHECK(e.message().size() < 200);  // the value is cut, never printed whole
  }
  CHECK(describeJson(nlohmann::json::array({1, 2, 3})) == "array of 3 elements");
  CHECK(describeJson(nlohmann::json::object()) == "object with 0 members");
}

TEST_CASE("json io: readFile stops at its bound, so an endless input cannot exhaust memory") {
  expectError([] { readFile("/dev/zero", std::size_t{1} << 20); }, ErrorCode::ParseError,
              {"/dev/zero: longer than the limit of 1048576 bytes"});
}
