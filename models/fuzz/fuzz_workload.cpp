// Fuzz target: the workload reader (workloadFromJson). An accepted workload must be written and read back.
#include "fuzz_target.hpp"
#include "mk/workload/workload.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  return mk::fuzz::run(data, size, [](const std::string& text) {
    const mk::Workload w = mk::workloadFromJson(text);
    const mk::Workload back = mk::workloadFromJson(mk::workloadToJson(w, -1));
    if (back.model.layers != w.model.layers || back.training.seq != w.training.seq)
      mk::fuzz::violated("fuzz_workload", "the written workload reads back differently");
  });
}
