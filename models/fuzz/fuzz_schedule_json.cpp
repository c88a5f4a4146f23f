// Fuzz target: the schedule JSON reader (scheduleFromJson). An accepted schedule must pass through the writer
// and read back with the same shape, and the validator must answer it (with mk::Error or not at all).
#include "fuzz_target.hpp"
#include "mk/schedule/io.hpp"
#include "mk/schedule/validate.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return mk::fuzz::run(data, size, [](const std::string& text) {
    const mk::Schedule s = mk::scheduleFromJson(text);
    const mk::Schedule back = mk::scheduleFromJson(mk::scheduleToJson(s, -1));
    if (back.nRanks != s.nRanks || back.stepCount() != s.stepCount() || back.buffers.size() != s.buffers.size())
      mk::fuzz::violated("fuzz_schedule_json", "the written schedule reads back differently");
    (void)mk::validate(s);
  });
}
