// Tests of the GEMM model: a fit recovers known parameters, the committed records give a model whose
// leave-one-shape-out error is reported, and prices scale with the GPU.
#include <doctest/doctest.h>

#include <cmath>
#include <filesystem>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/io/measurement.hpp"
#include "mk/plan/gemm_model.hpp"

using namespace mk;
using namespace mk::plan;

namespace {

std::vector<GemmSample> synthetic(double tflops, double c0, double hbm) {
  std::vector<GemmSample> s;
  const double shapes[][3] = {{128, 8192, 8192},  {512, 4096, 4096}, {2048, 2048, 1024}, {4096, 4096, 2048},
                              {8192, 8192, 4096}, {1000, 3000, 777}, {64, 16384, 16384}};
  for (const auto& sh : shapes) {
    const double f = 2.0 * sh[0] * sh[1] * sh[2];
    const double b = 2.0 * (1.0 * sh[0] * sh[2] + 1.0 * sh[2] * sh[1] + 1.0 * sh[0] * sh[1]);
    const double t = c0 + std::max(f / (tflops * 1e6), b / (hbm * 1e3));
    const auto m = static_cast<uint64_t>(sh[0]), n = static_cast<uint64_t>(sh[1]), k = static_cast<uint64_t>(sh[2]);
    s.push_back({m, n, k, t, "synthetic"});
    s.push_back({m, n, k, t * 1.001, "synthetic"});  // a second, slightly slower run
  }
  return s;
}

}  // namespace

TEST_CASE("gemm model: a fit on data made by a known model recovers its rate and fixed cost") {
  const GemmModel m = fitGemmModel(synthetic(700, 3.0, 4800), "test GPU", 989, 4800);
  CHECK(m.tflops == doctest::Approx(700).epsilon(0.005));
  CHECK(m.overheadUs == doctest::Approx(3.0).epsilon(0.02));
  CHECK(m.shapes == 7);
  CHECK(m.samples.size() == 14);
  CHECK(m.inSample.maxAbsPct < 0.2);
  CHECK(m.leaveOneShapeOut.maxAbsPct < 0.5);  // each shape is predicted from the others
  // Too few shapes to judge a prediction: refused.
  auto one = synthetic(700, 3, 4800);
  one.resize(2);
  CHECK_THROWS_AS(fitGemmModel(one, "x", 989, 4800), Error);
}

TEST_CASE("gemm model: prices follow the GPU's peak and HBM bandwidth, and say which bound") {
  const GemmModel m = fitGemmModel(synthetic(700, 3.0, 4800), "test GPU", 989, 4800);
  NodeSpec h200;
  h200.bf16Tflops = 989;
  h200.hbmGBs = 4800;
  NodeSpec half = h200;
  half.bf16Tflops = 494.5;
  half.hbmGBs = 2400;
  const double f = 2.0 * 8192 * 8192 * 8192, b = 2.0 * 3 * 8192.0 * 8192;
  const ComputePrice a = priceKernel(m, f, b, h200), c = priceKernel(m, f, b, half);
  CHECK_FALSE(a.memoryBound);
  CHECK((c.us - m.overheadUs) == doctest::Approx(2 * (a.us - m.overheadUs)));
  const ComputePrice mem = priceKernel(m, 2.0 * 1 * 8192 * 8192, 2.0 * 8192 * 8192, h200);  // a GEMV: memory-bound
  CHECK(mem.memoryBound);
  CHECK(mem.us == doctest::Approx(m.overheadUs + 2.0 * 8192 * 8192 / 4.8e6));
}

TEST_CASE("gemm model: the committed cuBLAS records on H200 give a model and its measured error") {
  std::vector<MeasurementFile> files;
  std::vector<std::string> names;
  for (const auto& e : std::filesystem::directory_iterator(MK_MEASURED_DIR))
    if (e.path().extension() == ".json") {
      files.push_back(loadMeasurementFile(e.path().string()));
      names.push_back(e.path().filename().string());
    }
  const auto samples = gemmSamples(files, names, "NVIDIA H200");
  REQUIRE(samples.size() >= 20);
  const NodeSpec ref = presetNodeOfGpu("NVIDIA H200");
  const GemmModel m = fitGemmModel(samples, "NVIDIA H200", ref.bf16Tflops, ref.hbmGBs);
  CHECK(m.shapes >= 5);
  CHECK(m.tflops > 400);
  CHECK(m.tflops < ref.bf16Tflops);
  CHECK(m.overheadUs >= 0);
  CHECK(m.overheadUs < 20);
  // The number the report shows as the GEMMs' confidence: about 10 % with these records.
  CHECK(m.leaveOneShapeOut.n == samples.size());
  CHECK(m.leaveOneShapeOut.medianAbsPct < 20);
  CHECK(m.leaveOneShapeOut.medianAbsPct >= m.inSample.medianAbsPct * 0.5);
  CHECK_THROWS_AS(presetNodeOfGpu("NVIDIA B200"), Error);
}
