// Tests of the compute-beside-communication model (issue 34, item 4): a fit recovers a known phi from records made
// with it, leave-one-shape-out errors come out of records that disagree, a GPU without records borrows another's
// phi or the SM share and says so, and bad records are refused naming the field.
#include <doctest/doctest.h>

#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/plan/overlap_model.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

/// A kernel-overlap record of GEMM m x n x k beside a `ctas`-CTA copy: `alone` us alone, `beside` us beside.
MeasurementRecord overlapRecord(uint64_t m, uint64_t n, uint64_t k, uint32_t ctas, double alone, double beside) {
  MeasurementRecord r;
  r.op = "kernel-overlap";
  r.impl = "torch";
  r.dtype = "bfloat16";
  r.ranks = 1;
  r.bytes = 2 * (m * k + k * n + m * n);
  r.timeUs = beside;
  r.iters = 140;
  r.stat = "median";
  r.extra["m"] = std::to_string(m);
  r.extra["n"] = std::to_string(n);
  r.extra["k"] = std::to_string(k);
  r.extra["comm_ctas"] = std::to_string(ctas);
  r.extra["alone_us"] = std::to_string(alone);
  return r;
}

MeasurementFile overlapFile(const std::string& gpu, uint32_t sms) {
  MeasurementFile f;
  f.schema = "mkernel.measurement.v1";
  f.system["gpu"] = "\"" + gpu + "\"";
  f.system["sms"] = std::to_string(sms);
  return f;
}

/// Records made with (phi, f0) exactly: beside = alone x (1 + f0) S / (S - phi c).
MeasurementFile exactFile(double phi, double f0 = 0) {
  MeasurementFile f = overlapFile("NVIDIA H100 80GB HBM3", 132);
  const uint64_t shapes[3][3] = {{8192, 1280, 8192}, {8192, 8192, 3584}, {4096, 4096, 4096}};
  for (const auto& s : shapes)
    for (uint32_t c : {2u, 8u, 32u})
      f.records.push_back(overlapRecord(s[0], s[1], s[2], c, 500, 500 * (1 + f0) * 132.0 / (132.0 - phi * c)));
  return f;
}

}  // namespace

TEST_CASE("overlap model: the fit recovers phi, and the slowdown follows S / (S - phi c)") {
  const OverlapModel m = OverlapModel::fit({exactFile(1.5)}, {"exact.json"});
  REQUIRE(m.fits().size() == 1);
  const OverlapFit& f = m.fits().front();
  CHECK(f.gpu == "NVIDIA H100");
  CHECK(f.sms == 132);
  CHECK(f.records == 9);
  CHECK(f.shapes == 3);
  CHECK(f.phi == doctest::Approx(1.5).epsilon(1e-6));
  CHECK(f.f0 == doctest::Approx(0).epsilon(1e-6));
  CHECK(f.leaveOneShapeOut.maxAbsPct < 1e-4);
  const OverlapSlowdown s = m.slowdown("NVIDIA H100", 132, 16);
  CHECK(s.factor == doctest::Approx(132.0 / (132.0 - 24.0)));
  CHECK(s.source == "measured beside triton-persistent-copy (NVIDIA H100)");
  // Another GPU borrows the fitted phi on its own SM count, and says so.
  const OverlapSlowdown o = m.slowdown("NVIDIA H200", 100, 10);
  CHECK(o.factor == doctest::Approx(100.0 / (100.0 - 15.0)));
  CHECK(o.source == "extrapolated from NVIDIA H100 (beside triton-persistent-copy)");
  // No records at all: the SM share.
  const OverlapSlowdown none = OverlapModel{}.slowdown("NVIDIA H100", 132, 16);
  CHECK(none.factor == doctest::Approx(132.0 / 116.0));
  CHECK(none.source == "SM share (no kernel-overlap records)");
}

TEST_CASE("overlap model: a fixed cost of running beside anything is fitted with phi") {
  const OverlapModel m = OverlapModel::fit({exactFile(0.5, 0.1)}, {"f0.json"});
  const OverlapFit& f = m.fits().front();
  CHECK(f.phi == doctest::Approx(0.5).epsilon(1e-6));
  CHECK(f.f0 == doctest::Approx(0.1).epsilon(1e-6));
  CHECK(f.inSample.maxAbsPct < 1e-4);
  CHECK(m.slowdown("NVIDIA H100", 132, 16).factor == doctest::Approx(1.1 * 132.0 / 124.0));
}

TEST_CASE("overlap model: the committed H100 records, within the gate set from their run") {
  const MeasurementFile f = loadMeasurementFile(std::string(MK_MEASURED_DIR) + "/2026-12-06-h100-c29b55b-overlap.json");
  const OverlapModel m = OverlapModel::fit({f}, {"h100-overlap"});
  REQUIRE(m.fits().size() == 1);
  const OverlapFit& o = m.fits().front();
  MESSAGE("overlap model H100: phi " << o.phi << ", f0 " << o.f0 << ", " << o.records << " records of " << o.shapes
                                     << " shapes; in-sample median " << o.inSample.medianAbsPct << " % max "
                                     << o.inSample.maxAbsPct << " %; leave-one-shape-out median "
                                     << o.leaveOneShapeOut.medianAbsPct << " % max " << o.leaveOneShapeOut.maxAbsPct
                                     << " %");
  CHECK(o.records == 30);
  CHECK(o.shapes == 6);
  CHECK(o.leaveOneShapeOut.medianAbsPct < 4.0);
  CHECK(o.leaveOneShapeOut.maxAbsPct < 47);
}

TEST_CASE("overlap model: records beside a real collective kernel are fitted, the copy stand-in's left out") {
  // The stand-in at phi 0.5, the resident kernel at phi 2 (in a file of its own): the fit is the kernel's.
  MeasurementFile copy = exactFile(0.5);
  MeasurementFile engine = exactFile(2.0);
  for (auto& r : engine.records) r.extra["comm_kernel"] = "\"mkernel-resident\"";
  const OverlapModel m = OverlapModel::fit({copy, engine}, {"copy.json", "engine.json"});
  REQUIRE(m.fits().size() == 1);
  const OverlapFit& f = m.fits().front();
  CHECK(f.phi == doctest::Approx(2.0).epsilon(1e-6));
  CHECK(f.records == 9);
  CHECK(f.standInRecords == 9);
  CHECK(f.comm == "mkernel-resident");
  CHECK(f.files == std::vector<std::string>{"engine.json"});
  CHECK(m.slowdown("NVIDIA H100", 132, 16).source == "measured beside mkernel-resident (NVIDIA H100)");
  // Without the kernel's records the stand-in is fitted, as before.
  CHECK(OverlapModel::fit({copy}, {"copy.json"}).fits().front().phi == doctest::Approx(0.5).epsilon(1e-6));
}

TEST_CASE("overlap model: the committed H100 records beside our resident kernel") {
  const MeasurementFile f =
      loadMeasurementFile(std::string(MK_MEASURED_DIR) + "/2026-12-06-h100-de97c4c-overlap-engine.json");
  const OverlapModel m = OverlapModel::fit({f}, {"h100-overlap-engine"});
  REQUIRE(m.fits().size() == 1);
  const OverlapFit& o = m.fits().front();
  MESSAGE("overlap model H100 beside the engine: phi "
          << o.phi << ", f0 " << o.f0 << "; in-sample median " << o.inSample.medianAbsPct << " % max "
          << o.inSample.maxAbsPct << " %; leave-one-shape-out median " << o.leaveOneShapeOut.medianAbsPct << " % max "
          << o.leaveOneShapeOut.maxAbsPct << " %");
  CHECK(o.comm == "mkernel-resident");
  CHECK(o.records == 24);
  CHECK(o.shapes == 6);
  // The gate set from their run (the smallest GEMM, 2.4 waves of tiles, is the worst predicted from the others).
  CHECK(o.leaveOneShapeOut.medianAbsPct < 6.0);
  CHECK(o.leaveOneShapeOut.maxAbsPct < 40);
  // Beside the engine every GEMM is slower than alone, so the fit cannot be the free overlap.
  CHECK(m.slowdown("NVIDIA H100", 132, 16).factor > 1.05);
}

TEST_CASE("overlap model: a shape that disagrees shows in its leave-one-shape-out error") {
  MeasurementFile f = exactFile(1.0);
  for (uint32_t c : {2u, 8u, 32u})
    f.records.push_back(overlapRecord(1024, 1024, 1024, c, 100, 100 * 132.0 / (132.0 - 2.0 * c)));
  const OverlapModel m = OverlapModel::fit({f}, {"mixed.json"});
  const OverlapFit& fit = m.fits().front();
  CHECK(fit.shapes == 4);
  CHECK(fit.phi == doctest::Approx(1.0));      // the median of 12 records, 9 of them at 1
  CHECK(fit.leaveOneShapeOut.maxAbsPct > 10);  // the 32-CTA record of the odd shape: 1.94x measured, 1.32x predicted
}

TEST_CASE("overlap model: bad records are refused naming the file, record and field") {
  MeasurementFile f = exactFile(1.0);
  f.records[4].extra.erase("comm_ctas");
  CHECK_THROWS_WITH_AS(OverlapModel::fit({f}, {"bad.json"}),
                       doctest::Contains("bad.json: records[4].comm_ctas: missing or not a positive number"), Error);
  MeasurementFile g = exactFile(1.0);
  g.records[0].extra["comm_ctas"] = "132";
  CHECK_THROWS_WITH_AS(OverlapModel::fit({g}, {"big.json"}),
                       doctest::Contains("big.json: records[0].comm_ctas: 132 is not below the GPU's 132 SMs"), Error);
  MeasurementFile h = exactFile(1.0);
  h.system.erase("sms");
  CHECK_THROWS_WITH_AS(OverlapModel::fit({h}, {"nosms.json"}),
                       doctest::Contains("nosms.json: system.gpu and system.sms"), Error);
  CHECK_THROWS_WITH_AS(OverlapModel{}.slowdown("NVIDIA H100", 132, 132), doctest::Contains("layout.overlapSms"), Error);
}
