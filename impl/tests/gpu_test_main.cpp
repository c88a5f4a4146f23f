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

#include "mk/device_info.hpp"

#ifndef MK_TEST_MIN_GPUS
#define MK_TEST_MIN_GPUS 1
#endif

namespace {

/// Counts the test cases that started: a rank process re-launched for one case (multiprocess_launch.hpp) whose
/// filter matched nothing must fail, not pass having run nothing.
int gCasesStarted = 0;

struct CaseCounter : doctest::IReporter {
  explicit CaseCounter(const doctest::ContextOptions&) {}
  void report_query(const doctest::QueryData&) override {}
  void test_run_start() override {}
  void test_run_end(const doctest::TestRunStats&) override {}
  void test_case_start(const doctest::TestCaseData&) override { ++gCasesStarted; }
  void test_case_reenter(const doctest::TestCaseData&) override {}
  void test_case_end(const doctest::CurrentTestCaseStats&) override {}
  void test_case_exception(const doctest::TestCaseException&) override {}
  void subcase_start(const doctest::SubcaseSignature&) override {}
  void subcase_end() override {}
  void log_assert(const doctest::AssertData&) override {}
  void log_message(const doctest::MessageData&) override {}
  void test_case_skipped(const doctest::TestCaseData&) override {}
};
REGISTER_LISTENER("case-counter", 1, CaseCounter);

}  // namespace

int main(int argc, char** argv) {
  // The engine's resident kernel never returns: a kernel loaded lazily (on first launch) while it runs
  // would wait for the device to go idle. Load every module at start-up (docs/gpu-engine.md).
  setenv("CUDA_MODULE_LOADING", "EAGER", 0);
  bool listing = false;
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "-list-") || std::strstr(argv[i], "-ltc") || std::strstr(argv[i], "-lts") ||
        std::strcmp(argv[i], "-h") == 0 || std::strstr(argv[i], "-help") || std::strstr(argv[i], "-count"))
      listing = true;
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
  // A re-launched rank (RANK and MASTER_PORT set by execRanks) must have run the one case it was started for.
  if (!listing && rc == 0 && gCasesStarted == 0 && std::getenv("RANK") != nullptr &&
      std::getenv("MASTER_PORT") != nullptr) {
    std::printf("FAIL: this rank process was started for one test case, and its filter matched none\n");
    return 3;
  }
  return rc;
}
