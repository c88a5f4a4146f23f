// Fuzz target: the measurement file reader (parseMeasurementFile). An accepted file must be written and read back.
#include "fuzz_target.hpp"
#include "mk/io/measurement.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return mk::fuzz::run(data, size, [](const std::string& text) {
    const mk::MeasurementFile f = mk::parseMeasurementFile(text, "fuzz.json");
    const mk::MeasurementFile back = mk::parseMeasurementFile(mk::measurementFileToJson(f), "fuzz.json");
    if (back.records.size() != f.records.size())
      mk::fuzz::violated("fuzz_measurement", "the written file reads back differently");
  });
}
