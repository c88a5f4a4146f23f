// mkernel — fuzz target helpers (fuzz_target.hpp).
#include "fuzz_target.hpp"

#include <cstdio>
#include <cstdlib>

namespace mk::fuzz {

std::string& lastRejection() {
  static std::string message;
  return message;
}

void violated(const char* target, const std::string& what) {
  std::fprintf(stderr, "%s: accepted input breaks a property: %s\n", target, what.c_str());
  std::abort();
}

}  // namespace mk::fuzz
