// mkernel — resource guards (mk/resources.hpp): count a schedule through its own generator, price a job's memory,
// refuse it above the limit.
#include "mk/resources.hpp"

#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <functional>
#include <limits>

#include "algorithms/builder.hpp"
#include "algorithms/fused_common.hpp"
#include "mk/error.hpp"
#include "mk/util/format.hpp"

namespace mk {

namespace {

// Bytes per step, measured as peak RSS over steps (docs/results.md, "Resource guards"), with a margin. The
// in-memory schedule: the Step itself (96 bytes), vector growth and validate()'s tables: 119-134 measured.
constexpr uint64_t kScheduleBytesPerStep = 160;
// A lane: the Lane itself, its entry in the builder's index and its share of the per-rank tables.
constexpr uint64_t kScheduleBytesPerLane = 96;
// The JSON text of one step (about 77 characters) twice: the text and the copy staged with its newline.
constexpr uint64_t kJsonBytesPerStep = 160;
// The packed image (80 bytes a step) and the string it is copied into before the write: 129 measured.
constexpr uint64_t kPackedBytesPerStep = 170;
// The CPU executor's per-step state (its dependency tables), on top of the buffers it allocates.
constexpr uint64_t kVerifyBytesPerStep = 64;
// The replay beyond the schedule: the step costs and uncontended timeline in the caller, the actors' step tables
// and SimGrid activities in the simulating child; 282 measured at 225 k steps.
constexpr uint64_t kSimBytesPerStep = 320;
// The per-step trace: the prediction's step records and the trace text (136 bytes a step): 396 measured.
constexpr uint64_t kTraceBytesPerStep = 450;
// One GPU of the SimGrid platform: its hosts, links, routes and the lane actors' stacks: about 230 KiB measured
// on 1024 GPUs.
constexpr uint64_t kSimBytesPerGpu = 320 * 1024;
// One flag counter of the replay (sim/src/flag_state.hpp, allocated for every rank x nFlags whether a step uses it
// or not): sizeof(FlagState) 112 on libstdc++ plus what an empty std::deque allocates (its map of 8 pointers and
// one 512-byte node, with malloc's headers): 720 derived, 704 measured (nFlags 5000000 on 2 ranks, 7.0 GB peak).
constexpr uint64_t kSimBytesPerFlag = 768;
// One barrier: the replay's BarrierState (40) and StepCosts' participant count (8) in the simulating child; the
// uncontended timeline's BarrierState (40) in the caller is freed before the replay: 48 derived, 48 measured
// (nBarriers 50000000, 2.4 GB peak), rounded up.
constexpr uint64_t kSimBytesPerBarrier = 64;
// The CPU executor's flag counter (an 8-byte atomic) and its byte of "fed by the proxy", rounded up.
constexpr uint64_t kVerifyBytesPerFlag = 16;
// The CPU executor's arrival count per barrier (4 bytes) and one byte per rank of who arrived, rounded up.
constexpr uint64_t kVerifyBytesPerBarrier = 8;
// Flag and barrier state above this is a part of its own in the estimate's text ("flags and barriers 7.2 GiB"): the
// one a user must shrink. Below it, it is folded into its job's part to keep the line short.
constexpr uint64_t kOwnPartBytes = uint64_t{64} << 20;
// The verifier keeps one float copy of every input element (the inputs it drew) and of every output element
// (the reference result); with the executor's buffers that matched the measured peak to 1 %.
constexpr uint64_t kVerifyBytesPerIoElement = sizeof(float);

/// Fill `c` from the lanes and buffers of `s` (steps: `steps`).
void record(ScheduleCount& c, const Schedule& s, uint64_t steps, bool complete) {
  c.steps = steps;
  c.complete = complete;
  c.nRanks = s.nRanks;
  c.lanes = 0;
  for (const auto& lanes : s.lanes) c.lanes += lanes.size();
  c.flags = static_cast<uint64_t>(s.nRanks) * s.nFlags;
  c.barriers = s.nBarriers;
  c.bufferBytes = 0;
  c.ioElements = 0;
  for (const BufferDecl& d : s.buffers) {
    uint64_t elements = 0;
    for (const uint64_t n : d.count) elements += n;
    c.bufferBytes += elements * dtypeSize(d.dtype);
    if (d.kind == BufferKind::Input || d.kind == BufferKind::Output) c.ioElements += elements;
  }
}

/// "10.8 GiB", "8 GiB", "310 MiB": binary units, as --max-memory reads them.
std::string gb(uint64_t bytes) {
  const double gib = static_cast<double>(bytes) / double(uint64_t{1} << 30);
  std::string s = gib >= 0.1 ? strprintf("%.1f", gib) : strprintf("%.0f", gib * 1024);
  if (s.size() > 2 && s.compare(s.size() - 2, 2, ".0") == 0) s.resize(s.size() - 2);
  return s + (gib >= 0.1 ? " GiB" : " MiB");
}

uint64_t saturatingMul(uint64_t a, uint64_t b) noexcept {
  return b != 0 && a > std::numeric_limits<uint64_t>::max() / b ? std::numeric_limits<uint64_t>::max() : a * b;
}

uint64_t saturatingAdd(uint64_t a, uint64_t b) noexcept {
  return a > std::numeric_limits<uint64_t>::max() - b ? std::numeric_limits<uint64_t>::max() : a + b;
}

/// Steps to count before a job is certainly above `limit`: one past what the per-step part alone allows.
uint64_t stepLimit(const MemoryJob& job, uint64_t limit) noexcept {
  return limit / std::max<uint64_t>(1, bytesPerStep(job)) + 1;
}

/// A lane's memory in steps' worth of the job's per-step bytes (at least 1).
uint64_t laneWeightOf(const MemoryJob& job) noexcept {
  const uint64_t perStep = std::max<uint64_t>(1, bytesPerStep(job));
  return std::max<uint64_t>(1, (kScheduleBytesPerLane + perStep - 1) / perStep);
}

/// Count under the limit, with a floor first: a channel with elements emits at least one step on a lane of its own,
/// so min(channels, count) lanes and steps are a lower bound that refuses --channels 4294967295 before any loop.
MemoryNeed needOf(const ScheduleCount& floor, const MemoryJob& job, uint64_t limit,
                  const std::function<ScheduleCount(uint64_t, uint64_t)>& count) {
  const MemoryNeed least = memoryNeed(floor, job);
  if (least.total() > limit) return least;
  return memoryNeed(count(stepLimit(job, limit), laneWeightOf(job)), job);
}

}  // namespace

ScheduleCount countSchedule(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                            uint64_t maxWeight, uint64_t laneWeight) {
  const auto& def = detail::findAlgorithm(spec.op, spec.algo);
  detail::GenContext ctx = detail::makeContext(spec, nodeOf, detail::resolvedForGenerate(spec, nodeOf, opt));
  detail::ScheduleBuilder b(ctx, maxWeight, laneWeight);
  ScheduleCount c;
  try {
    detail::emitCollective(b, ctx, def);
    record(c, b.partial(), b.stepsCounted(), true);
  } catch (const detail::StepLimitReached&) {
    record(c, b.partial(), b.stepsCounted(), false);
  }
  return c;
}

ScheduleCount countSchedule(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt,
                            uint64_t maxWeight, uint64_t laneWeight) {
  const detail::FusedContext ctx = detail::makeFusedContext(spec, nodeOf, opt);
  detail::ScheduleBuilder b(ctx.gen, maxWeight, laneWeight);
  ScheduleCount c;
  try {
    detail::fusedDef(spec.op).emit(b, ctx);
    record(c, b.partial(), b.stepsCounted(), true);
  } catch (const detail::StepLimitReached&) {
    record(c, b.partial(), b.stepsCounted(), false);
  }
  return c;
}

ScheduleCount countOf(const Schedule& s) {
  ScheduleCount c;
  record(c, s, s.stepCount(), true);
  return c;
}

uint64_t MemoryNeed::total() const noexcept {
  uint64_t t = 0;
  for (const auto& part : parts) t = saturatingAdd(t, part.second);
  return t;
}

std::string MemoryNeed::text() const {
  std::string s = (atLeast ? "more than ~" : "~") + gb(total()) + " (";
  for (std::size_t i = 0; i < parts.size(); ++i)
    s += (i ? ", " : "") + parts[i].first + " " + (atLeast ? ">" : "") + gb(parts[i].second);
  return s + ")";
}

uint64_t bytesPerStep(const MemoryJob& job) noexcept {
  uint64_t b = kScheduleBytesPerStep;
  if (job.json) b += kJsonBytesPerStep;
  if (job.packed) b += kPackedBytesPerStep;
  if (job.verify) b += kVerifyBytesPerStep;
  if (job.simulate) b += kSimBytesPerStep + (job.trace ? kTraceBytesPerStep : 0);
  return b;
}

MemoryNeed memoryNeed(const ScheduleCount& c, const MemoryJob& job) {
  MemoryNeed need;
  need.atLeast = !c.complete;
  need.parts.emplace_back("schedule", saturatingAdd(saturatingMul(c.steps, kScheduleBytesPerStep),
                                                    saturatingMul(c.lanes, kScheduleBytesPerLane)));
  if (job.json || job.packed)
    need.parts.emplace_back(
        "output", saturatingMul(c.steps, (job.json ? kJsonBytesPerStep : 0) + (job.packed ? kPackedBytesPerStep : 0)));
  // Flag counters and barriers: declared per rank, so a small file can ask for more of them than of steps.
  const uint64_t verifySync = job.verify ? saturatingAdd(saturatingMul(c.flags, kVerifyBytesPerFlag),
                                                         saturatingMul(c.barriers, kVerifyBytesPerBarrier + c.nRanks))
                                         : 0;
  const uint64_t simSync = job.simulate ? saturatingAdd(saturatingMul(c.flags, kSimBytesPerFlag),
                                                        saturatingMul(c.barriers, kSimBytesPerBarrier))
                                        : 0;
  const bool ownPart = saturatingAdd(verifySync, simSync) > kOwnPartBytes;
  if (job.verify)
    need.parts.emplace_back(
        "verify", saturatingAdd(saturatingAdd(c.bufferBytes, saturatingMul(c.ioElements, kVerifyBytesPerIoElement)),
                                saturatingAdd(saturatingMul(c.steps, kVerifyBytesPerStep), ownPart ? 0 : verifySync)));
  if (job.simulate)
    need.parts.emplace_back(
        "simulation",
        saturatingAdd(saturatingMul(c.steps, kSimBytesPerStep + (job.trace ? kTraceBytesPerStep : 0)),
                      saturatingAdd(saturatingMul(job.platformGpus, kSimBytesPerGpu), ownPart ? 0 : simSync)));
  if (ownPart) need.parts.emplace_back("flags and barriers", saturatingAdd(verifySync, simSync));
  return need;
}

uint64_t physicalMemory() noexcept {
  const long pages = ::sysconf(_SC_PHYS_PAGES);
  const long page = ::sysconf(_SC_PAGESIZE);
  if (pages <= 0 || page <= 0) return 0;
  return saturatingMul(static_cast<uint64_t>(pages), static_cast<uint64_t>(page));
}

uint64_t defaultMaxMemory() noexcept {
  const uint64_t ram = physicalMemory();
  return ram == 0 ? uint64_t{8} << 30 : ram / 2;
}

void requireWithin(const MemoryNeed& need, uint64_t limit, const std::string& flag) {
  // atLeast: counting stopped because the count alone passed the limit (or the floor did), whatever the priced
  // parts add up to.
  if (!need.atLeast && need.total() <= limit) return;
  bool sync = false;
  for (const auto& part : need.parts) sync = sync || part.first == "flags and barriers";
  throw Error(ErrorCode::InvalidArgument,
              "needs " + need.text() + " above " + flag + " " + gb(limit) + "; raise it with " + flag +
                  (sync ? " (or declare fewer flags or barriers: nFlags and nBarriers are per rank)"
                        : " (or ask for less: fewer ranks, chunks, channels or bytes)"));
}

MemoryNeed checkMemory(const CollectiveSpec& spec, const std::vector<uint32_t>& nodeOf, const GenOptions& opt,
                       const MemoryJob& job, uint64_t limit) {
  // A chunk holds at least one element: past the elements of a rank every further chunk is empty, and the
  // generators would still walk each of them (hours at --chunks 4294967295) without emitting a step to count.
  if (opt.chunks > spec.count)
    throw Error(ErrorCode::InvalidArgument, "--chunks " + std::to_string(opt.chunks) + " is more than the " +
                                                std::to_string(spec.count) +
                                                " element(s) per rank: every chunk "
                                                "past that is empty; use at most " +
                                                std::to_string(spec.count));
  ScheduleCount floor;
  floor.steps = floor.lanes = std::min<uint64_t>(opt.channels, spec.count);
  floor.complete = false;
  const MemoryNeed need = needOf(floor, job, limit, [&](uint64_t maxWeight, uint64_t laneWeight) {
    return countSchedule(spec, nodeOf, opt, maxWeight, laneWeight);
  });
  requireWithin(need, limit);
  return need;
}

MemoryNeed checkMemory(const FusedSpec& spec, const std::vector<uint32_t>& nodeOf, const FusedOptions& opt,
                       const MemoryJob& job, uint64_t limit) {
  const MemoryNeed need = memoryNeed(countSchedule(spec, nodeOf, opt, stepLimit(job, limit), laneWeightOf(job)), job);
  requireWithin(need, limit);
  return need;
}

}  // namespace mk
