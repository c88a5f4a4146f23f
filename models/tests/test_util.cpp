#include <doctest/doctest.h>

#include <string>

#include "mk/error.hpp"
#include "mk/util/size.hpp"

namespace {
void requireBadSize(const char* text, const char* why) {
  try {
    mk::parseSize(text);
    FAIL("accepted '" << text << "'");
  } catch (const mk::Error& e) {
    CHECK(e.code() == mk::ErrorCode::InvalidArgument);
    CHECK_MESSAGE(std::string(e.what()).find(why) != std::string::npos, e.what());
  }
}
}  // namespace

TEST_CASE("size: plain numbers and binary suffixes") {
  CHECK(mk::parseSize("8") == 8);
  CHECK(mk::parseSize("1048573") == 1048573);
  CHECK(mk::parseSize("1K") == 1024);
  CHECK(mk::parseSize("1KiB") == 1024);
  CHECK(mk::parseSize("64k") == 65536);
  CHECK(mk::parseSize("1MiB") == 1048576);
  CHECK(mk::parseSize("512M") == 512ull << 20);
  CHECK(mk::parseSize("1G") == 1ull << 30);
  CHECK(mk::parseSize("2GB") == 2ull << 30);
  CHECK(mk::parseSize("1T") == 1ull << 40);
  CHECK(mk::parseSize("0") == 0);
  CHECK(mk::parseSize("17B") == 17);
}

TEST_CASE("size: negative fractional garbage and overflowing sizes are rejected") {
  requireBadSize("-1", "negative");
  requireBadSize("", "empty");
  requireBadSize("abc", "no digits");
  requireBadSize("1.5G", "fractions");
  requireBadSize("12Q", "unknown suffix");
  requireBadSize("99999999999999999999", "too large");
  requireBadSize("20000000000T", "too large");
}

TEST_CASE("size: formatSize picks the largest exact binary unit") {
  CHECK(mk::formatSize(1048576) == "1 MiB");
  CHECK(mk::formatSize(1048573) == "1048573 B");
  CHECK(mk::formatSize(3072) == "3 KiB");
  CHECK(mk::formatSize(0) == "0 B");
  CHECK(mk::formatSize(1ull << 30) == "1 GiB");
}

TEST_CASE("error: what() carries the code name and the message") {
  const mk::Error e(mk::ErrorCode::Timeout, "rank 1 lane 0 waited for flag 3");
  CHECK(std::string(e.what()) == "timeout: rank 1 lane 0 waited for flag 3");
  CHECK(e.message() == "rank 1 lane 0 waited for flag 3");
  CHECK(e.code() == mk::ErrorCode::Timeout);
  CHECK(std::string(mk::toString(mk::ErrorCode::InvalidSchedule)) == "invalid-schedule");
}
