// mkernel — what every command-line tool does the same way: parse, reject zero counts, and turn errors into
// one line and an exit code. Header-only and for tools: it needs CLI11 (Debian libcli11-dev).
//
// Exit codes shared by all tools: 0 success, 1 the job failed (verification failed, internal error), 2 bad input,
// 3 no GPU (a GPU tool on a machine without a usable NVIDIA GPU), 4 the NVIDIA driver is too old for this build.
#pragma once

#include <CLI/CLI.hpp>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <string>
#include <utility>

#include "mk/error.hpp"

namespace mk::cli {

inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitNoGpu = 3;
inline constexpr int kExitDriverTooOld = 4;
inline constexpr int kContinue = -1;

/// Parse argv. Returns kContinue, or the exit code after printing help (0) or one error line (2).
inline int parse(CLI::App& app, int argc, char** argv, const char* tool) {
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", tool, e.what());
    return kExitBadInput;
  }
  return kContinue;
}

/// Options that count something must not be given as 0: "<tool>: error: --ranks must be >= 1" (exit 2).
inline int requirePositive(const CLI::App& app, const char* tool,
                           std::initializer_list<std::pair<const char*, uint64_t>> options) {
  for (const auto& [name, value] : options) {
    if (app.count(name) && value == 0) {
      std::fprintf(stderr, "%s: error: %s must be >= 1\n", tool, name);
      return kExitBadInput;
    }
  }
  return kContinue;
}

/// A gate threshold in percent: a finite number in [0, 100], checked on the text so that no spelling (nan, inf,
/// 1e308, -1, abc) can switch a gate off. CLI11 names the flag: "--max-median-err: must be ...".
inline CLI::Validator percentThreshold() {
  return CLI::Validator(
      [](std::string& text) -> std::string {
        char* end = nullptr;
        const double v = std::strtod(text.c_str(), &end);
        if (!text.empty() && end == text.c_str() + text.size() && std::isfinite(v) && v >= 0 && v <= 100) return {};
        const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
        return "must be a finite number in [0, 100] (percent), got '" + shown + "'";
      },
      "PERCENT in [0, 100]");
}

/// The command line as typed, `tool` first, quoted where a word has a space (for provenance and reports).
inline std::string commandLine(const char* tool, int argc, char** argv) {
  std::string s = tool;
  for (int i = 1; i < argc; ++i) {
    const std::string w = argv[i];
    s += w.find(' ') == std::string::npos ? " " + w : " '" + w + "'";
  }
  return s;
}

/// The exit code of a tool whose body threw `code`: no GPU 3, driver too old 4, internal errors and deadlocks 1,
/// everything else (the input) 2.
inline int exitCodeFor(ErrorCode code) noexcept {
  switch (code) {
    case ErrorCode::NoDevice: return kExitNoGpu;
    case ErrorCode::DriverTooOld: return kExitDriverTooOld;
    case ErrorCode::Internal:
    case ErrorCode::Deadlock: return kExitFailed;
    default: return kExitBadInput;
  }
}

/// Run the tool's body; an escaping error becomes one stderr line and exitCodeFor(its code); anything else that is
/// not an mk::Error exits 1.
inline int run(const char* tool, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return exitCodeFor(e.code());
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", tool, e.what());
    return kExitFailed;
  }
}

}  // namespace mk::cli
