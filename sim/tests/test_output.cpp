// What the simulator writes: the prediction JSON and the Chrome / Perfetto trace.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <cmath>
#include <string>

#include "mk/sim/output.hpp"
#include "mk/sim/replay.hpp"
#include "sim_test_util.hpp"

using Json = nlohmann::json;
using simtest::Builder;

namespace {

mk::Schedule smallSchedule() {
  Builder b({0, 0, 1});
  b.put(0, 0, 1, 40000, 0);
  b.wait(1, 0, 0, 1);
  b.proxyPut(1, 1, 2, 80000);
  return b.done();
}

mk::sim::RunInfo info() {
  mk::sim::RunInfo i;
  i.op = "allreduce";
  i.algo = "ring";
  i.cluster = "test";
  i.dtype = "float32";
  i.profileSource = "test profile";
  i.nodes = 2;
  i.gpusPerNode = 2;
  i.ranks = 3;
  i.bytes = 1000000;
  i.count = 250000;
  i.busBwFactor = 4.0 / 3.0;
  i.closedFormUs = 12.5;
  return i;
}

}  // namespace

TEST_CASE("output: the trace has one complete event per step with rank lane step kind and bytes") {
  const mk::Schedule s = smallSchedule();
  const auto p = simtest::run(s, simtest::cluster(2, 2));
  const Json j = Json::parse(mk::sim::traceToJson(s, p.steps));
  REQUIRE(j.contains("traceEvents"));
  std::size_t complete = 0, names = 0;
  for (const Json& e : j["traceEvents"]) {
    if (e["ph"] == "M") {
      ++names;
      continue;
    }
    REQUIRE(e["ph"] == "X");
    const uint32_t rank = e["pid"], lane = e["args"]["lane"], step = e["args"]["step"];
    CHECK(e["tid"].get<uint32_t>() == lane + 1);  // tid 0 is "no thread" to Perfetto
    const mk::Step& st = s.lanes[rank][lane].steps[step];
    CHECK(e["name"] == mk::toString(st.kind));
    CHECK(e["args"]["kind"] == mk::toString(st.kind));
    CHECK(e["cat"] == mk::toString(st.link));
    CHECK(e["args"]["bytes"].get<uint64_t>() == st.bytes);
    const mk::sim::StepRecord& rec = simtest::at(p, rank, lane, step);
    CHECK(std::fabs(e["ts"].get<double>() - rec.startUs) <= 0.5e-3);  // whole nanoseconds
    CHECK(std::fabs(e["ts"].get<double>() + e["dur"].get<double>() - rec.endUs) <= 1e-3);
    CHECK(e["dur"].get<double>() >= 0.0);
    ++complete;
  }
  CHECK(complete == s.stepCount());
  CHECK(names == 3 + 3);  // one process name per rank, one thread name per lane (rank 2 has none)
}

TEST_CASE("output: trace metadata names ranks by node and lanes by role") {
  const mk::Schedule s = smallSchedule();
  const Json j = Json::parse(mk::sim::traceToJson(s, {}));
  bool rank2 = false, lane1 = false;
  for (const Json& e : j["traceEvents"]) {
    if (e["name"] == "process_name" && e["pid"] == 2) rank2 = e["args"]["name"] == "rank 2 (node 1)";
    if (e["name"] == "thread_name" && e["pid"] == 1 && e["tid"] == 2) lane1 = e["args"]["name"] == "lane 1 (intra)";
  }
  CHECK(rank2);
  CHECK(lane1);
}

TEST_CASE("output: the prediction json carries schema time bandwidths and the busiest links") {
  const auto p = simtest::run(smallSchedule(), simtest::cluster(2, 2));
  const Json j = Json::parse(mk::sim::predictionToJson(p, info()));
  CHECK(j["schema"] == "mkernel.prediction.v1");
  CHECK(j["time_us"].get<double>() == doctest::Approx(p.totalUs));
  const double algbw = 1000000.0 / (p.totalUs * 1e3);
  CHECK(j["algbw_gbs"].get<double>() == doctest::Approx(algbw));
  CHECK(j["busbw_gbs"].get<double>() == doctest::Approx(algbw * 4.0 / 3.0));
  CHECK(j["closed_form_us"].get<double>() == doctest::Approx(12.5));
  CHECK(!j.contains("uncontended_us"));
  CHECK(j["profile"] == "test profile");
  REQUIRE(j["busiest_links"].size() == 3);
  CHECK(j["busiest_links"][0]["utilization"].get<double>() >= j["busiest_links"][1]["utilization"].get<double>());
  CHECK(j["links"].size() == p.links.size());
  CHECK(j["stats"]["steps"].get<uint64_t>() == 3);
}

TEST_CASE("output: a sweep json has one result per size") {
  const auto p = simtest::run(smallSchedule(), simtest::cluster(2, 2));
  mk::sim::RunInfo a = info(), b = info();
  b.bytes = 2000000;
  const Json j = Json::parse(mk::sim::sweepToJson({{a, p}, {b, p}}));
  CHECK(j["schema"] == "mkernel.prediction.v1");
  CHECK(j["op"] == "allreduce");
  REQUIRE(j["results"].size() == 2);
  CHECK(j["results"][1]["bytes"].get<uint64_t>() == 2000000);
  CHECK(j["results"][1]["algbw_gbs"].get<double>() == doctest::Approx(2 * j["results"][0]["algbw_gbs"].get<double>()));
}

TEST_CASE("output: algbw is bytes over time and zero for a zero time") {
  CHECK(mk::sim::algBwGBs(1000000, 10.0) == doctest::Approx(100.0));
  CHECK(mk::sim::algBwGBs(1000000, 0.0) == 0.0);
}
