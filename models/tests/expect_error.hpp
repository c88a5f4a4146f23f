// mkernel tests — the one check that a call fails with a given mk::Error code and a message naming what is wrong.
#pragma once

#include <doctest/doctest.h>

#include <functional>
#include <string>
#include <vector>

#include "mk/error.hpp"

namespace mk::test {

/// Runs `fn`, expects an mk::Error with `code` whose message contains every one of `parts`.
inline void expectError(const std::function<void()>& fn, ErrorCode code, const std::vector<std::string>& parts) {
  try {
    fn();
    FAIL("expected an mk::Error(" << toString(code) << ") containing '" << (parts.empty() ? "" : parts.front())
                                  << "', got none");
  } catch (const Error& e) {
    CHECK_MESSAGE(e.code() == code, "code " << toString(e.code()) << ", message: " << e.message());
    for (const auto& p : parts)
      CHECK_MESSAGE(e.message().find(p) != std::string::npos, "'" << p << "' not in: " << e.message());
  }
}

/// The same for one expected part (a literal: a braced list picks the overload above).
inline void expectError(const std::function<void()>& fn, ErrorCode code, const char* part) {
  expectError(fn, code, std::vector<std::string>{part});
}

}  // namespace mk::test
