// The measurement-file contract (mk/io/measurement.hpp): what it accepts, keeps and refuses.
#include <doctest/doctest.h>

#include <string>

#include "mk/error.hpp"
#include "mk/io/measurement.hpp"

namespace {

const char* const kGood = R"({
 "schema": "mkernel.measurement.v1",
 "system": {"gpu": "NVIDIA H200", "gpus": 2, "link": "NV18", "driver": "580.159.04", "cuda": "13.0", "nccl": "2.28.9"},
 "run": {"date": "2026-12-01", "commit": "0123abcd", "command": "mk-bench allreduce -b 8 -e 8"},
 "records": [
  {"op": "allreduce", "impl": "mkernel", "algo": "one-shot", "dtype": "float32", "ranks": 2, "bytes": 8,
   "time_us": 2.4, "algbw_gbs": 0.0033, "busbw_gbs": 0.0033, "iters": 1000, "stat": "median"},
  {"op": "gemm", "impl": "cublas", "dtype": "bfloat16", "ranks": 1, "bytes": 0, "time_us": 123.5,
   "iters": 50, "stat": "median", "m": 4096, "n": 4096, "k": 2048, "sms": 132, "tflops": 556.4}
 ]})";

std::string replaced(std::string text, const std::string& from, const std::string& to) {
  const auto at = text.find(from);
  REQUIRE(at != std::string::npos);
  return text.replace(at, from.size(), to);
}

void requireParseError(const std::string& text, const std::string& needle) {
  try {
    mk::parseMeasurementFile(text, "f.json");
    FAIL("accepted a file that breaks the contract; expected an error mentioning " << needle);
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::ParseError);
    CHECK_MESSAGE(std::string(e.what()).find(needle) != std::string::npos, e.what());
  }
}

}  // namespace

TEST_CASE("measurement: a file in the mkernel.measurement.v1 format parses with every value intact") {
  const auto f = mk::parseMeasurementFile(kGood, "f.json");
  CHECK(f.schema == "mkernel.measurement.v1");
  CHECK(f.commit == "0123abcd");
  REQUIRE(f.records.size() == 2);
  CHECK(f.records[0].timeUs == 2.4);
  CHECK(f.records[0].algo == "one-shot");
  CHECK(f.records[1].algo.empty());
  CHECK(f.records[1].extra.at("m") == "4096");
  CHECK(f.records[1].extra.at("tflops") == "556.4");
  CHECK(f.system.at("gpu") == "\"NVIDIA H200\"");
}

TEST_CASE("measurement: write then read gives back the same numbers and extra fields") {
  const auto f = mk::parseMeasurementFile(kGood, "f.json");
  const auto g = mk::parseMeasurementFile(mk::measurementFileToJson(f), "g.json");
  REQUIRE(g.records.size() == f.records.size());
  for (size_t i = 0; i < f.records.size(); ++i) {
    CHECK(g.records[i].timeUs == f.records[i].timeUs);
    CHECK(g.records[i].bytes == f.records[i].bytes);
    CHECK(g.records[i].extra == f.records[i].extra);
  }
  CHECK(g.system == f.system);
}

TEST_CASE("measurement: missing run commit is rejected with its path") {
  requireParseError(replaced(kGood, R"("commit": "0123abcd", )", ""), "f.json.run.commit");
}

TEST_CASE("measurement: a wrong schema is rejected") {
  requireParseError(replaced(kGood, "mkernel.measurement.v1", "nccl-tests"), "f.json.schema");
}

TEST_CASE("measurement: the schema is checked by name and major version, not by prefix") {
  for (const char* bad : {"mkernel.measurement.v10", "mkernel.measurement.v1xyz", "mkernel.measurement.v2",
                          "mkernel.measurement.v1.", "mkernel.measurement.v1.2x", "mkernel.measurement."}) {
    CAPTURE(bad);
    requireParseError(replaced(kGood, "mkernel.measurement.v1", bad), "f.json.schema: must be");
  }
  // A minor version of the supported major is read: it only adds what this reader keeps as extra fields.
  CHECK(mk::parseMeasurementFile(replaced(kGood, "mkernel.measurement.v1", "mkernel.measurement.v1.3"), "f.json")
            .records.size() == 2);
}

TEST_CASE("measurement: a negative time is rejected naming the record") {
  requireParseError(replaced(kGood, R"("time_us": 2.4)", R"("time_us": -2.4)"), "records[0].time_us");
}

TEST_CASE("measurement: zero ranks is rejected") {
  requireParseError(replaced(kGood, R"("ranks": 2)", R"("ranks": 0)"), "records[0].ranks");
}

TEST_CASE("measurement: a string where a number belongs is rejected") {
  requireParseError(replaced(kGood, R"("iters": 1000)", R"("iters": "many")"), "records[0].iters");
}

TEST_CASE("measurement: empty records and truncated JSON are rejected") {
  requireParseError(R"({"schema": "mkernel.measurement.v1", "system": {"gpu": "x", "gpus": 1},
    "run": {"date": "d", "commit": "c", "command": "x"}, "records": []})",
                    "records");
  requireParseError(std::string(kGood).substr(0, 200), "not valid JSON");
}

TEST_CASE("measurement: a missing file is an io error naming the path") {
  try {
    mk::loadMeasurementFile("/nonexistent/dir/x.json");
    FAIL("no error");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::IoError);
    CHECK(std::string(e.what()).find("/nonexistent/dir/x.json") != std::string::npos);
  }
}

TEST_CASE("measurement: counts are checked at the field, never wrapped") {
  requireParseError(replaced(kGood, R"("ranks": 2,)", R"("ranks": 4294967298,)"),
                    "f.json.records[0].ranks must be a whole number in [1, 4294967295] (got number 4294967298)");
  requireParseError(replaced(kGood, R"("ranks": 2,)", R"("ranks": 2, "chunks": 10000000,)"),
                    "f.json.records[0].chunks must be a whole number in [1, 4096] (got number 10000000)");
  requireParseError(replaced(kGood, R"("bytes": 8,)", R"("bytes": 4611686018427387904,)"),
                    "f.json.records[0].bytes must be a whole number in [0, 1125899906842624]");
  requireParseError(replaced(kGood, R"("time_us": 2.4,)", R"("time_us": 1e300,)"),
                    "f.json.records[0].time_us must be a finite number in (0, 3600000000]");
}

TEST_CASE("measurement: fused-op records carry their shape, SMs and the split that ran") {
  const std::string fused = replaced(kGood, R"({"op": "allreduce", "impl": "mkernel", "algo": "one-shot")",
                                     R"({"op": "gemm-rs", "impl": "mkernel", "algo": "fused own-last", "m": 4096,
                                         "n": 4096, "k": 2048, "sms": 126, "tile_rows": 1024, "compute_ctas": 46,
                                         "comm_ctas": 17)");
  const auto f = mk::parseMeasurementFile(fused, "f.json");
  CHECK(f.records[0].extra.at("comm_ctas") == "17");
  requireParseError(replaced(fused, R"("sms": 126, )", ""), "records[0].sms: missing");
  requireParseError(replaced(fused, R"("m": 4096)", R"("m": 0)"),
                    "records[0].m must be a whole number in [1, 4294967295] (got number 0)");
  requireParseError(replaced(fused, R"("compute_ctas": 46)", R"("compute_ctas": "46")"),
                    "records[0].compute_ctas must be a whole number in [1, 4294967295] (got string \"46\")");
  // A baseline record of the same op needs the shape and SMs, not a split.
  const std::string base = replaced(fused, R"("impl": "mkernel")", R"("impl": "cublas+mkernel")");
  CHECK_NOTHROW(mk::parseMeasurementFile(replaced(base, R"("tile_rows": 1024, )", ""), "f.json"));
}
