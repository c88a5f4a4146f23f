// Fuzz target: the packed binary schedule reader (unpack). An accepted image must pack again to an image that
// unpacks to the same shape.
#include "fuzz_target.hpp"
#include "mk/schedule/pack.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return mk::fuzz::run(data, size, [](const std::string& bytes) {
    const mk::Schedule s = mk::unpack(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
    const mk::Schedule back = mk::unpack(mk::pack(s));
    if (back.nRanks != s.nRanks || back.stepCount() != s.stepCount() || back.buffers.size() != s.buffers.size())
      mk::fuzz::violated("fuzz_schedule_packed", "the repacked image reads back differently");
  });
}
