// Helpers the models tests share.
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
    FAIL("expected an mk::Error(" << std::string(toString(code)) << ") containing '"
                                  << (parts.empty() ? "" : parts.front()) << "', got none");
  } catch (const Error& e) {
    CHECK_MESSAGE(e.code() == code, "code " << std::string(toString(e.code())) << ", message: " << e.message());
    for (const auto& p : parts)
      CHECK_MESSAGE(e.message().find(p) != std::string::npos, "'" << p << "' not in: " << e.message());
  }
}

/// expectError with one expected part.
inline void expectError(const std::function<void()>& fn, ErrorCode code, const char* part) {
  expectError(fn, code, std::vector<std::string>{part});
}

}  // namespace mk::test
