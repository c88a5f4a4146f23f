// Fuzz target: the hardware profile reader (profileFromJson). An accepted profile must be written and read back.
#include "fuzz_target.hpp"
#include "mk/cost/profile_io.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return mk::fuzz::run(data, size, [](const std::string& text) {
    mk::ProfileProvenance prov;
    const mk::Profile p = mk::profileFromJson(text, &prov);
    const mk::Profile back = mk::profileFromJson(mk::profileToJson(p, prov, -1));
    if (back.network.bwGBs != p.network.bwGBs || back.gemmTflops != p.gemmTflops ||
        back.attentionTflops != p.attentionTflops)
      mk::fuzz::violated("fuzz_profile", "the written profile reads back differently");
  });
}
