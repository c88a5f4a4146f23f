// mkernel — the host side's diagnostic log: what a communicator is doing, on stderr, when MK_LOG asks for it.
//
//   MK_LOG=info    creation (bootstrap, allocations, each resident kernel's launch and roll call), the stream
//                  hand-off chosen per rank, shutdown
//   MK_LOG=debug   also every op: submission, doorbell, the stream wait
//
// The variable is read once per process (first use); afterwards a disabled level costs one compare. Lines look
// like "mkernel[1234] +12.345 ms rank 0: launching the resident kernel on GPU 1 (133 CTAs x 512 threads)".
// What it is for: seeing where a run stands when it does not return (a tool that serialises kernels, a peer
// that never arrives) without a debugger.
#pragma once

#include <string>

namespace mk {
namespace runtime {

enum class LogLevel : int { Off = 0, Info = 1, Debug = 2 };

/// The level MK_LOG selects ("info", "debug", else off), parsed once per process.
LogLevel logLevel();

/// True when messages of `level` are printed.
inline bool logOn(LogLevel level) { return static_cast<int>(logLevel()) >= static_cast<int>(level); }

/// Parse an MK_LOG value: "info" / "debug" (any case), "1" = info, "2" = debug, anything else off.
LogLevel parseLogLevel(const char* value);

/// Print one line (prefix: pid, milliseconds since the first log call, and `who` when not empty).
void logLine(const std::string& who, const std::string& message);

}  // namespace runtime
}  // namespace mk

/// Log `msg` (an expression building a std::string, evaluated only when the level is on).
#define MK_LOG_AT(level, who, msg)                                                                  \
  do {                                                                                              \
    if (::mk::runtime::logOn(::mk::runtime::LogLevel::level)) ::mk::runtime::logLine((who), (msg)); \
  } while (0)
