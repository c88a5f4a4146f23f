// A doctest listener that counts the test cases a run started, for the test mains (cmake/doctest_main.cpp,
// impl/tests/gpu_test_main.cpp): a run whose filter matched nothing must fail, not pass having run nothing. CTest
// runs every test file of a binary as one test (`--source-file=*/<file>`, cmake/MkTesting.cmake), so a filter that
// stopped matching would otherwise turn the file's tests into a pass. Include it in exactly one translation unit
// of a binary, after doctest.h.
#pragma once

#include <cstring>

namespace mk_test {

/// Test cases started by this run.
inline int gCasesStarted = 0;

/// True when the arguments ask doctest to list, count or explain instead of running tests.
inline bool isListing(int argc, char** argv) {
  for (int i = 1; i < argc; ++i)
    if (std::strstr(argv[i], "-list-") || std::strstr(argv[i], "-ltc") || std::strstr(argv[i], "-lts") ||
        std::strcmp(argv[i], "-h") == 0 || std::strstr(argv[i], "-help") || std::strstr(argv[i], "-count") ||
        std::strstr(argv[i], "-version"))
      return true;
  return false;
}

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

}  // namespace mk_test
