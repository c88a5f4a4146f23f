// mk-validate's library side: records map back to the schedule the engine ran, error statistics, cluster
// inference, the predictions against a known closed form, the refusals (bad records, circular profiles) and the
// side-by-side trace.
#include <doctest/doctest.h>

#include <nlohmann/json.hpp>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/sim/fused.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"
#include "mk/validation/validate.hpp"
#include "validate_fixtures.hpp"

namespace {

using mkt::coll;
using mkt::contains;
using mkt::datasheet;
using mkt::errorOf;
using mkt::file;
using nlohmann::json;

mk::MeasurementRecord other(const std::string& op, const std::string& impl) {
  mk::MeasurementRecord r = coll(op, "", 8, 2);
  r.impl = impl;
  r.extra.clear();
  return r;
}

/// Write `text` to `path`; false when it cannot.
bool writeText(const std::string& path, const std::string& text) {
  std::FILE* f = std::fopen(path.c_str(), "w");
  if (f == nullptr) return false;
  const bool ok = std::fputs(text.c_str(), f) >= 0;
  return std::fclose(f) == 0 && ok;
}

double closedFormUs(const mk::MeasurementRecord& r) {
  const mk::RecordSchedule q = mk::recordSchedule(r, "test");
  return mk::closedForm(q.spec, q.gen, mk::topologyPreset("h200x2"), q.nRanks, datasheet()).totalUs;
}

}  // namespace

TEST_CASE("validate: a record maps back to its generator with auto and in-place") {
  mk::MeasurementRecord r = coll("allreduce", "auto:one-shot", 1024, 256);
  r.extra["chunks"] = "4";
  r.extra["channels"] = "2";
  r.extra["inplace"] = "true";
  r.extra["redop"] = "\"max\"";
  const mk::RecordSchedule q = mk::recordSchedule(r, "f.json: records[0]");
  CHECK(q.spec.op == mk::CollOp::AllReduce);
  CHECK(q.spec.algo == mk::Algorithm::OneShot);
  CHECK(q.chosenByAuto);
  CHECK(q.inPlace);
  CHECK(q.spec.redop == mk::RedOp::Max);
  CHECK(q.spec.dtype == mk::DType::Float32);
  CHECK(q.spec.count == 256);
  CHECK(q.gen.chunks == 4);
  CHECK(q.gen.channels == 2);
  CHECK(q.nRanks == 2);
  const mk::RecordSchedule plain = mk::recordSchedule(coll("allreduce", "ring", 1024, 256), "w");
  CHECK(plain.spec.algo == mk::Algorithm::Ring);
  CHECK_FALSE(plain.chosenByAuto);
  CHECK_FALSE(plain.inPlace);
  CHECK(plain.spec.redop == mk::RedOp::Sum);
}

TEST_CASE("validate: a record's protocol picks packet puts, records without one ran plain puts") {
  mk::MeasurementRecord r = coll("allreduce", "two-shot", 1024, 256);
  CHECK(mk::recordSchedule(r, "w").gen.protocol == mk::Protocol::Simple);
  const double plainUs = closedFormUs(r);
  r.extra["protocol"] = "\"ll\"";
  CHECK(mk::recordSchedule(r, "w").gen.protocol == mk::Protocol::LL);
  CHECK(closedFormUs(r) != plainUs);  // priced with the packet protocol's put prices
  r.extra["protocol"] = "\"fast\"";
  CHECK(contains(errorOf([&] { mk::recordSchedule(r, "f.json: records[0]"); }), "field 'protocol' must be"));
}

TEST_CASE("validate: allgather and reducescatter counts are per rank and must give the recorded bytes") {
  // allgather: count per rank, bytes = the output (count x ranks); reducescatter: bytes = the input.
  CHECK(mk::recordSchedule(coll("allgather", "ring", 128, 16), "w").spec.count == 16);
  CHECK(mk::recordSchedule(coll("reducescatter", "direct", 128, 16), "w").spec.count == 16);
  const std::string e = errorOf([] { mk::recordSchedule(coll("allgather", "ring", 64, 16), "ag.json: records[3]"); });
  CHECK(contains(e, "ag.json: records[3]"));
  CHECK(contains(e, "count 16"));
  CHECK(contains(e, "128 bytes"));
  CHECK(contains(e, "bytes 64"));
  // No count: derived from bytes when they hold whole elements per rank block.
  mk::MeasurementRecord r = coll("allgather", "direct", 128, 1);
  r.extra.erase("count");
  CHECK(mk::recordSchedule(r, "w").spec.count == 16);
  r.bytes = 100;  // 12.5 float32 per rank
  CHECK(contains(errorOf([&] { mk::recordSchedule(r, "w"); }), "not a whole number"));
  r.bytes = 4;  // half an element per rank
  CHECK(contains(errorOf([&] { mk::recordSchedule(r, "w"); }), "less than one"));
}

TEST_CASE("validate: records that cannot be regenerated are refused by name") {
  auto err = [](const std::function<void(mk::MeasurementRecord&)>& edit) {
    mk::MeasurementRecord r = coll("allreduce", "ring", 1024, 256);
    edit(r);
    return errorOf([&] { mk::recordSchedule(r, "x.json: records[7] (allreduce ring 1024 B)"); });
  };
  CHECK(contains(err([](auto& r) { r.algo = "butterfly"; }), "unknown algorithm 'butterfly' for allreduce"));
  CHECK(contains(err([](auto& r) { r.algo = "butterfly"; }), "x.json: records[7]"));
  CHECK(contains(err([](auto& r) { r.algo = "auto"; }), "does not say which generator"));
  CHECK(contains(err([](auto& r) { r.algo = "auto:nope"; }), "unknown algorithm 'nope'"));
  CHECK(contains(err([](auto& r) { r.algo = ""; }), "missing field 'algo'"));
  CHECK(contains(err([](auto& r) { r.extra.erase("chunks"); }), "missing field 'chunks'"));
  CHECK(contains(err([](auto& r) { r.extra.erase("channels"); }), "missing field 'channels'"));
  CHECK(contains(err([](auto& r) { r.extra["chunks"] = "0"; }), "field 'chunks' must be a whole number in [1, 4096]"));
  // A record cannot ask the generator for more than the command line may (it once hung mk-validate).
  CHECK(contains(err([](auto& r) { r.extra["chunks"] = "10000000"; }),
                 "x.json: records[7] (allreduce ring 1024 B): field 'chunks' must be a whole number in [1, 4096] "
                 "(got number 10000000)"));
  CHECK(contains(err([](auto& r) { r.extra["channels"] = "\"two\""; }),
                 "field 'channels' must be a whole number in [1, 256] (got string \"two\")"));
  CHECK(contains(err([](auto& r) { r.extra["count"] = "-3"; }), "field 'count' must be a whole number in [1, "));
  CHECK(contains(err([](auto& r) { r.dtype = "int7"; }), "unknown dtype 'int7'"));
  CHECK(contains(err([](auto& r) { r.extra["redop"] = "\"prod\""; }), "unknown redop"));
  CHECK(contains(err([](auto& r) { r.extra["inplace"] = "\"yes\""; }), "'inplace' must be true or false"));
  CHECK(contains(err([](auto& r) { r.op = "gemm"; }), "not a collective"));
  CHECK(err([](auto&) {}).empty());
}

TEST_CASE("validate: only mkernel collectives are validated") {
  CHECK(mk::isValidatedRecord(coll("allreduce", "ring", 8, 2)));
  CHECK(mk::isValidatedRecord(coll("alltoall", "direct", 8, 1)));
  CHECK_FALSE(mk::isValidatedRecord(other("allreduce", "nccl")));
  CHECK_FALSE(mk::isValidatedRecord(other("calib-flag", "mkernel")));
  CHECK_FALSE(mk::isValidatedRecord(other("enqueue-to-first-step", "mkernel")));
}

TEST_CASE("validate: error statistics are median p90 and max of absolute errors") {
  CHECK(mk::errorPct(110, 100) == doctest::Approx(10));
  CHECK(mk::errorPct(90, 100) == doctest::Approx(-10));
  const mk::ErrorStats s = mk::errorStats({1, -2, 3, -4});
  CHECK(s.n == 4);
  CHECK(s.medianAbsPct == doctest::Approx(2.5));
  CHECK(s.p90AbsPct == doctest::Approx(3.7));  // position 0.9 x 3 = 2.7 between 3 and 4
  CHECK(s.maxAbsPct == doctest::Approx(4));
  const mk::ErrorStats odd = mk::errorStats({-7, 1, 5});
  CHECK(odd.medianAbsPct == doctest::Approx(5));
  CHECK(odd.p90AbsPct == doctest::Approx(6.6));  // position 1.8 between 5 and 7
  CHECK(odd.maxAbsPct == doctest::Approx(7));
  const mk::ErrorStats one = mk::errorStats({-3});
  CHECK(one.medianAbsPct == doctest::Approx(3));
  CHECK(one.p90AbsPct == doctest::Approx(3));
  CHECK(mk::errorStats({}).n == 0);
  mk::ErrorStats line;
  line.n = 12;
  line.medianAbsPct = 3.14159;
  line.p90AbsPct = 10;
  line.maxAbsPct = 12.345;
  CHECK(mk::formatSummaryLine(line) ==
        "validation: n=12 median_abs_err_pct=3.14 p90_abs_err_pct=10.00 max_abs_err_pct=12.35");
}

TEST_CASE("validate: the cluster is inferred from the system block or asked for") {
  CHECK(mk::inferCluster(file({}, "NVIDIA H200", 2)) == "h200x2");
  CHECK(mk::inferCluster(file({}, "NVIDIA H100", 8)) == "dgx-h100");
  CHECK(mk::inferCluster(file({}, "NVIDIA A100", 8)) == "a100-8x200");
  CHECK(mk::inferCluster(file({}, "Tesla V100", 8)).empty());
  CHECK(mk::inferCluster(file({}, "NVIDIA H200", 4)).empty());
  const std::vector<mk::MeasurementFile> two = {file({}), file({}, "NVIDIA H100", 8)};
  const std::string mixed = errorOf([&] { mk::resolveCluster(two, {"a.json", "b.json"}, ""); });
  CHECK(contains(mixed, "different systems"));
  CHECK(contains(mixed, "b.json: dgx-h100"));
  const std::string unknown = errorOf([] { mk::resolveCluster({file({}, "Tesla V100", 8)}, {"c.json"}, ""); });
  CHECK(contains(unknown, "c.json"));
  CHECK(contains(unknown, "--cluster"));
  CHECK(mk::resolveCluster(two, {"a.json", "b.json"}, "h200x2") == "h200x2");
}

TEST_CASE("validate: predictions match records timed by the closed form and other records are ignored") {
  std::vector<mk::MeasurementRecord> recs = {coll("allreduce", "one-shot", 1 << 20, 1 << 18),
                                             coll("allreduce", "auto:ring", 1 << 20, 1 << 18),
                                             coll("allgather", "direct", 1 << 16, 1 << 13),
                                             other("allreduce", "nccl"),
                                             other("calib-flag", "mkernel"),
                                             other("enqueue-to-first-step", "mkernel")};
  for (auto& r : recs)
    if (mk::isValidatedRecord(r)) r.timeUs = closedFormUs(r);
  const mk::MeasurementFile f = file(recs);
  mk::ValidationOptions opt;
  opt.jobs = 2;
  const mk::ValidationResult res = mk::validateMeasurements({f}, {"f.json"}, datasheet(), opt);
  CHECK(res.cluster == "h200x2");
  REQUIRE(res.rows.size() == 3);
  CHECK(res.ignored == 3);
  CHECK(res.files.at(0).validated == 3);
  CHECK(res.rows[1].algo == "auto:ring");
  CHECK(res.rows[1].request.spec.algo == mk::Algorithm::Ring);
  for (const auto& row : res.rows) {
    REQUIRE(row.closedErrPct);
    CHECK(std::fabs(*row.closedErrPct) < 1e-9);
    // Without contention the simulator reproduces the closed form (docs/simulator.md: within 1 %).
    CHECK(std::fabs(row.simErrPct) < 1.0);
    CHECK(row.steps > 0);
  }
  CHECK(res.sim.n == 3);
  CHECK(res.closed.maxAbsPct < 1e-9);

  // The same records measured 20 % slower than predicted: every error is -1/6.
  mk::MeasurementFile slow = f;
  for (auto& r : slow.records)
    if (mk::isValidatedRecord(r)) r.timeUs *= 1.2;
  const mk::ValidationResult s = mk::validateMeasurements({slow}, {"slow.json"}, datasheet(), opt);
  CHECK(s.closed.medianAbsPct == doctest::Approx(100.0 / 6.0));
  CHECK(s.rows.at(0).closedErrPct.value() == doctest::Approx(-100.0 / 6.0));

  mk::ValidationOptions onlyAg = opt;
  onlyAg.ops = {"allgather"};
  const mk::ValidationResult ag = mk::validateMeasurements({f}, {"f.json"}, datasheet(), onlyAg);
  CHECK(ag.rows.size() == 1);
  CHECK(ag.filtered == 2);
  mk::ValidationOptions ring = opt;
  ring.algos = {"ring"};
  CHECK(mk::validateMeasurements({f}, {"f.json"}, datasheet(), ring).rows.size() == 1);
  ring.algos = {"auto:ring", "one-shot"};
  CHECK(mk::validateMeasurements({f}, {"f.json"}, datasheet(), ring).rows.size() == 2);
  mk::ValidationOptions badOp = opt;
  badOp.ops = {"allreduse"};
  CHECK(contains(errorOf([&] { mk::validateMeasurements({f}, {"f.json"}, datasheet(), badOp); }), "allreduse"));
}

TEST_CASE("validate: in place adds the staging copy of the input to both predictions") {
  mk::MeasurementRecord r = coll("allreduce", "one-shot", 1 << 20, 1 << 18);
  mk::MeasurementRecord ip = r;
  ip.extra["inplace"] = "true";
  const mk::ValidationResult res = mk::validateMeasurements({file({r, ip})}, {"f.json"}, datasheet());
  REQUIRE(res.rows.size() == 2);
  const double staging = datasheet().local.alphaUs + (1 << 20) / (datasheet().local.bwGBs * 1e3);
  CHECK(res.rows[0].stagingUs == 0);
  CHECK(res.rows[1].stagingUs == doctest::Approx(staging));
  CHECK(res.rows[1].simUs - res.rows[0].simUs == doctest::Approx(staging));
  CHECK(*res.rows[1].closedUs - *res.rows[0].closedUs == doctest::Approx(staging));
}

TEST_CASE("validate: a bad record fails the run by name unless skipped") {
  mk::MeasurementRecord good = coll("allreduce", "ring", 1024, 256);
  mk::MeasurementRecord badAlgo = coll("allreduce", "butterfly", 1024, 256);
  const mk::MeasurementFile f = file({good, badAlgo});
  const std::string e = errorOf([&] { mk::validateMeasurements({f}, {"bad.json"}, datasheet()); });
  CHECK(contains(e, "bad.json: records[1]"));
  CHECK(contains(e, "butterfly"));
  mk::ValidationOptions skip;
  skip.skipBad = true;
  const mk::ValidationResult res = mk::validateMeasurements({f}, {"bad.json"}, datasheet(), skip);
  CHECK(res.rows.size() == 1);
  REQUIRE(res.skipped.size() == 1);
  CHECK(res.skipped[0].index == 1);
  CHECK(contains(res.skipped[0].reason, "butterfly"));
  CHECK(res.files[0].skipped == 1);
  // A record with more ranks than the cluster holds is the record's fault too, named.
  mk::MeasurementRecord wide = coll("allreduce", "ring", 1024, 256);
  wide.ranks = 16;
  const std::string w = errorOf([&] { mk::validateMeasurements({file({wide})}, {"wide.json"}, datasheet()); });
  CHECK(contains(w, "wide.json: records[0]"));
}

TEST_CASE("validate: a profile fitted on a validated file is refused") {
  const std::vector<mk::MeasurementFile> files = {file({coll("allreduce", "ring", 1024, 256)})};
  mk::ProfileProvenance prov;
  prov.tool = "mk-calibrate --out p.json";
  prov.measurements = {"/elsewhere/2026-11-29-h200x2-allreduce.json (run commit abc)"};
  const std::string e =
      errorOf([&] { mk::checkProfileIndependence(prov, "p.json", files, {"data/2026-11-29-h200x2-allreduce.json"}); });
  CHECK(contains(e, "p.json"));
  CHECK(contains(e, "circular"));
  CHECK(contains(e, "1 collective record"));
  // Another file, or the same file with no record left to validate: accepted.
  CHECK(errorOf([&] { mk::checkProfileIndependence(prov, "p.json", files, {"data/other.json"}); }).empty());
  mk::ValidationOptions onlyAg;
  onlyAg.ops = {"allgather"};
  CHECK(errorOf([&] {
          mk::checkProfileIndependence(prov, "p.json", files, {"data/2026-11-29-h200x2-allreduce.json"}, onlyAg);
        }).empty());
  const std::vector<mk::MeasurementFile> calibOnly = {file({other("calib-flag", "mkernel")})};
  CHECK(errorOf([&] {
          mk::checkProfileIndependence(prov, "p.json", calibOnly, {"data/2026-11-29-h200x2-allreduce.json"});
        }).empty());
}

TEST_CASE("validate: the honesty statement says how the profile was obtained") {
  mk::ProfileProvenance prov;
  prov.tool = "mk-calibrate --cluster h200x2 --out p.json c.json";
  prov.measurements = {"c.json (run commit abc)"};
  const std::string fitted = mk::honestyStatement("p.json", datasheet(), prov);
  CHECK(contains(fitted, "micro-benchmark"));
  CHECK(contains(fitted, "c.json (run commit abc)"));
  CHECK(contains(mk::honestyStatement("", datasheet(), {}), "datasheet"));
  prov.tool = "hand-edited";
  CHECK(contains(mk::honestyStatement("p.json", datasheet(), prov), "cannot vouch"));
}

namespace {

/// A measured trace in mk::traceToChromeJson's format holding `ops` copies of the predicted steps, each op
/// `gapUs` after the previous one and its steps `scale` times as long; rank r's clock is `skewUs` * r ahead.
std::string measuredTrace(const mk::sim::Prediction& p, int ops, double gapUs, double scale, double skewUs = 0) {
  json ev = json::array();
  ev.push_back({{"name", "process_name"}, {"ph", "M"}, {"pid", 0}, {"args", {{"name", "rank 0"}}}});
  for (int op = 0; op < ops; ++op)
    for (const auto& st : p.steps)
      ev.push_back({{"name", mk::toString(st.kind)},
                    {"cat", "step"},
                    {"ph", "X"},
                    {"pid", st.rank},
                    {"tid", st.lane + 1},
                    {"ts", 100.0 + op * gapUs + st.startUs * scale + skewUs * st.rank},
                    {"dur", (st.endUs - st.startUs) * scale},
                    {"args", {{"op", op}, {"step", st.step}, {"lane", st.lane}}}});
  return json{{"displayTimeUnit", "ns"}, {"traceEvents", ev}}.dump();
}

}  // namespace

TEST_CASE("validate: measured and predicted traces side by side") {
  const mk::ValidationResult res =
      mk::validateMeasurements({file({coll("allreduce", "two-shot", 1 << 16, 1 << 14)})}, {"f.json"}, datasheet());
  REQUIRE(res.rows.size() == 1);
  const mk::Regenerated regen = mk::regenerate(res.rows[0], res.cluster);
  const mk::sim::Prediction p = mk::sim::predict(regen.schedule, regen.topo, datasheet());
  REQUIRE(p.steps.size() == regen.schedule.stepCount());
  double firstPredicted = p.steps[0].startUs;
  for (const auto& st : p.steps) firstPredicted = std::min(firstPredicted, st.startUs);

  // Predicted only.
  const mk::SideBySide alone = mk::sideBySideTrace(regen.schedule, p, "", "", std::nullopt, "t");
  CHECK(contains(alone.note, "predicted timeline only"));
  CHECK_FALSE(contains(alone.json, "measured rank"));
  CHECK(contains(alone.json, "simulated rank 1"));
  CHECK(alone.steps.size() == p.steps.size());
  CHECK_FALSE(alone.measuredOp);

  // Two ops with the schedule's steps: ambiguous without --measured-op. Rank r's clock runs 50 * r us ahead.
  const std::string two = measuredTrace(p, 2, 1000.0, 2.0, 50.0);
  const std::string amb = errorOf([&] { mk::sideBySideTrace(regen.schedule, p, two, "t.json", std::nullopt, "t"); });
  CHECK(contains(amb, "--measured-op"));
  const mk::SideBySide both = mk::sideBySideTrace(regen.schedule, p, two, "t.json", 1, "t");
  REQUIRE(both.measuredOp);
  CHECK(*both.measuredOp == 1);
  CHECK(contains(both.json, "measured rank 0"));
  CHECK(contains(both.json, "simulated rank 0"));
  std::map<uint32_t, double> firstMeasured, firstPredictedOf;
  for (const auto& c : both.steps) {
    REQUIRE(c.measStartUs);
    REQUIRE(c.measDurUs);
    CHECK(std::fabs(*c.measDurUs - 2.0 * c.simDurUs) <= 1e-3);  // whole nanoseconds in the trace
    firstMeasured.emplace(c.rank, 1e300);
    firstPredictedOf.emplace(c.rank, 1e300);
    firstMeasured[c.rank] = std::min(firstMeasured[c.rank], *c.measStartUs);
    firstPredictedOf[c.rank] = std::min(firstPredictedOf[c.rank], c.simStartUs);
  }
  REQUIRE(firstMeasured.size() >= 2);
  for (const auto& [rank, t] : firstMeasured)  // every GPU aligned on its own first step: no clock skew left
    CHECK(std::fabs(t - firstPredictedOf[rank]) <= 1e-3);
  CHECK(std::fabs(std::min_element(firstMeasured.begin(), firstMeasured.end(),
                                   [](auto& a, auto& b) { return a.second < b.second; })
                      ->second -
                  firstPredicted) <= 1e-3);
  const json doc = json::parse(both.json);
  std::size_t measuredEvents = 0, simulatedEvents = 0;
  for (const auto& e : doc["traceEvents"]) {
    CHECK(e.value("tid", 1) != 0);  // lane 0 is tid 1: Perfetto reads tid 0 as "no thread"
    if (e["ph"] == "X") (e["pid"].get<int>() % 2 == 0 ? measuredEvents : simulatedEvents)++;
  }
  CHECK(measuredEvents == p.steps.size());
  CHECK(simulatedEvents == p.steps.size());

  // One op: chosen without asking.
  CHECK(mk::sideBySideTrace(regen.schedule, p, measuredTrace(p, 1, 0, 1.0), "t.json", std::nullopt, "t").measuredOp ==
        0u);
  // A trace of another schedule, a missing op and malformed input are refused by name.
  std::string wrongKind = measuredTrace(p, 1, 0, 1.0);
  const std::string firstKind = std::string("\"name\":\"") + mk::toString(p.steps[0].kind) + "\"";
  wrongKind.replace(wrongKind.find(firstKind), firstKind.size(), "\"name\":\"gemm\"");
  CHECK(contains(errorOf([&] { mk::sideBySideTrace(regen.schedule, p, wrongKind, "w.json", std::nullopt, "t"); }),
                 "no op has the record's schedule"));
  CHECK(contains(errorOf([&] { mk::sideBySideTrace(regen.schedule, p, two, "t.json", 5, "t"); }), "no op 5"));
  CHECK(contains(errorOf([&] { mk::sideBySideTrace(regen.schedule, p, "{\"traceEvents\": [", "b.json", 0, "t"); }),
                 "b.json"));
  CHECK(contains(errorOf([&] {
                   mk::sideBySideTrace(regen.schedule, p,
                                       R"({"traceEvents":[{"ph":"X","pid":0,"tid":0,"ts":1,"dur":1,"name":"put"}]})",
                                       "n.json", 0, "t");
                 }),
                 "missing 'args'"));
  // A phase that is not a string is one field error, not nlohmann's type_error.
  CHECK(contains(errorOf([&] {
                   mk::sideBySideTrace(regen.schedule, p, R"({"traceEvents":[{"ph":null,"pid":0}]})", "p.json", 0, "t");
                 }),
                 "p.json: traceEvents[0]: ph must be a string"));
}

TEST_CASE("validate: the JSON output holds rows summary profile and trace") {
  mk::MeasurementRecord r = coll("allreduce", "ring", 4096, 1024, 20.0);
  const mk::ValidationResult res =
      mk::validateMeasurements({file({r, other("allreduce", "nccl")})}, {"f.json"}, datasheet());
  mk::ValidationContext ctx;
  ctx.profile = datasheet();
  ctx.provenance.tool = "defaultProfile";
  ctx.honesty = mk::honestyStatement("", datasheet(), ctx.provenance);
  ctx.maxMedianErrPct = 1000.0;
  const json doc = json::parse(mk::validationToJson(res, ctx));
  CHECK(doc["schema"] == mk::kValidationSchema);
  CHECK(doc["cluster"] == "h200x2");
  REQUIRE(doc["rows"].size() == 1);
  CHECK(doc["rows"][0]["generator"] == "ring");
  CHECK(doc["rows"][0]["measured_us"].get<double>() == doctest::Approx(20.0));
  CHECK(doc["rows"][0]["sim_err_pct"].get<double>() == doctest::Approx(res.rows[0].simErrPct));
  CHECK(doc["summary"]["sim"]["n"] == 1);
  CHECK(doc["summary"]["gated"] == "sim.median_abs_err_pct");
  CHECK(doc["summary"]["gate_passed"] == true);
  CHECK(doc["summary"]["ignored"] == 1);
  CHECK(doc["profile"]["nvlink"]["bwGBs"].get<double>() == doctest::Approx(datasheet().nvlink.bwGBs));
  CHECK(doc["profile"]["path"].is_null());
  CHECK_FALSE(doc.contains("trace"));
  CHECK(contains(mk::formatValidationTable(res), "ring"));
}

TEST_CASE("validate: a multi-node record is placed on as many nodes as it ran on") {
  // 4 ranks recorded on 2 nodes (2 per node, each rank its own process): the regenerated schedule must put ranks
  // 0-1 and 2-3 on different nodes, which only a cluster with 2 GPUs per node can say.
  mk::MeasurementRecord r = coll("allreduce", "hierarchical", 1 << 20, 1 << 18);
  r.ranks = 4;
  r.extra["nodes"] = "2";
  r.extra["transport"] = "\"socket\"";
  const mk::RecordSchedule q = mk::recordSchedule(r, "n.json");
  CHECK(q.nodes == 2);
  mk::ValidationRow row;
  row.request = q;
  const std::string twoPerNode = R"({"schema": "mkernel.topology.v1", "name": "two-per-node", "nodes": 2,
    "node": {"gpu": "NVIDIA H200", "gpus": 2, "sms": 132, "bf16Tflops": 989, "hbmGBs": 4800,
             "nvlink": {"bwGBs": 450, "latencyUs": 0.65, "switched": false}, "pcie": {"bwGBs": 64, "latencyUs": 1.0},
             "nics": 1, "nic": {"bwGBs": 50, "latencyUs": 2.5}},
    "fabric": {"kind": "rail-leaf-spine", "nodesPerLeaf": 32, "oversubscription": 1, "switchLatencyUs": 0.5}})";
  const std::string path = "validate-two-per-node.json";
  REQUIRE(writeText(path, twoPerNode));
  const mk::Regenerated g = mk::regenerate(row, path);
  CHECK(g.schedule.nodeOf == std::vector<uint32_t>{0, 0, 1, 1});
  // A cluster of 8 GPUs per node would put all four on one node: refused, naming what is needed.
  const std::string e = errorOf([&] { mk::regenerate(row, "dgx-h200"); });
  CHECK(contains(e, "4 ranks on 2 nodes (2 per node)"));
  CHECK(contains(e, "8 GPU(s) per node"));
  std::remove(path.c_str());
  mk::MeasurementRecord odd = r;
  odd.extra["nodes"] = "3";
  CHECK(contains(errorOf([&] { mk::recordSchedule(odd, "n.json"); }), "does not divide the record's 4 ranks"));
}

namespace {

/// A fused record as mk-bench writes it: 2 ranks, a small shape, the options that ran.
mk::MeasurementRecord fusedRecord(const std::string& op, const std::string& order, double timeUs = 10.0) {
  mk::MeasurementRecord r;
  r.op = op;
  r.impl = "mkernel";
  r.algo = "fused " + order;
  r.dtype = "bfloat16";
  r.ranks = 2;
  r.bytes = 256 * 256 * 2;
  r.timeUs = timeUs;
  r.iters = 20;
  r.stat = "median";
  r.extra = {{"m", "256"},
             {"n", "256"},
             {"k", "256"},
             {"sms", "32"},
             {"tile_rows", "128"},
             {"order", "\"" + order + "\""},
             {"ctas", "16"},
             {"compute_ctas", "12"},
             {"comm_ctas", "4"},
             {"compute_lanes", "1"},
             {"layout_b", "\"row\""},
             {"shared_gpu", "false"}};
  return r;
}

/// The time the fused model gives the record: mk::sim::predictFused (mk-sim's and the planner's entry point) with
/// the record's options on the cluster's first node; ranks that shared one GPU on the SMs of their own CTAs.
double fusedModelUs(const mk::MeasurementRecord& r, const std::string& cluster = "h200x2") {
  const mk::FusedRecordRequest q = mk::fusedRecordRequest(r, "test");
  mk::Profile p = q.sharedGpu ? mk::heldSmsProfile(datasheet(), q.opt.ctas) : datasheet();
  const mk::Topology topo = mk::fusedRecordTopology(cluster, q);
  return mk::sim::predictFused(q.spec, q.opt, topo, q.nRanks, p, true).totalUs;
}

}  // namespace

TEST_CASE("validate: fused records timed by the fused model are predicted within noise and a biased one is not") {
  std::vector<mk::MeasurementRecord> recs{fusedRecord("gemm-rs", "own-last"), fusedRecord("ag-gemm", "own-first"),
                                          fusedRecord("gemm-ar", "interleaved")};
  for (auto& r : recs) r.timeUs = fusedModelUs(r);
  recs.push_back(coll("allreduce", "one-shot", 1024, 256));  // a collective: not on the fused line
  mk::ValidationOptions o;
  o.jobs = 1;
  const mk::FusedValidation v = mk::validateFused({file(recs)}, {"f.json"}, "h200x2", datasheet(), o);
  REQUIRE(v.rows.size() == 3);
  CHECK(v.skipped.empty());
  for (const auto& row : v.rows) {
    CHECK(std::fabs(row.simErrPct) < 1e-6);
    CHECK(row.gpusPerNode == 2);
  }
  CHECK(v.rows[2].request.opt.order == mk::TileOrder::Interleaved);
  CHECK(v.sim.n == 3);
  CHECK(v.sim.medianAbsPct < 1e-6);
  // 30 % slower than the model on every record: the fused line says so.
  for (auto& r : recs) r.timeUs *= 1.3;
  const mk::FusedValidation biased = mk::validateFused({file(recs)}, {"f.json"}, "h200x2", datasheet(), o);
  CHECK(biased.sim.medianAbsPct == doctest::Approx(100.0 * (1 - 1 / 1.3)).epsilon(1e-6));
  const json j = json::parse(mk::fusedValidationToJson(biased, 10.0));
  CHECK(j["summary"]["gate_passed"] == false);
  CHECK(j["rows"].size() == 3);
  CHECK(j["rows"][0]["op"] == "gemm-rs");
  // --op / --algo select collectives: the fused records are then left out, counted.
  o.ops = {"allreduce"};
  CHECK(mk::validateFused({file(recs)}, {"f.json"}, "h200x2", datasheet(), o).filtered == 3);
}

TEST_CASE("validate: a bad fused record is refused naming the field unless skipped") {
  auto errorFor = [](const std::function<void(mk::MeasurementRecord&)>& edit) {
    mk::MeasurementRecord r = fusedRecord("gemm-rs", "own-last");
    edit(r);
    return errorOf([&] { mk::fusedRecordRequest(r, "f.json: records[0]"); });
  };
  CHECK(contains(errorFor([](auto& r) { r.extra.erase("m"); }), "f.json: records[0]: missing field 'm'"));
  CHECK(contains(errorFor([](auto& r) { r.extra["k"] = "1004"; }), "fields m, n, k"));
  CHECK(contains(errorFor([](auto& r) { r.extra["k"] = "1004"; }), "multiple of 8"));
  CHECK(contains(errorFor([](auto& r) { r.extra.erase("order"); }), "missing field 'order'"));
  CHECK(contains(errorFor([](auto& r) { r.extra["order"] = "\"auto\""; }), "field 'order' must be own-first"));
  CHECK(contains(errorFor([](auto& r) { r.extra["ctas"] = "17"; }), "field 'ctas' 17 is not compute_ctas 12"));
  CHECK(contains(errorFor([](auto& r) { r.extra["nodes"] = "3"; }), "does not divide the record's 2 ranks"));
  CHECK(contains(errorFor([](auto& r) { r.extra["ranks_per_node"] = "1"; }), "'ranks_per_node' needs 'nodes'"));
  mk::MeasurementRecord bad = fusedRecord("gemm-rs", "own-last");
  bad.extra["k"] = "1004";
  mk::ValidationOptions o;
  o.jobs = 1;
  CHECK(contains(errorOf([&] { mk::validateFused({file({bad})}, {"f.json"}, "h200x2", datasheet(), o); }),
                 "f.json: records[0] (gemm-rs 256 x 256 x 1004)"));
  o.skipBad = true;
  const mk::FusedValidation v = mk::validateFused({file({bad})}, {"f.json"}, "h200x2", datasheet(), o);
  CHECK(v.rows.empty());
  REQUIRE(v.skipped.size() == 1);
  CHECK(contains(v.skipped[0].reason, "multiple of 8"));
}

TEST_CASE("validate: fused records are placed as they ran, ranks as nodes when they say so") {
  // Across nodes (mk-bench --ranks-per-node 1 --transport socket): 2 nodes of 1 rank, ProxyPuts between them.
  mk::MeasurementRecord r = fusedRecord("gemm-rs", "own-last");
  r.extra["nodes"] = "2";
  r.extra["ranks_per_node"] = "1";
  r.extra["transport"] = "\"socket\"";
  r.extra["processes"] = "2";
  r.extra["shared_gpu"] = "true";
  const mk::FusedRecordRequest q = mk::fusedRecordRequest(r, "f.json");
  CHECK(q.nodes == 2);
  CHECK(q.transport == "socket");
  const std::string onePerNode = R"({"schema": "mkernel.topology.v1", "name": "one-per-node", "nodes": 4,
    "node": {"gpu": "NVIDIA H200", "gpus": 1, "sms": 132, "bf16Tflops": 989, "hbmGBs": 4800,
             "nvlink": {"bwGBs": 450, "latencyUs": 0.65, "switched": false}, "pcie": {"bwGBs": 64, "latencyUs": 1.0},
             "nics": 1, "nic": {"bwGBs": 2, "latencyUs": 10}},
    "fabric": {"kind": "rail-leaf-spine", "nodesPerLeaf": 32, "oversubscription": 1, "switchLatencyUs": 0}})";
  const std::string path = "validate-fused-one-per-node.json";
  REQUIRE(writeText(path, onePerNode));
  const mk::Topology t = mk::fusedRecordTopology(path, q);
  CHECK(t.nodes == 2);
  CHECK(t.layout(2) == std::vector<uint32_t>{0, 1});
  const mk::Schedule s = mk::generate(q.spec, t.layout(2), q.opt);
  bool proxyPut = false;
  for (const auto& lanes : s.lanes)
    for (const auto& lane : lanes)
      for (const auto& st : lane.steps) proxyPut = proxyPut || st.kind == mk::StepKind::ProxyPut;
  CHECK(proxyPut);
  mk::ValidationOptions o;
  o.jobs = 1;
  r.timeUs = fusedModelUs(r, path);
  const mk::FusedValidation v = mk::validateFused({file({r})}, {"f.json"}, path, datasheet(), o);
  REQUIRE(v.rows.size() == 1);
  CHECK(std::fabs(v.rows[0].simErrPct) < 1e-6);
  // The two ranks shared one GPU: each computed on its own 16 CTAs' SMs, slower than on a GPU of its own.
  mk::MeasurementRecord alone = r;
  alone.extra["shared_gpu"] = "false";
  CHECK(fusedModelUs(alone, path) < r.timeUs);
  CHECK(v.rows[0].gpusPerNode == 1);
  // On nodes of 8 GPUs the model cannot place 1 rank per node: skipped with the reason, not dropped, not fatal.
  const mk::FusedValidation h = mk::validateFused({file({r})}, {"f.json"}, "dgx-h200", datasheet(), o);
  CHECK(h.rows.empty());
  REQUIRE(h.skipped.size() == 1);
  CHECK(contains(h.skipped[0].reason, "not priced"));
  CHECK(contains(h.skipped[0].reason, "1 per node"));
  std::remove(path.c_str());
  // Without nodes: one node. Four ranks sharing one GPU on a node of 2 GPUs are priced on a node of 4 like it;
  // four ranks that did not share one are not placed.
  mk::MeasurementRecord four = fusedRecord("gemm-ar", "own-last");
  four.ranks = 4;
  four.extra["shared_gpu"] = "true";
  const mk::Topology w = mk::fusedRecordTopology("h200x2", mk::fusedRecordRequest(four, "f.json"));
  CHECK(w.nodes == 1);
  CHECK(w.node.gpus == 4);
  four.extra["shared_gpu"] = "false";
  CHECK(contains(errorOf([&] { mk::fusedRecordTopology("h200x2", mk::fusedRecordRequest(four, "f.json")); }),
                 "4 ranks on one node"));
}
