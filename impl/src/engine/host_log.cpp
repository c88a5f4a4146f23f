// mkernel — the host side's diagnostic log (host_log.hpp).
#include "engine/host_log.hpp"

#include <unistd.h>

#include <cctype>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <mutex>

namespace mk {
namespace runtime {
namespace {

std::chrono::steady_clock::time_point logEpoch() {
  static const auto t0 = std::chrono::steady_clock::now();
  return t0;
}

bool sameWord(const char* a, const char* b) {
  for (; *a && *b; ++a, ++b)
    if (std::tolower(static_cast<unsigned char>(*a)) != *b) return false;
  return *a == 0 && *b == 0;
}

}  // namespace

LogLevel parseLogLevel(const char* value) {
  if (value == nullptr) return LogLevel::Off;
  if (sameWord(value, "info") || sameWord(value, "1")) return LogLevel::Info;
  if (sameWord(value, "debug") || sameWord(value, "2")) return LogLevel::Debug;
  return LogLevel::Off;
}

LogLevel logLevel() {
  static const LogLevel level = [] {
    logEpoch();
    return parseLogLevel(std::getenv("MK_LOG"));
  }();
  return level;
}

void logLine(const std::string& who, const std::string& message) {
  static std::mutex m;
  const double ms = std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - logEpoch()).count();
  std::lock_guard<std::mutex> lock(m);
  std::fprintf(stderr, "mkernel[%d] +%.3f ms %s%s%s\n", static_cast<int>(::getpid()), ms, who.c_str(),
               who.empty() ? "" : ": ", message.c_str());
  std::fflush(stderr);
}

}  // namespace runtime
}  // namespace mk
