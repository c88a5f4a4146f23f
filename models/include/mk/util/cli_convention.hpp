// mkernel — the one command-line convention of every tool (docs/user-guide.md, "One convention"). The options
// that several tools share are defined here once, so that their names, aliases and meanings cannot drift from
// one tool to another: --op (the collective), --redop (the reduction), -d/--dtype, --bytes and --sweep with
// nccl-tests' -b/-e/-f, --root, --cluster's default, --report (an HTML folder) and --summary (a text file).
// scripts/cli_convention.tsv holds the same table and scripts/check_cli_convention.py checks every tool's
// --help against it. Header-only and for tools: it needs CLI11.
//
// Retired spellings that changed meaning (mk-bench --op for the reduction, mk-calibrate --report for a text
// file) are refused with one line naming the new flag (exit 2), not accepted with a warning: a warning scrolls
// by in a long benchmark log while the run does something else than asked, and a one-word fix is cheap.
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "mk/error.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/size.hpp"

namespace mk::cli {

/// The help text of every tool's --cluster that generates or predicts (mk-schedule, mk-sim, mk-plan); tools
/// that read measurement files default to the preset those files ran on instead.
inline std::string defaultClusterNote() {
  return std::string("default: ") + kDefaultCluster + ", the same in every tool that generates or predicts";
}

/// -d,--dtype: the element type. `ncclAlias` adds nccl-tests' long spelling --datatype (mk-bench).
inline CLI::Option* addDtypeOption(CLI::App& app, std::string& dtype, const std::string& choices, bool ncclAlias) {
  return app.add_option(ncclAlias ? "-d,--dtype,--datatype" : "-d,--dtype", dtype, "element type: " + choices)
      ->capture_default_str();
}

/// --redop: the reduction (sum, max or min). `ncclAlias` adds nccl-tests' -o (mk-bench only: elsewhere -o is free
/// and --op is the collective).
inline CLI::Option* addRedopOption(CLI::App& app, std::string& redop, const std::string& appliesTo, bool ncclAlias) {
  return app.add_option(ncclAlias ? "-o,--redop" : "--redop", redop, "reduction: sum, max or min (" + appliesTo + ")")
      ->capture_default_str();
}

/// --root: the root rank of a broadcast. `ncclAlias` adds nccl-tests' -r.
inline CLI::Option* addRootOption(CLI::App& app, uint32_t& root, bool ncclAlias) {
  return app.add_option(ncclAlias ? "-r,--root" : "--root", root, "root rank of a broadcast")->capture_default_str();
}

/// The sizes of a run: one --bytes, or a range --sweep MIN:MAX:FACTOR, or the same range by nccl-tests' -b/-e/-f.
struct SizeFlags {
  std::string sweep;
  std::string minBytes, maxBytes, factor;
};

/// Add --sweep and nccl-tests' -b,--minbytes / -e,--maxbytes / -f,--stepfactor (the --bytes option itself is the
/// tool's, bound to its own field). `sweepHelp` says what a sweep prints in this tool.
inline void addSweepOptions(CLI::App& app, SizeFlags& f, const std::string& sweepHelp) {
  app.add_option("--sweep", f.sweep,
                 "MIN:MAX:FACTOR, e.g. 8:1G:2: every size MIN, MIN*FACTOR, ... <= MAX; " + sweepHelp);
  app.add_option("-b,--minbytes", f.minBytes,
                 "smallest size of the sweep (nccl-tests' -b; with -e and -f, as --sweep)");
  app.add_option("-e,--maxbytes", f.maxBytes, "largest size of the sweep (nccl-tests' -e)");
  app.add_option("-f,--stepfactor", f.factor, "size multiplication factor of the sweep (nccl-tests' -f; default 2)");
}

/// After parse: the sweep the command line asked for as "MIN:MAX:FACTOR", "" when none. -b/-e/-f build it, a
/// bound not given taking `defaultSweep`'s ("8:512M:2" in mk-bench; one size, "1MiB:1MiB:2", in the others).
/// Throws Error(InvalidArgument) when --bytes is given with a range, or --sweep with -b/-e/-f, or a part is bad.
inline std::string resolveSweep(const CLI::App& app, const SizeFlags& f, const std::string& defaultSweep) {
  const bool nccl = app.count("--minbytes") + app.count("--maxbytes") + app.count("--stepfactor") > 0;
  const bool sweep = app.count("--sweep") > 0;
  if (sweep && nccl)
    throw Error(ErrorCode::InvalidArgument, "--sweep and -b/-e/-f both give the sizes: use one of them");
  if (app.count("--bytes") > 0 && (sweep || nccl))
    throw Error(ErrorCode::InvalidArgument,
                "--bytes gives one size and --sweep (or -b/-e/-f) a range: use one of them");
  if (sweep) {
    parseSweep(f.sweep);  // reported as "bad --sweep '...'" before anything runs
    return f.sweep;
  }
  if (!nccl) return {};
  const std::vector<std::string> def = [&] {
    std::vector<std::string> parts;
    std::string::size_type start = 0;
    for (int i = 0; i < 2; ++i) {
      const auto colon = defaultSweep.find(':', start);
      parts.push_back(defaultSweep.substr(start, colon - start));
      start = colon + 1;
    }
    parts.push_back(defaultSweep.substr(start));
    return parts;
  }();
  const std::string text = (f.minBytes.empty() ? def[0] : f.minBytes) + ":" +
                           (f.maxBytes.empty() ? def[1] : f.maxBytes) + ":" + (f.factor.empty() ? def[2] : f.factor);
  parseSweep(text, "-b/-e/-f");
  return text;
}

/// A spelling that changed meaning: still parsed (hidden from --help) so that it can be refused with a line that
/// names the new flag, instead of CLI11's bare "unknown option".
struct RetiredOption {
  std::string flag;     ///< "--op"
  std::string message;  ///< "the reduction is --redop now (nccl-tests' -o still works); --op is the collective"
  std::string value;    ///< bound by addRetiredOption
};

/// Add `r.flag` as a hidden option taking one value.
inline void addRetiredOption(CLI::App& app, RetiredOption& r) { app.add_option(r.flag, r.value)->group(""); }

/// After parse: kContinue, or exit 2 after "<tool>: error: <flag> <value>: <message>" when a retired flag was given.
inline int refuseRetired(const CLI::App& app, const char* tool, const std::vector<const RetiredOption*>& retired) {
  for (const RetiredOption* r : retired) {
    if (app.count(r->flag) == 0) continue;
    std::fprintf(stderr, "%s: error: %s %s: %s\n", tool, r->flag.c_str(), r->value.c_str(), r->message.c_str());
    return kExitBadInput;
  }
  return kContinue;
}

}  // namespace mk::cli
