// The committed measurements (validation/data/measured) keep the measurement-file contract
// (mk/io/measurement.hpp, tested on its own in models/tests/test_measurement.cpp).
#include <doctest/doctest.h>

#include <filesystem>

#include "mk/io/measurement.hpp"

TEST_CASE("measurement: every committed measurement file keeps the contract") {
  namespace fs = std::filesystem;
  int files = 0;
  for (const auto& entry : fs::recursive_directory_iterator(MK_MEASURED_DIR)) {
    if (entry.path().extension() != ".json") continue;
    ++files;
    CAPTURE(entry.path().string());
    const auto f = mk::loadMeasurementFile(entry.path().string());
    CHECK(f.commit.size() >= 7);
    CHECK(!f.records.empty());
    for (const auto& r : f.records) CHECK(r.timeUs > 0);
  }
  CHECK(files > 0);
}
