// doctest's implementation and main(), compiled once (the mk_doctest_main object library, MkTesting.cmake) and
// linked into every CPU test binary. With the forced prelude (cmake/doctest_prelude.hpp) doctest.h is already
// included once: define the macro so this re-inclusion compiles the implementation.
#define DOCTEST_CONFIG_IMPLEMENT
#include <doctest/doctest.h>

#include <cstdio>

#include "doctest_case_counter.hpp"

int main(int argc, char** argv) {
  doctest::Context ctx(argc, argv);
  const int rc = ctx.run();
  if (ctx.shouldExit()) return rc;
  // CTest runs one test file per test (--source-file): a filter that matches no case is a failure, never a pass.
  if (rc == 0 && mk_test::gCasesStarted == 0 && !mk_test::isListing(argc, argv)) {
    std::printf("FAIL: no test case matched the filters given (%s ...): nothing ran\n", argc > 1 ? argv[1] : "");
    return 3;
  }
  return rc;
}
