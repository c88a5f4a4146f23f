// mkernel — goodput under failures (docs/planner.md, "Goodput under failures"): how much of a job's nominal
// throughput survives its interruptions, from the failure rates of its GPUs, nodes and racks, the restart time,
// the checkpoint write time and interval, and a pool of spare nodes.
//
// The model is the first-order one of Young (CACM 1974) and Daly (FGCS 2006): with a job MTBF M, a checkpoint
// written in time W every interval T, and a failure costing the work since the last checkpoint (T / 2 on average)
// plus the restart R and the wait for a replacement node Q,
//   ETTR = 1 - W / T - (T / 2 + R + Q) / M,      T* = sqrt(2 W M) (Young-Daly: the T that maximises it).
// It holds while T, R and Q are small against M; estimateGoodput() says when they are not.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace mk::plan {

/// Default MTBF of one GPU in hours, every cause of an unexpected interruption counted against the GPUs: Meta's
/// Llama 3 pre-training saw 419 unexpected interruptions in 54 days on 16,384 H100 GPUs (Llama Team, "The Llama 3
/// Herd of Models", arXiv 2407.21783, section 3.3.4). A published observation, used as a parameter (mtbf=
/// replaces it), not fitted to anything.
inline constexpr double kDefaultGpuMtbfH = 16384.0 * 54 * 24 / 419;
inline constexpr const char* kDefaultGpuMtbfSource =
    "default: Llama 3, 419 unexpected interruptions in 54 days on 16384 H100 (arXiv 2407.21783)";

/// The failure what-if keys of one variant (parseFailureKey). Absent values are "not given": the MTBF then takes
/// kDefaultGpuMtbfH, the interval the Young-Daly optimum, the spare pool "always a replacement"; a missing restart,
/// checkpoint write (checkpoint= or ckptbw=) or, with spares=, repair time makes the results that need it unknown.
struct FailureSpec {
  std::optional<double> mtbfGpuH, mtbfNodeH, mtbfRackH;  ///< mtbf=gpu:|node:|rack:DURATION, hours
  std::optional<uint32_t> rackNodes;                     ///< rack=N nodes (the topology has no racks)
  std::optional<double> restartS;                        ///< restart=, the sum of its parts when given as four
  std::vector<double> restartPartsS;                     ///< detection, reschedule, reload, warm-up (or empty)
  std::optional<double> checkpointWriteS;                ///< checkpoint=DURATION: the write time as given
  std::optional<double> checkpointBytesPerGpu;           ///< checkpoint=SIZE: bytes per GPU, not the memory model's
  std::optional<double> ckptBwGBs;                       ///< ckptbw=[node:|gpu:]GB/s
  bool ckptBwPerGpu = false;                             ///< ckptbw=gpu:X (else per node, shared by its GPUs)
  std::optional<double> intervalS;                       ///< ckptinterval=DURATION
  std::optional<uint32_t> spares;                        ///< spares=N spare nodes
  std::optional<double> repairS;                         ///< repair=DURATION: a failed node's time to return
  /// Whether any failure key was given (the variant then gets a goodput estimate at every scale).
  bool any() const noexcept {
    return mtbfGpuH || mtbfNodeH || mtbfRackH || rackNodes || restartS || checkpointWriteS || checkpointBytesPerGpu ||
           ckptBwGBs || intervalS || spares || repairS;
  }
};

/// Parse one what-if key of the failure model into `spec`; false when `key` is not one. Throws
/// Error(InvalidArgument) with "KEY must ..." for a bad value (a duration needs a unit: ms, s, min, h, d; a size
/// one of parseSize's: 40GiB).
bool parseFailureKey(FailureSpec& spec, const std::string& key, const std::string& value);

/// The checks across keys, after the last one is parsed: mtbf=rack: needs rack=, checkpoint= and ckptbw= exclude
/// each other. Throws Error(InvalidArgument) naming the key.
void checkFailureSpec(const FailureSpec& spec);

/// The job at one scale.
struct FailureScale {
  uint32_t gpus = 0, nodes = 0, gpusPerNode = 0;
  double checkpointBytesPerGpu = 0;  ///< weights + optimizer state of the GPU that holds the most (memory model)
  double tokensPerS = 0;             ///< nominal, without failures
  double tokenBudget = 0;            ///< tokens to train
};

/// The goodput of a job at one scale. Optional values are unknown (a needed input is missing: `unknown` says
/// which).
struct GoodputResult {
  double failuresPerHour = 0;  ///< GPUs / MTBF_gpu + nodes / MTBF_node + racks / MTBF_rack
  double jobMtbfS = 0;         ///< 1 / failuresPerHour, seconds
  std::string mtbfSource;      ///< the rates used and where they come from
  uint32_t racks = 0;
  double checkpointBytesPerGpu = 0;
  std::optional<double> writeS;     ///< checkpoint write time
  std::optional<double> intervalS;  ///< checkpoint interval (given, or the Young-Daly optimum)
  bool youngDaly = false;           ///< whether intervalS is the Young-Daly optimum
  std::optional<double> restartS;
  double noSpareProbability = 0;          ///< chance that a failure finds no spare node (0 without spares=)
  std::optional<double> waitS;            ///< expected wait for a replacement per failure: noSpareProbability x repair
  std::optional<double> lostPerFailureS;  ///< T / 2 + restart + wait
  std::optional<double> ettr;             ///< effective training time ratio, in [0, 1]
  std::optional<double> goodputTokensPerS;
  std::optional<double> trainS;  ///< token budget / goodput, seconds
  std::string unknown;           ///< the missing inputs ("" when everything is known)
  std::string note;              ///< where the first-order model leaves its range
};

/// The Young-Daly optimum checkpoint interval sqrt(2 W M) (seconds) for a write time W and job MTBF M.
double youngDalyIntervalS(double writeS, double mtbfS);

/// The first-order effective training time ratio 1 - W / T - (T / 2 + R) / M, clamped to [0, 1]; R is every
/// per-failure cost beyond the lost work (restart and wait).
double firstOrderEttr(double writeS, double intervalS, double perFailureS, double mtbfS);

/// The goodput of `job` under the failures of `spec`. Deterministic.
GoodputResult estimateGoodput(const FailureSpec& spec, const FailureScale& job);

/// "12.3 min", "4.10 h", "3.25 d" (3 significant digits), "unknown" for nullopt.
std::string formatDuration(std::optional<double> seconds);

/// The terminal table of a variant's goodput: one row per (GPU count, result); empty without rows.
std::string formatGoodputTable(const std::vector<std::pair<uint32_t, const GoodputResult*>>& rows);

}  // namespace mk::plan
