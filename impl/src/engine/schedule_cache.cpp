// mkernel — the engine's schedule cache: a schedule is generated, lowered for every rank and uploaded once per
// key; the scratch and staging memory its ops bind grows with it (retired, never freed, while ops may use it).
#include <cuda_runtime_api.h>

#include <algorithm>
#include <array>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "engine/host_alloc.hpp"
#include "engine/submission.hpp"
#include "gemm/gemm_lane.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"
#include "mk/schedule/pack.hpp"
#include "mk/schedule/validate.hpp"

namespace mk::runtime {
namespace {

/// Replace each of `slots` (scratch or staging of rank `rr`, its device current) by a new block of `bytes` from
/// the rank's arena. Ops in flight may still use the old blocks: they are retired (freed once the kernel
/// stopped), never freed here.
void regrowSlots(RankResources& rr, std::array<void*, device::kSlots>& slots, uint64_t bytes, const char* what) {
  for (auto& p : slots) {
    if (p) rr.retired.push_back(p);
    p = nullptr;
    p = rr.arena->allocate(bytes, what);
  }
}

}  // namespace

CachedSchedule& EngineSubmission::cacheLocked(const ScheduleKey& key, const std::function<Schedule()>& make,
                                              const std::string& what) {
  auto it = cache_.find(key);
  if (it != cache_.end()) return *it->second;
  auto c = std::make_unique<CachedSchedule>();
  c->schedule = make();
  c->what = what;
  if (c->schedule.nRanks != ctx_.ranks.size())
    throw Error(ErrorCode::InvalidArgument, "schedule has " + std::to_string(c->schedule.nRanks) +
                                                " ranks but the communicator " + std::to_string(ctx_.ranks.size()));
  LowerOptions lo;
  lo.nWorkers = ctx_.workers;
  lo.minBytesPerCta = ctx_.config.minBytesPerCta;
  // From the whole schedule: a rank's LL packet Waits need the senders' steps (lowering/packets.hpp).
  for (uint32_t r = 0; r < ctx_.ranks.size(); ++r) c->programs.push_back(lowerRank(c->schedule, r, lo));
  for (uint32_t r = 0; r < ctx_.ranks.size() && !ctx_.config.computeLanes; ++r) {
    if (computeStepCount(c->programs[r]) > 0)
      throw Error(ErrorCode::Unsupported,
                  what + ": rank " + std::to_string(r) + " has " + std::to_string(computeStepCount(c->programs[r])) +
                      " Gemm, GroupedGemm or Attention step(s); create the communicator with CommConfig::computeLanes "
                      "= true to run them (the compute-capable resident kernel)");
  }
  c->scratchBytes = c->programs[0].scratchBytes;
  c->devicePrograms.assign(ctx_.ranks.size(), nullptr);
  try {
    for (const int lr : ctx_.local) {
      const auto r = static_cast<uint32_t>(lr);
      const auto& img = c->programs[r].image;
      MK_CUDA_CHECK(cudaSetDevice(ctx_.ranks[r].device));
      void* d = ctx_.ranks[r].arena->allocate(img.size(), "the lowered program of " + what);
      c->devicePrograms[r] = d;
      // The copy stream never waits for a user stream (non-blocking), so an upload cannot deadlock
      // against a stream that waits for an op this thread has yet to complete.
      MK_CUDA_CHECK(cudaMemcpyAsync(d, img.data(), img.size(), cudaMemcpyHostToDevice, ctx_.ranks[r].copyStream));
      MK_CUDA_CHECK(cudaStreamSynchronize(ctx_.ranks[r].copyStream));
    }
  } catch (...) {
    for (uint32_t r = 0; r < c->devicePrograms.size(); ++r) {
      if (!c->devicePrograms[r]) continue;
      cudaSetDevice(ctx_.ranks[r].device);
      ctx_.ranks[r].arena->release(c->devicePrograms[r]);
    }
    throw;
  }
  ensureScratchLocked(c->scratchBytes);
  auto& ref = *c;
  cache_.emplace(key, std::move(c));
  return ref;
}

void EngineSubmission::ensureScratchLocked(uint64_t bytes) {
  if (bytes <= scratchBytes_) return;
  // Ops in flight keep using the old arenas (their descriptors hold the addresses): retire, do not free.
  const uint64_t size = std::max<uint64_t>(bytes, scratchBytes_ * 2);
  for (auto& rr : ctx_.ranks) {
    if (rr.device < 0) continue;  // a rank of another process
    MK_CUDA_CHECK(cudaSetDevice(rr.device));
    regrowSlots(rr, rr.scratch, size, "a scratch arena");
    rr.scratchBytes = size;
  }
  scratchBytes_ = size;
}

void* EngineSubmission::stagingLocked(int r, uint32_t seq, uint64_t bytes) {
  RankResources& rr = ctx_.ranks[r];
  if (bytes > rr.stagingBytes) {
    MK_CUDA_CHECK(cudaSetDevice(rr.device));
    regrowSlots(rr, rr.staging, bytes, "a staging buffer");
    rr.stagingBytes = bytes;
  }
  return rr.staging[seq % device::kSlots];
}

void EngineSubmission::allocate() {
  opSchedule_.assign(ctx_.ringSlots, nullptr);
  graphCells_ = hostAlloc<device::GraphCells>(kMaxCaptures);
}

void EngineSubmission::releasePrograms() noexcept {
  for (auto& kv : cache_) {
    for (size_t r = 0; r < kv.second->devicePrograms.size(); ++r)
      if (r < ctx_.ranks.size() && !ctx_.ranks[r].launched && kv.second->devicePrograms[r] && ctx_.ranks[r].arena) {
        cudaSetDevice(ctx_.ranks[r].device >= 0 ? ctx_.ranks[r].device : 0);
        ctx_.ranks[r].arena->release(kv.second->devicePrograms[r]);
      }
  }
  cache_.clear();
}

void EngineSubmission::releaseHostBlocks() noexcept {
  if (graphCells_) cudaFreeHost(graphCells_);
  graphCells_ = nullptr;
}

CachedSchedule& EngineSubmission::specScheduleLocked(const std::string& what, const std::function<Schedule()>& make,
                                                     ScheduleKey* key) {
  // The key is the packed image's hash (a custom schedule's): generated once per spec to learn it.
  Schedule made;
  auto found = specKeys_.find(what);
  if (found == specKeys_.end()) {
    made = make();
    ValidateOptions vo;
    vo.checkRaces = false;  // the generators' tests prove race freedom; this checks the shape we rely on
    validate(made, vo);
    const std::vector<uint8_t> image = pack(made);
    found = specKeys_.emplace(what, ScheduleKey::customImage(fnv1a(image.data(), image.size()), image.size())).first;
  }
  *key = found->second;
  return cacheLocked(
      *key, [&] { return made.nRanks != 0 ? made : make(); }, what);
}

void EngineSubmission::submitNamedLocked(int r, const ScheduleKey& key, CachedSchedule& cs,
                                         const std::vector<std::pair<const char*, const void*>>& named,
                                         cudaStream_t stream) {
  std::vector<uint64_t> bind(cs.schedule.buffers.size(), 0);
  for (const auto& [name, p] : named) {
    const int idx = cs.schedule.bufferIndex(name);
    if (idx < 0) throw Error(ErrorCode::Internal, cs.what + ": the generated schedule has no buffer '" + name + "'");
    bind[static_cast<size_t>(idx)] = reinterpret_cast<uint64_t>(p);
  }
  submitBoundLocked(r, key, cs, bind, stream);
}

void countLaneCtas(const LoweredProgram& prog, uint32_t* compute, uint32_t* other) {
  *compute = *other = 0;
  for (uint32_t l = 0; l < prog.nLanes; ++l) {
    const device::LoweredLane& lane = prog.lanes()[l];
    (static_cast<LaneRole>(lane.role) == LaneRole::Compute ? *compute : *other) += lane.ctaCount;
  }
}

}  // namespace mk::runtime
