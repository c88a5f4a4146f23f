// The host log's level parsing (MK_LOG): the values the user guide documents, and everything else off.
#include <doctest/doctest.h>

#include "engine/host_log.hpp"

using mk::runtime::LogLevel;
using mk::runtime::parseLogLevel;

TEST_CASE("host log: MK_LOG values select a level, anything else is off") {
  CHECK(parseLogLevel(nullptr) == LogLevel::Off);
  CHECK(parseLogLevel("") == LogLevel::Off);
  CHECK(parseLogLevel("info") == LogLevel::Info);
  CHECK(parseLogLevel("INFO") == LogLevel::Info);
  CHECK(parseLogLevel("1") == LogLevel::Info);
  CHECK(parseLogLevel("debug") == LogLevel::Debug);
  CHECK(parseLogLevel("Debug") == LogLevel::Debug);
  CHECK(parseLogLevel("2") == LogLevel::Debug);
  CHECK(parseLogLevel("verbose") == LogLevel::Off);
  CHECK(parseLogLevel("info ") == LogLevel::Off);
  CHECK(parseLogLevel("inf") == LogLevel::Off);
  CHECK(parseLogLevel("debugging") == LogLevel::Off);
}
