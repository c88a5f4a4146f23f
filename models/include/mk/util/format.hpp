// mkernel — printf-style formatting into a std::string: the one helper for the tools' and libraries' formatted
// numbers, instead of snprintf into fixed buffers (which truncate silently when a name is long).
#pragma once

#include <string>

namespace mk {

/// `fmt` with printf's rules applied to the arguments, as a string of whatever length it needs.
std::string strprintf(const char* fmt, ...) __attribute__((format(printf, 1, 2)));

}  // namespace mk
