// mkernel — what every fuzz target does: feed the bytes to one reader; mk::Error is the expected answer to bad
// input, anything else escaping (another exception, a crash, a sanitizer report) is a bug.
//
// A target may also check what it accepted: a document a reader accepts must survive its writer and be read
// back (no silent acceptance of a value the rest of mkernel cannot carry).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

#include "mk/error.hpp"

namespace mk::fuzz {

/// The last input's outcome: "" when the reader accepted it, else the mk::Error message (for the replay main).
std::string& lastRejection();

/// Run `read` on the input as text; swallow mk::Error only.
template <typename Read>
int run(const uint8_t* data, std::size_t size, Read read) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  lastRejection().clear();
  try {
    read(text);
  } catch (const Error& e) {
    // bad input, reported as such: the expected outcome
    lastRejection() = e.what();
    if (lastRejection().empty()) lastRejection() = "(empty message)";
  }
  return 0;
}

/// A property of an accepted input that does not hold: a bug, reported the way a crash is.
[[noreturn]] void violated(const char* target, const std::string& what);

}  // namespace mk::fuzz
