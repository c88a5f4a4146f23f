// mk-bench — the collective benchmark's command line (mk-bench allreduce ...), host-only: no CUDA header, so that
// the CPU build compiles it and checks it against the CLI convention (mk-bench-cli, scripts/cli_convention.tsv).
#pragma once

#include <CLI/CLI.hpp>

#include <cstdint>
#include <string>

#include "mk/util/cli_convention.hpp"

namespace mkbench {

/// What `mk-bench <collective>` was asked to do.
struct Args {
  std::string op;  ///< the collective (positional, or --op)
  std::string opFlag;
  std::string bytes;
  mk::cli::SizeFlags sizes;
  std::string sweep;  ///< MIN:MAX:FACTOR after finishArgs (kDefaultSweep when no size was given)
  std::string dtype = "float32", redop = "sum";
  std::string algo = "auto";
  std::string baseline;
  bool check = false, inPlace = false;
  std::string json, trace;
  uint64_t iters = 100, warmup = 20, reps = 5;
  int gpus = 0;
  uint32_t root = 0, chunks = 0, channels = 0;
  uint32_t workers = 0, threads = 512;
  uint64_t latencyProbes = 200;
  std::string link;
  std::string profile;
  uint32_t ranksPerNode = 0;
  std::string transport = "auto";
  std::string protocol = "auto";  ///< GenOptions::protocol (ll: the puts of the packet generators as LL packets)
  bool shareGpus = false;
};

/// The sizes mk-bench sweeps when none is given (nccl-tests' -b 8 -e 512M -f 2).
inline constexpr const char* kDefaultSweep = "8:512M:2";

/// Every option of `mk-bench <collective>` on `app`, bound to `a`.
void addArgs(CLI::App& app, Args& a);

/// --ranks-per-node, --transport and --share-gpus (one process per rank, nodes joined by the proxy), bound to the
/// three: what every subcommand that runs across nodes takes.
void addNodeArgs(CLI::App& app, uint32_t& ranksPerNode, std::string& transport, bool& shareGpus);

/// Every check of the words and counts of `a` that needs no GPU: the collective, --dtype, --redop, the sizes,
/// -n and --reps >= 1, --baseline. Run by finishArgs, so mk-bench refuses bad input before it looks for a GPU and
/// mk-bench-cli accepts exactly what mk-bench accepts. Throws Error(InvalidArgument).
void checkArgs(const Args& a);

/// After parse: the collective from the positional or --op (--op sum|max|min, the reduction before the
/// convention, is refused naming --redop), and the sizes resolved into a.sweep. Throws Error(InvalidArgument).
void finishArgs(const CLI::App& app, Args& a);

/// Parse `mk-bench <collective> ...` into `a`: mk::cli::kContinue, or the exit code after --help (0) or one
/// "mk-bench: error: ..." line (2).
int parseArgs(int argc, char** argv, Args& a);

}  // namespace mkbench
