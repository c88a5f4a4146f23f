#include "mk/util/format.hpp"

#include <cstdarg>
#include <cstdio>

namespace mk {

std::string strprintf(const char* fmt, ...) {
  va_list args;
  va_start(args, fmt);
  va_list again;
  va_copy(again, args);
  const int n = std::vsnprintf(nullptr, 0, fmt, args);
  va_end(args);
  std::string s;
  if (n > 0) {
    s.resize(static_cast<std::size_t>(n) + 1);
    std::vsnprintf(s.data(), s.size(), fmt, again);
    s.resize(static_cast<std::size_t>(n));
  }
  va_end(again);
  return s;
}

}  // namespace mk
