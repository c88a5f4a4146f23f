// mk-schedule's shared parts: the options and the report, verify and output helpers every op's runner uses. The
// collectives and loaded schedules run in mk_schedule.cpp, the fused ops, moe-dispatch-gemm and ring-attention in
// mk_schedule_ops.cpp.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

#include "mk/exec/verify.hpp"
#include "mk/resources.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/util/cli_operators.hpp"

namespace mkschedule {

/// Exit code of a failed --verify.
inline constexpr int kExitVerifyFailed = mk::cli::kExitFailed;

/// Everything mk-schedule's command line says.
struct Options {
  mk::CollectiveArgs coll;
  mk::cli::OperatorArgs ops;  ///< moe-dispatch-gemm's and ring-attention's options
  bool verify = false;
  std::string inputs = "uniform";
  uint64_t seed = 1;
  std::string jsonOut;
  std::string packedOut;
  std::string scheduleIn;
  mk::cli::GuardArgs guard;
  mk::cli::SizeFlags sizes;
};

/// What this run does with the schedule, for the memory estimate.
mk::MemoryJob jobOf(const Options& o);
/// Ranks, steps per kind, lanes per role and bytes per link class of `s`.
void printSummary(const mk::Schedule& s);
/// Run `check` (a verification on the CPU executor) and print its result; kExitVerifyFailed when it failed.
int verify(const Options& o, uint32_t nRanks, const std::function<mk::VerifyResult()>& check);
/// Write --json and --packed all or nothing.
void writeOutputs(const Options& o, const mk::Schedule& schedule);
/// " (sms, ctaGBs: datasheet values, not in the profile)" for the fields fillCtaDefaults filled, "" for none.
std::string filledNote(const std::vector<std::string>& filled);
/// "OK", or "OK (race check skipped: ...)": what validate() said.
std::string validateText(const mk::Schedule& schedule);
/// (label, text) lines in the summary's two columns.
void printLines(const std::vector<std::pair<std::string, std::string>>& lines);

/// --op gemm-rs|ag-gemm|gemm-ar (mk_schedule_ops.cpp).
int runFused(const Options& o);
/// --op moe-dispatch-gemm|ring-attention (mk_schedule_ops.cpp).
int runOperator(const Options& o);

}  // namespace mkschedule
