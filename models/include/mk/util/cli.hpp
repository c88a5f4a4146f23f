// mkernel — what every command-line tool does the same way: parse, reject zero counts, and turn errors into
// one line and an exit code. Header-only and for tools: it needs CLI11 (Debian libcli11-dev).
//
// Exit codes shared by all tools: 0 success, 1 the job failed (verification failed, internal error), 2 bad input
// (a request above --max-memory included), 3 no GPU (a GPU tool on a machine without a usable NVIDIA GPU), 4 the
// NVIDIA driver is too old for this build, 5 out of memory (an allocation failed although the estimate passed).
#pragma once

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <functional>
#include <initializer_list>
#include <new>
#include <string>
#include <utility>

#include "mk/error.hpp"
#include "mk/resources.hpp"
#include "mk/util/progress.hpp"
#include "mk/util/size.hpp"

namespace mk::cli {

inline constexpr int kExitFailed = 1;
inline constexpr int kExitBadInput = 2;
inline constexpr int kExitNoGpu = 3;
inline constexpr int kExitDriverTooOld = 4;
inline constexpr int kExitOutOfMemory = 5;
inline constexpr int kContinue = -1;

/// Whether `text` is a finite decimal number (no hex, nan, inf or overflow), stored in `*value`: the one reading
/// of a number typed on the command line, shared by the numeric flags and the gate thresholds.
inline bool decimalNumber(const std::string& text, double* value) {
  if (text.empty() || text.find_first_of("xXpP") != std::string::npos) return false;
  char* end = nullptr;
  errno = 0;
  const double v = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size() || !std::isfinite(v) || errno == ERANGE) return false;
  *value = v;
  return true;
}

/// What is wrong with the text of a numeric option of CLI11 type `type` ("UINT", "INT", "FLOAT"), or "" when
/// nothing is. CLI11 alone wraps 18446744073709551616 to 0 in a 64-bit option and takes nan, inf and 1e400 as
/// doubles; every spelling is judged here, on the text, before any conversion.
inline std::string numberTextProblem(const std::string& type, const std::string& text) {
  const std::string shown = text.size() > 40 ? text.substr(0, 40) + "..." : text;
  const bool isUint = type == "UINT";
  if (isUint || type == "INT") {
    const std::size_t first = (!isUint && !text.empty() && text[0] == '-') ? 1 : 0;
    bool digits = text.size() > first;
    for (std::size_t i = first; i < text.size(); ++i) digits = digits && text[i] >= '0' && text[i] <= '9';
    const char* rule = isUint ? "a whole number >= 0 that fits 64 bits" : "a whole number that fits 64 bits";
    if (!digits) return std::string("must be ") + rule + ", got '" + shown + "'";
    errno = 0;
    if (isUint)
      (void)std::strtoull(text.c_str(), nullptr, 10);
    else
      (void)std::strtoll(text.c_str(), nullptr, 10);
    if (errno == ERANGE) return std::string("must be ") + rule + ", got '" + shown + "'";
    return {};
  }
  double v = 0;
  if (type == "FLOAT" && !decimalNumber(text, &v)) return "must be a finite number, got '" + shown + "'";
  return {};
}

/// `text` on one line: a newline, carriage return or tab as \n, \r, \t, any other control byte (and DEL) as
/// \xNN. Every error line a tool prints goes through it, so that a value echoed from the user (--op $'all\nreduce')
/// can neither break the one-line rule nor forge a second line.
inline std::string oneLine(const std::string& text) {
  std::string out;
  out.reserve(text.size());
  for (const char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n') {
      out += "\\n";
    } else if (c == '\r') {
      out += "\\r";
    } else if (c == '\t') {
      out += "\\t";
    } else if (u < 0x20 || u == 0x7f) {
      static const char kHex[] = "0123456789abcdef";
      out += "\\x";
      out += kHex[u >> 4];
      out += kHex[u & 15];
    } else {
      out += c;
    }
  }
  return out;
}

/// Attach the numeric text check to every UINT, INT and FLOAT option of `app` and its subcommands.
inline void checkNumberTexts(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    const std::string type = opt->get_type_name();
    if (type != "UINT" && type != "INT" && type != "FLOAT") continue;
    opt->check(CLI::Validator([type](std::string& text) { return numberTextProblem(type, text); }, "", "mk-number"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) checkNumberTexts(*sub);
}

/// Refuse an empty value on every option of `app` (and its subcommands) that takes one, positionals included:
/// `--out ''` (an unset shell variable) once meant "not given" and silently dropped an output or an input. No
/// option of any tool gives "" a meaning ("none" is the word where one may be switched off).
inline void checkNonEmptyValues(CLI::App& app) {
  for (CLI::Option* opt : app.get_options()) {
    if (opt->get_type_size() == 0) continue;  // a flag
    opt->check(CLI::Validator(
        [](std::string& text) -> std::string {
          return text.empty() ? "must not be empty (give a value, or leave the option out for its default)" : "";
        },
        "", "mk-non-empty"));
  }
  for (CLI::App* sub : app.get_subcommands([](CLI::App*) { return true; })) checkNonEmptyValues(*sub);
}

/// Parse argv. Returns kContinue, or the exit code after printing help (0) or one error line (2).
inline int parse(CLI::App& app, int argc, char** argv, const char* tool) {
  checkNumberTexts(app);
  checkNonEmptyValues(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::CallForHelp& e) {
    return app.exit(e);
  } catch (const CLI::ParseError& e) {
    std::fprintf(stderr, "%s: error: %s (see --help)\n", tool, oneLine(e.what()).c_str());
    return kExitBadInput;
  }
  return kContinue;
}

/// In a run where only the options named in `kept` mean something (mk-schedule --schedule F: the file says what
/// the schedule is), any other option given is refused rather than silently ignored: "<tool>: error: --ranks
/// <why>; leave it out" (exit 2). `why` reads e.g. "is ignored with --schedule (the file is the schedule)".
inline int refuseOthers(const CLI::App& app, const char* tool, std::initializer_list<const char*> kept,
                        const std::string& why) {
  for (const CLI::Option* opt : app.get_options()) {
    if (opt->count() == 0) continue;
    bool keep = false;
    for (const char* name : kept) keep = keep || opt->check_name(name);
    if (keep) continue;
    std::fprintf(stderr, "%s: error: %s %s; leave it out\n", tool, opt->get_name(false, true).c_str(), why.c_str());
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
        double v = 0;
        if (decimalNumber(text, &v) && v >= 0 && v <= 100) return {};
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

/// The resource options every tool that generates, verifies or simulates shares: --max-memory and --progress.
struct GuardArgs {
  std::string maxMemoryText;  ///< as given; empty: the default
  bool progress = false;
  /// The limit in bytes: --max-memory, or mk::defaultMaxMemory() (half of the physical memory).
  uint64_t maxMemory() const { return maxMemoryText.empty() ? defaultMaxMemory() : parseSize(maxMemoryText); }
  /// Whether to print progress lines (--progress, or stderr is a terminal).
  bool progressWanted() const noexcept { return mk::progressWanted(progress); }
};

/// Add --max-memory SIZE alone to `app`, bound to `g.maxMemoryText`, with `what` saying what the limit bounds (a tool
/// that prints no progress: mk-plan, mk-proxy-bench). Returns the option.
inline CLI::Option* addMaxMemoryOption(CLI::App& app, GuardArgs& g,
                                       const std::string& what =
                                           "refuse (exit 2) a job whose estimated memory "
                                           "(schedule, verification, simulation) is above SIZE") {
  return app
      .add_option("--max-memory", g.maxMemoryText,
                  what + " (e.g. 8G, 512MiB; default: half of this machine's physical memory, " +
                      formatBytes(static_cast<double>(defaultMaxMemory())) + ")")
      ->check(CLI::Validator(
          [](std::string& text) -> std::string {
            try {
              if (parseSize(text) == 0) return "must be > 0";
            } catch (const Error& e) {
              return e.message();
            }
            return {};
          },
          ""))
      ->type_name("SIZE");
}

/// Add --max-memory SIZE and --progress to `app`, bound to `g`.
inline void addGuardOptions(CLI::App& app, GuardArgs& g) {
  addMaxMemoryOption(app, g);
  app.add_flag("--progress", g.progress,
               "print progress lines on stderr for work longer than 2 s (default: only when stderr is a terminal)");
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

/// Run the tool's body; an escaping error becomes one stderr line and exitCodeFor(its code); an allocation failure
/// (std::bad_alloc) exits 5 with a plain "out of memory" line; anything else that is not an mk::Error exits 1.
inline int run(const char* tool, const std::function<int()>& body) {
  try {
    return body();
  } catch (const Error& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", tool, oneLine(e.what()).c_str());
    return exitCodeFor(e.code());
  } catch (const std::bad_alloc&) {
    // Below the estimate's resolution (or another process took the memory): say so plainly, never "std::bad_alloc".
    std::fflush(stdout);
    std::fprintf(stderr,
                 "%s: error: out of memory: an allocation failed; ask for less (fewer ranks, chunks, channels or "
                 "bytes) or free memory\n",
                 tool);
    return kExitOutOfMemory;
  } catch (const std::exception& e) {
    std::fflush(stdout);
    std::fprintf(stderr, "%s: error: %s\n", tool, oneLine(e.what()).c_str());
    return kExitFailed;
  }
}

}  // namespace mk::cli
