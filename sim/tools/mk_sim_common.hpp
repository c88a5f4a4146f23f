// mk-sim's shared parts: the options, what one run needs besides its schedule, and the report lines every op
// prints (profile, busiest links, simulation cost, outputs). Each op's runner lives in its own file: collectives
// and loaded schedules in mk_sim.cpp, the fused GEMM + collective ops in mk_sim_fused.cpp, moe-dispatch-gemm in
// mk_sim_moe.cpp, ring-attention in mk_sim_attention.cpp.
#pragma once

#include <cstddef>
#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/request.hpp"
#include "mk/cost/bottleneck.hpp"
#include "mk/cost/cost.hpp"
#include "mk/error.hpp"
#include "mk/resources.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/sim/output.hpp"
#include "mk/sim/replay.hpp"
#include "mk/topology/topology.hpp"
#include "mk/util/cli.hpp"
#include "mk/util/cli_convention.hpp"
#include "mk/util/cli_operators.hpp"
#include "mk/util/size.hpp"

namespace mksim {

/// Above this many steps the uncontended reference timeline is not worth its memory next to the replay.
inline constexpr uint64_t kUncontendedMaxSteps = 2000000;
/// Above this many steps the exact replay takes tens of seconds (docs/simulator.md): suggest --fast.
inline constexpr uint64_t kSuggestFastSteps = 1000000;
/// Links the report lists.
inline constexpr std::size_t kBusiestLinks = 3;

/// Everything mk-sim's command line says.
struct Options {
  mk::CollectiveArgs coll;
  mk::cli::OperatorArgs ops;  ///< moe-dispatch-gemm's and ring-attention's options
  std::string jsonOut;
  std::string traceOut;
  mk::cli::SizeFlags sizes;
  std::string sweep;  ///< MIN:MAX:FACTOR from --sweep or -b/-e/-f (resolveSweep); "" for one size
  std::string scheduleIn;
  std::string extentsIn;  ///< --extents: runtime extent values of the loaded (or MoE) schedule
  bool verbose = false;
  bool fast = false;
  mk::cli::GuardArgs guard;
};

/// Throw the bad-input error `msg` (exit 2).
[[noreturn]] inline void bad(const std::string& msg) { throw mk::Error(mk::ErrorCode::InvalidArgument, msg); }

/// What one run needs besides the schedule.
struct Setup {
  mk::Topology topo;
  mk::Profile profile;
  bool defaultProfile = true;
  std::optional<mk::CollectiveSpec> spec;  ///< when generated
  mk::GenOptions gen;
  bool chosenByAuto = false;  ///< spec->algo and gen came from --algo auto
  uint32_t nRanks = 0;
};

/// The report's description of the run of `s` (op, algorithm, cluster, sizes) as set up by `st`.
mk::sim::RunInfo baseInfo(const Setup& st, const mk::Schedule& s);
/// The replay's options from the command line (trace wanted or not).
mk::sim::SimOptions simOptions(const Options& o, bool trace);
/// "  1. n0.nvl2_UP  97.0 % busy ..." for the busiest links.
void printBusiestLinks(const std::vector<mk::sim::LinkLoad>& links);
/// The simulation's own cost (--verbose).
void printStats(const mk::sim::SimStats& s);
/// Write the outputs all or nothing: when one fails, none of the targets is replaced.
void writeOutputs(const Options& o, const std::string& json, const std::string& trace);
/// The end of a one-schedule report: the busiest links, the stats with --verbose, then --json / --trace.
void finishReport(const Options& o, const mk::Schedule& s, const mk::sim::Prediction& p, const mk::sim::RunInfo& info,
                  bool wantTrace);
/// What one simulation of this run needs besides its schedule: the replay, the trace, the platform it builds.
mk::MemoryJob jobOf(const Setup& st, bool trace);
/// The cluster, ranks and profile of the command line; a loaded schedule brings its own ranks.
Setup makeSetup(const Options& o, const mk::Schedule* loaded);
/// "profile: uncalibrated (datasheet defaults)" or the profile file and its source.
void printProfile(const Options& o, const Setup& st);

/// The uncontended timeline's reference numbers for `s`: its total and its compute lanes' use over that total
/// (mk::computeResourceUse), when `s` has at most kUncontendedMaxSteps steps. The timeline itself is not kept, so
/// the replay does not hold it too.
struct Uncontended {
  std::optional<double> us;
  std::vector<mk::ResourceUse> compute;
};
Uncontended uncontended(const Setup& st, const mk::Schedule& s);
/// What bounds the replayed op, in words (mk::bottleneckText): its links' load and the compute lanes' use of `u`
/// taken over the predicted time.
std::string boundText(const mk::sim::Prediction& p, const Uncontended& u);

/// Replay `s`, a generated operator's schedule (moe-dispatch-gemm, ring-attention), on the run `st` sets up and
/// report it: the header, `lines` (label, text) about its problem, the prediction with the TFLOP/s of its compute
/// steps, the bytes across and inside nodes, what bounds it (links or compute lanes) and the busiest links; then
/// the outputs. Refuses a schedule above --max-memory first.
int runOperator(const Options& o, const Setup& st, const mk::Schedule& s,
                const std::vector<std::pair<std::string, std::string>>& lines);

/// --op gemm-rs|ag-gemm|gemm-ar (mk_sim_fused.cpp).
int runFused(const Options& o);
/// --op moe-dispatch-gemm (mk_sim_moe.cpp).
int runMoe(const Options& o);
/// --op ring-attention (mk_sim_attention.cpp).
int runAttention(const Options& o);

}  // namespace mksim
