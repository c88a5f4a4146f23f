// mkernel — replay a Schedule on the SimGrid platform of a cluster and predict its time (docs/simulator.md).
//
// One actor per (rank, lane) runs the lane's steps in order on a lane clock that may run ahead of SimGrid's:
//   Copy / Reduce (link local) and Gemm -> timed on the lane clock: the lanes of one GPU pipe never exceed it
//                                          (rule 2), so a bounded Exec would always run at its bound;
//   Put, Copy / Reduce over NVLink      -> the alpha on the lane clock, then the bytes from the source GPU host
//                                          to the destination GPU host at the lane's cap;
//   ProxyPut                            -> proxy + network alpha (+ extra switch hops) on the lane clock, then the
//                                          bytes between the two GPUs' network endpoints (PCIe, NIC, fabric);
//   transfers, exact mode               -> timed at their caps and entered in a ledger that proves no link is
//                                          ever oversubscribed (so SimGrid would give each its cap); if the proof
//                                          fails, a second pass runs each as a SimGrid Comm;
//   Signal / Wait / Barrier             -> simulation-level counters; a lane suspends only when it must wait.
// Each transfer's rate is capped at (profile bandwidth) / (lanes of the rank using that resource), exactly as
// in mk::simulateUncontended; links then share what remains when flows meet. Without contention the replay
// reproduces simulateUncontended; with contention it can only be slower.
//
// SimGrid 3.32 allows one Engine per process (a second one aborts), so predict() runs each simulation in a
// forked child process by default and ships the result back through a pipe: a process (a test binary, a
// sweep) can run any number of predictions, and a SimGrid abort cannot take the caller down.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "mk/cost/cost.hpp"
#include "mk/schedule/schedule.hpp"
#include "mk/topology/topology.hpp"

namespace mk::sim {

/// How a prediction runs.
struct SimOptions {
  bool verbose = false;  ///< SimGrid's own logs (info) on stderr
  bool isolate = true;   ///< run in a forked child (false: in this process, which can then never run another)
  bool trace = true;     ///< keep per-step start/end times (Prediction::steps)
  bool linkLoad = true;  ///< per-link load (Prediction::links): exact bytes, peak from SimGrid's link-load plugin
  /// Scale mode: steps that stay inside a node (NVLink, memory, GEMM, flags) are timed by the uncontended
  /// timeline formulas on each lane's own clock, NVLink contention unmodelled; network flows (ProxyPut) are timed
  /// under timeTransfers' proof or simulated. Identical to the exact mode whenever nothing contends inside a
  /// node (docs/simulator.md has the numbers). Link loads then cover the network links only.
  bool fast = false;
  /// Time NVLink (exact mode) and network transfers at their caps and prove that no link is ever oversubscribed
  /// (then SimGrid's sharing would give every transfer its cap: same times, far fewer simulation events); when
  /// the proof fails, a second pass simulates every transfer. false: simulate them all from the start (the
  /// reference the tests compare with; also what isolate = false does, as it cannot run a second pass).
  bool timeTransfers = true;
  uint32_t actorStackKiB = 32;  ///< SimGrid context stack per actor: lanes need little, and SimGrid zeroes every stack
  /// Called about every `progressEveryS` seconds of wall time once `progressAfterS` have passed (never when
  /// empty), from the simulating process: fraction of steps done, simulated time so far (us), wall seconds.
  std::function<void(double fraction, double simUs, double wallS)> onProgress;
  double progressAfterS = 2.0;
  double progressEveryS = 2.0;
};

/// When one step ran (microseconds from op submission), as the GPU engine's trace records it too.
struct StepRecord {
  uint32_t rank = 0, lane = 0, step = 0;  ///< which step (Schedule::lanes[rank][lane].steps[step])
  StepKind kind = StepKind::Copy;         ///< copied from the step, so a trace needs no schedule lookups
  LinkClass link = LinkClass::None;       ///< the step's link class
  uint64_t bytes = 0;                     ///< the step's payload bytes
  double startUs = 0;                     ///< when the lane started the step (alphas included)
  double endUs = 0;                       ///< when the step's effects were complete for the lane
};

/// Load of one link over the whole run (only links that carried bytes are reported).
struct LinkLoad {
  std::string name;         ///< "n3.nic5_UP", "n0.nvl2_DOWN", "rail1.leaf0.up_UP"
  double bandwidthGBs = 0;  ///< capacity, per direction
  double bytes = 0;         ///< bytes carried
  double avgGBs = 0;        ///< bytes / predicted total time
  double peakGBs = 0;       ///< largest instantaneous load
  double utilization = 0;   ///< avgGBs / bandwidthGBs (0..1)
};

/// What a simulation costs (reported by benchmarks and --verbose).
struct SimStats {
  uint64_t steps = 0;
  uint64_t comms = 0;   ///< SimGrid communications started
  uint64_t execs = 0;   ///< local Copy / Reduce and Gemm steps (timed on the lane's clock: they never contend)
  uint64_t actors = 0;  ///< one per lane
  /// Transfers timed at their caps without a SimGrid comm, proven uncontended (no link ever carried
  /// more than its bandwidth, so SimGrid's sharing would have left every cap alone).
  uint64_t timedTransfers = 0;
  /// The proof failed (a link was oversubscribed), so the replay ran a second pass with every transfer
  /// simulated; wallSeconds covers both passes.
  bool oversubscribed = false;
  uint32_t passes = 1;
  double wallSeconds = 0;  ///< platform + replay, in the simulating process
  double peakRssMiB = 0;   ///< peak resident memory of the simulating process
};

/// The simulator's answer.
struct Prediction {
  double totalUs = 0;             ///< max end over all steps (profile.dispatchUs for an empty schedule)
  std::vector<StepRecord> steps;  ///< in (rank, lane, step) order when SimOptions::trace
  std::vector<LinkLoad> links;    ///< busiest first (by utilization, then name) when SimOptions::linkLoad
  SimStats stats;
};

/// GPU index (node * gpusPerNode + local) of every rank: the ranks of node n take that node's GPUs in rank
/// order. Throws Error(InvalidArgument) when the schedule does not fit the cluster (a node index beyond the
/// cluster, more ranks on a node than it has GPUs), naming the rank and node.
std::vector<uint32_t> placeRanks(const Schedule& s, const Topology& topo);
/// `topo` cut to the nodes `s` places ranks on (up to its last one): what predict() builds, so that 2 ranks on a
/// 4000-node cluster simulate one node, not 4000.
Topology usedPart(const Topology& topo, const Schedule& s);

/// Replay `s` on `topo` under `profile`. The schedule must be valid (mk::validate); predict() only re-checks
/// what it indexes with (Error(InvalidSchedule)) and the profile rates the schedule needs
/// (Error(InvalidArgument)). Throws Error(Unsupported) for a second in-process run, Error(Internal) when the
/// simulating process dies.
Prediction predict(const Schedule& s, const Topology& topo, const Profile& profile, const SimOptions& opt = {});

/// The simulation engine this process runs: "SimGrid <major>.<minor>.<patch>" of the loaded library.
std::string engineVersion();

/// Run `body` in a forked child and return the bytes it returns. An mk::Error thrown in the child is
/// re-thrown here with its code and message; a std::bad_alloc as std::bad_alloc (out of memory, the tools' exit 5);
/// any other exception becomes Error(Internal); a child killed by
/// a signal becomes Error(Internal) naming the signal. For code that needs its own SimGrid Engine (tests of
/// the platform).
std::string runIsolated(const std::function<std::string()>& body);

}  // namespace mk::sim
