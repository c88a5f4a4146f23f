// The trace writer (mk/io/trace.hpp) and the order statistics (mk/util/stats.hpp).
#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include <cmath>
#include <string>
#include <vector>

#include "mk/io/trace.hpp"
#include "mk/util/stats.hpp"

using json = nlohmann::json;

TEST_CASE("trace: nanosecond times are written exactly and touching slices do not overlap") {
  mk::io::TraceWriter w({{"source", std::string("test")}});
  w.process(0, "rank 0", 0);
  w.lane(0, 0, "lane 0 (intra)");
  // Three back-to-back steps whose microsecond times have more than 3 decimals: the 6-decimal writer rounded
  // each start and each duration on its own and made the first end 1 ns after the second began.
  const std::vector<double> edgesUs = {3.2334999, 4.4655001, 5.6975004, 6.9304999};
  for (std::size_t i = 0; i + 1 < edgesUs.size(); ++i)
    w.slice(
        {0, 0, "put", "nvlink", mk::io::usToNs(edgesUs[i]), mk::io::usToNs(edgesUs[i + 1]), {{"step", uint64_t{i}}}});
  const std::string text = w.finish();
  const json doc = json::parse(text);
  CHECK(doc["displayTimeUnit"] == "ns");
  CHECK(doc["otherData"]["source"] == "test");
  int64_t prevEnd = -1;
  int slices = 0;
  for (const auto& e : doc["traceEvents"]) {
    if (e.contains("tid")) CHECK(e["tid"].is_number_unsigned());
    if (e["ph"] == "M") {
      if (e["name"] == "thread_name") CHECK(e["tid"] == 1);
      continue;
    }
    ++slices;
    CHECK(e["tid"] == 1);  // lane 0 is thread 1: tid 0 is "no thread" to Perfetto
    CHECK(e["args"]["lane"] == 0);
    const double ts = e["ts"].get<double>(), dur = e["dur"].get<double>();
    const int64_t start = std::llround(ts * 1e3), end = start + std::llround(dur * 1e3);
    CHECK(std::fabs(ts * 1e3 - static_cast<double>(start)) < 1e-6);  // whole nanoseconds
    if (prevEnd >= 0) CHECK(start == prevEnd);                       // touching, not overlapping
    prevEnd = end;
  }
  CHECK(slices == 3);
  CHECK(text.find("\"ts\":3.233") != std::string::npos);  // 3 decimals: the exact nanosecond count
  CHECK(text.find("\"ts\":4.466") != std::string::npos);
}

TEST_CASE("trace: names and args are escaped JSON, a reversed slice has zero length") {
  mk::io::TraceWriter w;
  w.process(7, "rank \"7\"\n");
  w.lane(7, 2, "lane 2");
  w.slice({7, 2, "wait", "", 1000, 500, {{"bytes", uint64_t{1} << 40}, {"kind", std::string("a\\b")}}});
  const json doc = json::parse(w.finish());
  const auto& ev = doc["traceEvents"];
  REQUIRE(ev.size() == 3);
  CHECK(ev[0]["args"]["name"] == "rank \"7\"\n");
  CHECK(ev[1]["tid"] == 3);
  CHECK(ev[2]["dur"] == 0);
  CHECK_FALSE(ev[2].contains("cat"));
  CHECK(ev[2]["args"]["bytes"] == (uint64_t{1} << 40));
  CHECK(ev[2]["args"]["kind"] == "a\\b");
  CHECK(mk::io::usToNs(std::nan("")) == 0);
  CHECK(mk::io::usToNs(1.0005) == 1001);
}

TEST_CASE("stats: median and quantile interpolate between order statistics") {
  CHECK(mk::median({}) == 0);
  CHECK(mk::median({3}) == 3);
  CHECK(mk::median({5, 1, 3}) == 3);
  CHECK(mk::median({4, 1, 3, 2}) == doctest::Approx(2.5));
  CHECK(mk::quantile({}, 0.9) == 0);
  const std::vector<double> v = {10, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  CHECK(mk::quantile(v, 0.5) == doctest::Approx(mk::median(v)));
  CHECK(mk::quantile(v, 0.9) == doctest::Approx(9.1));  // position 8.1 between 9 and 10
  CHECK(mk::quantile(v, 0.0) == 1);
  CHECK(mk::quantile(v, 1.0) == 10);
  CHECK(mk::quantile(v, 7.0) == 10);  // clamped
}
