// The text check every numeric flag of every tool goes through (mk::cli::numberTextProblem, mk/util/cli.hpp).
#include <doctest/doctest.h>

#include <string>

#include "mk/util/cli.hpp"

TEST_CASE("cli: numeric flag text that CLI11 alone would wrap or accept is refused") {
  using mk::cli::numberTextProblem;
  for (const char* ok : {"0", "1", "4294967296", "18446744073709551615"}) {
    CAPTURE(ok);
    CHECK(numberTextProblem("UINT", ok).empty());
  }
  for (const char* bad :
       {"18446744073709551616", "18446744073709551617", "-1", "1e3", "0x10", "abc", "", "nan", "+1"}) {
    CAPTURE(bad);
    CHECK(numberTextProblem("UINT", bad).find("must be a whole number >= 0 that fits 64 bits") == 0);
  }
  CHECK(numberTextProblem("INT", "-9223372036854775808").empty());
  CHECK(!numberTextProblem("INT", "-9223372036854775809").empty());
  for (const char* ok : {"0", "-1.5", "2.5e3", "1e-300"}) {
    CAPTURE(ok);
    CHECK(numberTextProblem("FLOAT", ok).empty());
  }
  for (const char* bad : {"nan", "inf", "-inf", "1e400", "abc", "", "1.5x", "0x10", "0x1p4"}) {
    CAPTURE(bad);
    CHECK(numberTextProblem("FLOAT", bad).find("must be a finite number") == 0);
  }
  // Long text is cut in the message.
  CHECK(numberTextProblem("UINT", std::string(500, '9')).size() < 120);
  // The gate thresholds read their text the same way: a hex spelling cannot slip past [0, 100].
  double v = 0;
  CHECK(!mk::cli::decimalNumber("0x10", &v));
  CHECK(mk::cli::decimalNumber("12.5", &v));
  CHECK(v == 12.5);
  // Other option types are left to their own validators.
  CHECK(numberTextProblem("TEXT", "nan").empty());
}
