// mkernel — resource guards: what a job (generate a schedule, verify it on the CPU executor, simulate it) will
// need, estimated from the request before any of it is spent, and the one refusal above a limit
// (docs/user-guide.md, "Memory guard").
//
// The step count comes from the generators themselves: countSchedule() runs the same emission code as
// generate() through a builder that counts steps instead of storing them, and stops as soon as the count alone
// is above what the limit allows, so an absurd request is refused in a fraction of a second and in little memory.
// The bytes per step, per actor and per platform host are measured on this code (docs/results.md, "Resource
// guards"): an estimate, rounded up, not an accounting.
#pragma once

#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "mk/algorithms/algorithms.hpp"
#include "mk/algorithms/fused.hpp"

namespace mk {

/// What a generated schedule will hold, counted by its own generator without storing a step.
struct ScheduleCount {
  uint64_t steps = 0;  ///< every step on every lane (a lower bound when !complete)
  uint64_t lanes = 0;  ///< lanes on every rank (so far, when !complete)
  uint32_t nRanks = 0;
  uint64_t bufferBytes = 0;  ///< every declared buffer on every rank, in bytes: what the CPU executor allocates
  uint64_t ioElements = 0;   ///< input + output elements summed over ranks: the verifier's float copies of them
  uint64_t flags = 0;        ///< flag counters of every rank (nRanks x nFlags): the replay and executor keep each
  uint64_t barriers = 0;     ///< declared barriers (nBarriers): the replay and executor keep each
  bool complete = true;      ///< false: counting stopped at the step limit, the schedule has more steps
};

/// Count what generate(spec, nodeOf, opt) would build, stopping (complete = false) once steps + lanes x
/// `laneWeight` pass `maxWeight`. Throws what generate() throws for bad input.
ScheduleCount countSchedule(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                            uint64_t maxWeight, uint64_t laneWeight = 1);
/// The same for a fused operator (opt concrete, as planFused() returns it).
ScheduleCount countSchedule(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt,
                            uint64_t maxWeight, uint64_t laneWeight = 1);

/// The same facts of a schedule already in memory (one read from a file).
ScheduleCount countOf(const Schedule& s);

/// What a command will do with one schedule: each part adds its memory.
struct MemoryJob {
  bool json = false;          ///< write the schedule as JSON text
  bool packed = false;        ///< write the packed binary form
  bool verify = false;        ///< run the CPU reference executor
  bool simulate = false;      ///< replay it on the SimGrid model
  bool trace = false;         ///< keep and write the per-step trace of the replay
  uint64_t platformGpus = 0;  ///< GPUs of the platform the simulation builds (simulate only)
};

/// Bytes a job needs, by part ("schedule", "verify", "simulation", ...), in the order they are listed.
struct MemoryNeed {
  std::vector<std::pair<std::string, uint64_t>> parts;
  bool atLeast = false;  ///< counting stopped at the limit: the real need is higher still
  uint64_t total() const noexcept;
  /// "~10.8 GiB (schedule 1.2 GiB, verify 9.6 GiB)", with "more than" in front when atLeast.
  std::string text() const;
};

/// The memory `job` needs on the schedule `count` describes.
MemoryNeed memoryNeed(const ScheduleCount& count, const MemoryJob& job);

/// Bytes each step costs `job` (the part of memoryNeed() that grows with the step count).
uint64_t bytesPerStep(const MemoryJob& job) noexcept;

/// The machine's physical memory in bytes (sysconf), 0 when unknown.
uint64_t physicalMemory() noexcept;
/// The default --max-memory: half of the physical memory (8 GiB when it is unknown).
uint64_t defaultMaxMemory() noexcept;

/// Throws Error(InvalidArgument) when `need` is above `limit` or is only a lower bound (counting stopped at the
/// limit): "needs ~10.8 GiB (schedule 1.2 GiB, verify 9.6 GiB) above --max-memory 8 GiB; raise
/// it with --max-memory" when `need` is above `limit`.
void requireWithin(const MemoryNeed& need, uint64_t limit, const std::string& flag = "--max-memory");

/// Count the schedule of `spec` (stopping where the limit is certainly passed), estimate what `job` needs and
/// refuse it above `limit` (requireWithin). Returns the estimate. Cheap: no step is stored.
MemoryNeed checkMemory(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                       const MemoryJob& job, uint64_t limit);
/// The same for a fused operator.
MemoryNeed checkMemory(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt,
                       const MemoryJob& job, uint64_t limit);

}  // namespace mk
