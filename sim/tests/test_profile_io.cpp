// Profile <-> JSON: every field round-trips, provenance is kept, and malformed or out-of-range profiles are
// rejected with the field named.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <unistd.h>
#include <cstdio>
#include <fstream>
#include <string>

#include "mk/cost/cost.hpp"
#include "mk/cost/profile_io.hpp"
#include "mk/error.hpp"
#include "mk/topology/topology.hpp"
#include "sim_test_util.hpp"

using Json = nlohmann::json;

namespace {

mk::Profile odd() {
  mk::Profile p;
  p.source = "calibrated on h200x2 (test)";
  p.nvlink = mk::LinkCost{0.6512, 369.25};
  p.network = mk::LinkCost{3.51, 48.75};
  p.local = mk::LinkCost{0.47, 1965.5};
  p.reduceGBs = 1310.125;
  p.flagUs = 0.625;
  p.localFlagUs = 0.3125;
  p.dispatchUs = 2.25;
  p.peerUserUs = 0.1875;
  p.putIssueUs = 0.375;
  p.userPutUs = 0.4375;
  p.waitUs = 1.0625;
  p.proxyUs = 2.5;
  p.gemmTflops = 742.5;
  p.attentionTflops = 531.25;
  p.sms = 132;
  p.ctaGBs = 36.75;
  return p;
}

void checkSame(const mk::Profile& a, const mk::Profile& b) {
  CHECK(a.source == b.source);
  CHECK(a.nvlink.alphaUs == b.nvlink.alphaUs);
  CHECK(a.nvlink.bwGBs == b.nvlink.bwGBs);
  CHECK(a.network.alphaUs == b.network.alphaUs);
  CHECK(a.network.bwGBs == b.network.bwGBs);
  CHECK(a.local.alphaUs == b.local.alphaUs);
  CHECK(a.local.bwGBs == b.local.bwGBs);
  CHECK(a.reduceGBs == b.reduceGBs);
  CHECK(a.flagUs == b.flagUs);
  CHECK(a.localFlagUs == b.localFlagUs);
  CHECK(a.dispatchUs == b.dispatchUs);
  CHECK(a.peerUserUs == b.peerUserUs);
  CHECK(a.putIssueUs == b.putIssueUs);
  CHECK(a.userPutUs == b.userPutUs);
  CHECK(a.waitUs == b.waitUs);
  CHECK(a.proxyUs == b.proxyUs);
  CHECK(a.gemmTflops == b.gemmTflops);
  CHECK(a.attentionTflops == b.attentionTflops);
  CHECK(a.sms == b.sms);
  CHECK(a.ctaGBs == b.ctaGBs);
}

/// The JSON of odd() with `edit` applied, parsed; returns the error.
template <class F>
mk::Error rejected(F edit) {
  Json j = Json::parse(mk::profileToJson(odd()));
  edit(j);
  return simtest::errorOf([&] { mk::profileFromJson(j.dump()); });
}

}  // namespace

TEST_CASE("profile io: every field round trips") {
  const mk::Profile p = odd();
  checkSame(mk::profileFromJson(mk::profileToJson(p)), p);
}

TEST_CASE("profile io: sms and ctaGBs are optional, written only when set, and sms is whole") {
  mk::Profile p = odd();
  p.sms = 0;
  p.ctaGBs = 0;
  const std::string text = mk::profileToJson(p);
  CHECK(text.find("\"sms\"") == std::string::npos);
  CHECK(text.find("ctaGBs") == std::string::npos);
  checkSame(mk::profileFromJson(text), p);  // absent: 0, the CTA split not modelled
  const mk::Error e = rejected([](Json& j) { j["sms"] = 131.5; });
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find("sms must be a whole number in [0, 1048576] (got number 131.5)") != std::string::npos);
  CHECK(rejected([](Json& j) { j["ctaGBs"] = -1; }).message().find("ctaGBs must be a finite number in [0, 1000000]") !=
        std::string::npos);
}

TEST_CASE("profile io: the datasheet defaults of every preset round trip") {
  for (const auto& name : mk::topologyPresets()) {
    CAPTURE(name);
    const mk::Profile p = mk::defaultProfile(mk::topologyPreset(name, 1));
    checkSame(mk::profileFromJson(mk::profileToJson(p)), p);
  }
}

TEST_CASE("profile io: provenance is written and read back") {
  mk::ProfileProvenance prov;
  prov.system = "h200x2";
  prov.date = "2026-12-01";
  prov.commit = "abc123";
  prov.tool = "mk-calibrate";
  prov.measurements = {"validation/data/measured/a.json", "validation/data/measured/b.json"};
  const std::string text = mk::profileToJson(odd(), prov);
  CHECK(Json::parse(text)["schema"] == "mkernel.profile.v1");
  mk::ProfileProvenance back;
  mk::profileFromJson(text, &back);
  CHECK(back.system == prov.system);
  CHECK(back.date == prov.date);
  CHECK(back.commit == prov.commit);
  CHECK(back.tool == prov.tool);
  CHECK(back.measurements == prov.measurements);
}

TEST_CASE("profile io: a profile without provenance has none in its json") {
  CHECK(!Json::parse(mk::profileToJson(odd())).contains("provenance"));
}

TEST_CASE("profile io: a profile written before localFlagUs existed prices a local signal like flagUs") {
  Json j = Json::parse(mk::profileToJson(odd()));
  j.erase("localFlagUs");
  const mk::Profile p = mk::profileFromJson(j.dump());
  CHECK(p.localFlagUs == 0.625);
}

TEST_CASE("profile io: a profile written before the put and peer terms existed distinguishes none of them") {
  Json j = Json::parse(mk::profileToJson(odd()));
  for (const char* k : {"peerUserUs", "putIssueUs", "userPutUs", "waitUs"}) j.erase(k);
  const mk::Profile p = mk::profileFromJson(j.dump());
  CHECK(p.peerUserUs == 0);
  CHECK(p.putIssueUs == 0);
  CHECK(p.userPutUs == 0);
  CHECK(p.waitUs == 0);
}

TEST_CASE("profile io: a profile written before attentionTflops existed prices attention at gemmTflops") {
  Json j = Json::parse(mk::profileToJson(odd()));
  j.erase("attentionTflops");
  CHECK(mk::profileFromJson(j.dump()).attentionTflops == 742.5);
  // The efficiency form likewise: without attentionEfficiency the attention rate is the GEMM's.
  const mk::Topology machine = mk::topologyPreset("h200x2", 1);
  Json e = Json::parse(mk::profileToEfficiencyJson(odd(), {}, machine));
  CHECK(e.contains("attentionEfficiency"));
  CHECK(!e.contains("attentionTflops"));
  CHECK(mk::profileFromJson(e.dump()).attentionTflops == doctest::Approx(531.25).epsilon(1e-14));
  e.erase("attentionEfficiency");
  CHECK(mk::profileFromJson(e.dump()).attentionTflops == doctest::Approx(742.5).epsilon(1e-14));
  e["attentionTflops"] = 500;  // the efficiency form gives fractions only
  CHECK_THROWS_WITH_AS(mk::profileFromJson(e.dump()), doctest::Contains("attentionEfficiency"), mk::Error);
}

TEST_CASE("profile io: the datasheet attention rate is the GEMM rate, and scales with it") {
  const mk::Topology h200 = mk::topologyPreset("h200x2", 1);
  const mk::Profile d = mk::defaultProfile(h200);
  CHECK(d.attentionTflops == d.gemmTflops);
  mk::Profile measured = d;
  measured.attentionTflops = 0.5 * d.gemmTflops;
  const mk::Topology a100 = mk::topologyPreset("a100-8x200", 1);
  const mk::Profile on = mk::profileOnCluster(measured, h200, a100);
  CHECK(on.attentionTflops == doctest::Approx(0.5 * mk::defaultProfile(a100).gemmTflops));
}

TEST_CASE("profile io: ramps round trip, are written only when set, and are checked") {
  mk::Profile p = odd();
  p.nvlink.ramp = {{65536, 0.125}, {1 << 20, 0.75}, {64 << 20, 1.0}};
  p.local.ramp = {{32768, 0.5}, {4 << 20, 2.5}, {256 << 20, 1.0}};  // L2: above 1 at mid sizes
  p.reduceRamp = {{4096, 0.3}, {8 << 20, 1.7}};
  const mk::Profile back = mk::profileFromJson(mk::profileToJson(p));
  REQUIRE(back.nvlink.ramp.size() == 3);
  CHECK(back.nvlink.ramp[1].bytes == 1 << 20);
  CHECK(back.nvlink.ramp[1].fraction == 0.75);
  REQUIRE(back.local.ramp.size() == 3);
  CHECK(back.local.ramp[1].fraction == 2.5);
  REQUIRE(back.reduceRamp.size() == 2);
  CHECK(back.network.ramp.empty());
  CHECK(mk::profileToJson(odd()).find("ramp") == std::string::npos);
  // A link's ramp is capped at 1 and never falls; a memory pipe's may do both.
  const mk::Error above = rejected([](Json& j) {
    j["nvlink"]["ramp"] = Json::array({{{"bytes", 1024}, {"fraction", 1.5}}});
  });
  CHECK(above.message().find("nvlink.ramp[0].fraction must be in (0, 1]") != std::string::npos);
  const mk::Error falls = rejected([](Json& j) {
    j["network"]["ramp"] = Json::array({{{"bytes", 1024}, {"fraction", 0.5}}, {{"bytes", 4096}, {"fraction", 0.25}}});
  });
  CHECK(falls.message().find("network.ramp[1].fraction must not fall below") != std::string::npos);
  const mk::Error typo = rejected([](Json& j) {
    j["local"]["ramp"] = Json::array({{{"bytes", 1024}, {"frac", 0.5}}});
  });
  CHECK(typo.message().find("unknown field local.ramp[0].frac") != std::string::npos);
  const mk::Error notArray = rejected([](Json& j) { j["reduceRamp"] = 3; });
  CHECK(notArray.message().find("reduceRamp must be an array") != std::string::npos);
}

TEST_CASE("profile io: a missing parameter is rejected naming the field") {
  const mk::Error e = rejected([](Json& j) { j["network"].erase("bwGBs"); });
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find("missing field network.bwGBs") != std::string::npos);
  const mk::Error top = rejected([](Json& j) { j.erase("dispatchUs"); });
  CHECK(top.message().find("missing field dispatchUs") != std::string::npos);
}

TEST_CASE("profile io: a negative parameter is rejected naming the field") {
  const mk::Error e = rejected([](Json& j) { j["nvlink"]["alphaUs"] = -0.5; });
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find("nvlink.alphaUs must be a finite number in [0, 1000000]") != std::string::npos);
  CHECK(e.message().find("-0.5") != std::string::npos);
  const mk::Error w = rejected([](Json& j) { j["waitUs"] = -1; });
  CHECK(w.message().find("waitUs must be a finite number in [0, 1000000]") != std::string::npos);
}

TEST_CASE("profile io: values a model cannot carry are rejected naming the field and the rule") {
  // Each of these once reached the simulator: an abort, a false deadlock, or a prediction of inf.
  const mk::Error huge = rejected([](Json& j) { j["network"]["bwGBs"] = 1e308; });
  CHECK(huge.message().find("profile: network.bwGBs must be a finite number in [0, 1000000]") != std::string::npos);
  const mk::Error tiny = rejected([](Json& j) { j["network"]["bwGBs"] = 5e-324; });
  CHECK(tiny.message().find("network.bwGBs must be 0 or a rate in [0.001, 1e+06]") != std::string::npos);
  const mk::Error slow = rejected([](Json& j) { j["nvlink"]["alphaUs"] = 1.7e308; });
  CHECK(slow.message().find("nvlink.alphaUs must be a finite number") != std::string::npos);
  const mk::Error sms = rejected([](Json& j) { j["sms"] = 4294967298.0; });
  CHECK(sms.code() == mk::ErrorCode::ParseError);
  CHECK(sms.message().find("profile: sms must be a whole number") != std::string::npos);
}

TEST_CASE("profile io: a non finite parameter is rejected") {
  const mk::Error e = simtest::errorOf([] {
    std::string text = mk::profileToJson(odd());
    const auto pos = text.find("\"gemmTflops\": 742.5");
    REQUIRE(pos != std::string::npos);
    text.replace(pos, std::string("\"gemmTflops\": 742.5").size(), "\"gemmTflops\": 1e999");
    mk::profileFromJson(text);
  });
  // JSON has no infinity: nlohmann refuses the overflowing literal itself, and the message quotes it.
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find("1e999") != std::string::npos);
}

TEST_CASE("profile io: a parameter of the wrong type is rejected naming the field") {
  const mk::Error e = rejected([](Json& j) { j["flagUs"] = "fast"; });
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find("flagUs must be a finite number in [0, 1000000] (got string \"fast\")") != std::string::npos);
}

TEST_CASE("profile io: a misspelt field is rejected instead of ignored") {
  const mk::Error e = rejected([](Json& j) { j["nvlink"]["bwGbs"] = 1; });
  CHECK(e.message().find("unknown field nvlink.bwGbs") != std::string::npos);
}

TEST_CASE("profile io: a wrong schema is rejected") {
  const mk::Error e = rejected([](Json& j) { j["schema"] = "mkernel.profile.v0"; });
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find("mkernel.profile.v1") != std::string::npos);
}

TEST_CASE("profile io: text that is not json is a parse error") {
  const mk::Error e = simtest::errorOf([] { mk::profileFromJson("{ \"schema\": "); });
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find("not valid JSON") != std::string::npos);
}

TEST_CASE("profile io: save then load gives the same profile and a missing file is an io error") {
  char path[] = "/tmp/mk-profile-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  mk::saveProfile(odd(), path);
  checkSame(mk::loadProfile(path), odd());
  std::remove(path);
  const mk::Error e = simtest::errorOf([&] { mk::loadProfile(path); });
  CHECK(e.code() == mk::ErrorCode::IoError);
}

TEST_CASE("profile io: a load error names the file") {
  char path[] = "/tmp/mk-profile-XXXXXX";
  const int fd = mkstemp(path);
  REQUIRE(fd >= 0);
  close(fd);
  {
    std::ofstream out(path);
    out << "{\"schema\": \"mkernel.profile.v1\"}";
  }
  const mk::Error e = simtest::errorOf([&] { mk::loadProfile(path); });
  std::remove(path);
  CHECK(e.code() == mk::ErrorCode::ParseError);
  CHECK(e.message().find(path) == 0);
  CHECK(e.message().find("missing field source") != std::string::npos);
}
