// doctest main for GPU test binaries: listing works anywhere; running needs enough CUDA devices.
//
// Without them the binary prints why and exits 77, which CTest reports as "skipped" (SKIP_RETURN_CODE).
// A GPU test never passes without running.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>

#include "doctest_case_counter.hpp"  // cmake/: gCasesStarted, isListing
#include "mk/device_info.hpp"

#ifndef MK_TEST_MIN_GPUS
#define MK_TEST_MIN_GPUS 1
#endif

int main(int argc, char** argv) {
  // The engine's resident kernel never returns: a kernel loaded lazily (on first launch) while it runs
  // would wait for the device to go idle. Load every module at start-up (docs/gpu-engine.md).
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  const bool listing = mk_test::isListing(argc, argv);
  if (!listing) {
    std::string why;
    const int n = mk::cudaDeviceCountOrZero(&why);
    if (n < MK_TEST_MIN_GPUS) {
      std::printf("SKIP: needs %d CUDA device(s), found %d%s%s\n", MK_TEST_MIN_GPUS, n, why.empty() ? "" : ": ",
                  why.c_str());
      return 77;
    }
  }
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  // A re-launched rank (RANK and MASTER_PORT set by execRanks) must have run the one case it was started for, and
  // CTest's run of one test file (--source-file) at least one case.
  if (!listing && rc == 0 && mk_test::gCasesStarted == 0) {
    std::printf("FAIL: no test case matched the filters given: nothing ran\n");
    return 3;
  }
  return rc;
}
