// mkernel — what the simulator writes: the prediction JSON ("mkernel.prediction.v1") and the per-step trace
// in Chrome / Perfetto trace-event JSON. Formats: docs/simulator.md.
//
// The trace format is the one the GPU engine's trace uses too (both written by mk::io::TraceWriter): one
// complete event ("ph": "X") per step, "pid" = rank, "tid" = lane + 1, "ts"/"dur" in microseconds from op
// submission (whole nanoseconds), "name" = step kind, "cat" = link class, "args" = {"step", "kind", "bytes",
// "lane"}; metadata events name each rank ("rank 3 (node 0)") and lane ("lane 1 (intra)"). Any engine that
// fills StepRecords can write it with traceToJson().
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/fused.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/sim/replay.hpp"

namespace mk::sim {

/// What a fused operator adds to a run's description: its plan (shape, split, closed form) and the unfused
/// baseline.
struct FusedRunInfo {
  FusedPlan plan;
  LayeredEstimate layered;
};

/// What was simulated, for reports (everything optional except what a schedule file also knows).
struct RunInfo {
  std::string op;             ///< "allreduce", or the schedule's OpInfo::op
  std::string algo;           ///< the generator (or the schedule's OpInfo::algo)
  bool chosenByAuto = false;  ///< `algo`, chunks and channels were chosen by "auto" (written "auto:<algo>")
  std::string cluster;        ///< topology name
  std::string dtype;
  std::string profileSource;  ///< Profile::source
  uint32_t nodes = 0, gpusPerNode = 0, ranks = 0, chunks = 1, channels = 1;
  std::string inter;                   ///< hierarchical all-reduce's inter-node phase ("ring" / "rhd"); empty otherwise
  uint64_t bytes = 0;                  ///< nccl-tests "size": mk::opBytes
  uint64_t count = 0;                  ///< the op's count argument
  double busBwFactor = 1;              ///< mk::busBwFactor(op, ranks)
  std::optional<double> closedFormUs;  ///< mk::closedForm, when the generator has one
  std::optional<double> uncontendedUs;  ///< mk::simulateUncontended on the same schedule
  std::optional<FusedRunInfo> fused;    ///< a fused op: written as "fused": {...} (docs/simulator.md)
};

/// nccl-tests algbw: bytes / time, in GB/s (0 when the time is 0).
double algBwGBs(uint64_t bytes, double timeUs) noexcept;

/// {"schema": "mkernel.prediction.v1", "time_us", "algbw_gbs", "busbw_gbs", "busiest_links", "links", ...}, and
/// for a fused op "fused": {"m", "n", "k", "tile_rows", "order", "ctas", "comm_ctas", "bound", "busy_us", ...}.
std::string predictionToJson(const Prediction& p, const RunInfo& info, int indent = 2);

/// One document for a size sweep: the common fields once, then "results": [{bytes, count, time_us, ...}]. When
/// "auto" chose, the common "algo" is "auto" and every result names its own "algo", "chunks" and "channels".
std::string sweepToJson(const std::vector<std::pair<RunInfo, Prediction>>& rows, int indent = 2);

/// The per-step trace of `steps` (StepRecords of schedule `s`) as Chrome trace-event JSON.
std::string traceToJson(const Schedule& s, const std::vector<StepRecord>& steps);

}  // namespace mk::sim
