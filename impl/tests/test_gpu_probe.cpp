#include <doctest/doctest.h>

#include "mk/algorithms/algorithms.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule_probe.hpp"

TEST_CASE("gpu: packed schedules decode identically on the device") {
  for (const char* algo : {"ring", "one-shot", "hierarchical"}) {
    mk::CollectiveSpec spec;
    spec.op = mk::CollOp::AllReduce;
    spec.algo = mk::requireAlgorithm(spec.op, algo);
    spec.count = 1021;
    mk::GenOptions opt;
    opt.chunks = 3;
    const auto s = mk::generate(spec, {0, 0, 0, 0, 1, 1, 1, 1}, opt);
    const auto image = mk::pack(s);
    const mk::PackedDigest host = mk::digestOnHost(image);
    const mk::PackedDigest dev = mk::digestOnDevice(image, 0);
    CAPTURE(algo);
    CHECK(host.laneSteps == s.stepCount());
    CHECK(dev == host);
  }
}
