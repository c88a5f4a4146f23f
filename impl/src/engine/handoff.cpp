// mkernel — how an op meets its caller: on the caller's stream (the doorbell, and the wait for completion: a
// 32-thread kernel or stream memory operations; one wait per group at groupEnd), or on the host (synchronize).
#include <cuda_runtime_api.h>

#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "device/driver_api.hpp"
#include "engine/engine.hpp"
#include "engine/handoff.hpp"
#include "engine/host_log.hpp"
#include "engine/host_sync.hpp"
#include "kernels/resident_kernel.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk {
namespace runtime {
namespace {

struct GroupWait {
  Engine* engine;  // engines must outlive an open group (documented in communicator.hpp)
  int rank;
  cudaStream_t stream;
  uint32_t seq;              ///< the op's number, or its index in `rec` when captured
  const CaptureRecord* rec;  ///< captured ops: their record (engine/capture.hpp)
};
struct ThreadGroup {
  int depth = 0;
  std::vector<GroupWait> waits;
};
thread_local ThreadGroup tGroup;

/// True when compute-sanitizer is attached to this process. Its tools run one kernel at a time, so a kernel can
/// never run beside the resident one. compute-sanitizer 2025.3 preloads its libraries and sets
/// NV_SANITIZER_INJECTION_PORT_BASE (seen with compute-sanitizer 2025.3); older versions injected through
/// CUDA_INJECTION64_PATH. Read once per rank when the hand-off is decided, never on the submission path.
bool kernelsSerialisedByTool() {
  if (std::getenv("NV_SANITIZER_INJECTION_PORT_BASE") != nullptr) return true;
  for (const char* var : {"CUDA_INJECTION64_PATH", "LD_PRELOAD"}) {
    const char* v = std::getenv(var);
    if (v != nullptr && std::strstr(v, "sanitizer") != nullptr) return true;
  }
  return false;
}

}  // namespace

bool insideGroup() noexcept { return tGroup.depth > 0; }

void deferGroupWait(Engine* engine, int rank, cudaStream_t stream, uint32_t seq, const CaptureRecord* rec) {
  tGroup.waits.push_back(GroupWait{engine, rank, stream, seq, rec});
}

bool EngineHandoff::useKernel(int r) {
  const RankResources& rr = ctx_.ranks[r];
  int8_t& choice = kernelHandoff_[static_cast<size_t>(r)];
  if (choice < 0) {
    const bool serialised = kernelsSerialisedByTool();
    bool k = ctx_.config.streamHandoff == StreamHandoff::Kernel;
    if (k && serialised)
      throw Error(ErrorCode::InvalidArgument,
                  "CommConfig::streamHandoff = Kernel cannot work under compute-sanitizer: it runs one kernel at a "
                  "time, so the hand-off kernel would wait behind the resident kernel forever (use Auto or MemOps)");
    if (ctx_.config.streamHandoff == StreamHandoff::Auto) {
      // The hand-off kernel must find room beside the resident grid, or the caller's stream would wait for
      // an SM that never frees up: take it only when the grid leaves whole SMs idle, and never when a tool
      // serialises kernels (it could not run beside the resident kernel at all).
      int sms = 0;
      MK_CUDA_CHECK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, rr.device));
      k = !serialised && int64_t{ctx_.workers} + 1 < sms;
    }
    choice = k ? 1 : 0;
    MK_LOG_AT(Info, rankName(r),
              std::string("stream hand-off: ") + (k ? "a 32-thread kernel per op" : "stream memory operations") +
                  (serialised ? " (compute-sanitizer attached)" : ""));
  }
  return choice == 1;
}

void EngineHandoff::handoff(int r, cudaStream_t stream, uint32_t seq, bool wait) {
  const RankResources& rr = ctx_.ranks[r];
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  uint32_t* bell = &rr.doorbell[seq % ctx_.ringSlots];
  const auto& api = driverApi();
  MK_LOG_AT(Debug, rankName(r),
            "op " + std::to_string(seq) + ": doorbell" + (wait ? " and stream wait" : "") + " enqueued on stream " +
                std::to_string(reinterpret_cast<uintptr_t>(stream)));
  // In a group the doorbell is a stream memory write (no wait follows it, so nothing is descheduled and the
  // host pays ~1.3 us instead of a kernel launch); the group's one wait is the kernel's at groupEnd.
  if (!useKernel(r) || !wait) {
    checkDriver(
        api.streamWriteValue32(stream, reinterpret_cast<CUdeviceptr>(bell), seq + 1, CU_STREAM_WRITE_VALUE_DEFAULT),
        "cuStreamWriteValue32 (doorbell)");
    if (wait) enqueueWait(r, stream, seq);
    return;
  }
  MK_CUDA_CHECK(launchHandoff(bell, seq + 1, &rr.state->complete, seq + 1, true, &rr.state->abort,
                              static_cast<uint64_t>(ctx_.config.hostBudgetMs * 1e6), stream));
}

void EngineHandoff::enqueueWait(int r, cudaStream_t stream, uint32_t seq) {
  const RankResources& rr = ctx_.ranks[r];
  MK_CUDA_CHECK(cudaSetDevice(rr.device));
  if (useKernel(r)) {
    MK_CUDA_CHECK(launchHandoff(nullptr, 0, &rr.state->complete, seq + 1, true, &rr.state->abort,
                                static_cast<uint64_t>(ctx_.config.hostBudgetMs * 1e6), stream));
    return;
  }
  checkDriver(driverApi().streamWaitValue32(stream, reinterpret_cast<CUdeviceptr>(&rr.state->complete), seq + 1,
                                            CU_STREAM_WAIT_VALUE_GEQ),
              "cuStreamWaitValue32 (op complete)");
}

uint64_t Engine::submitted(int r) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  return ctx_.ranks[r].submitted;
}

void Engine::synchronize(int r) {
  std::lock_guard<std::mutex> lock(ctx_.mu);
  throwIfFailedLocked(true);
  const std::map<uint32_t, PendingOp>& pending = submission_.pendingOps();
  for (const auto& kv : pending) {
    if (ctx_.link) break;  // multi-process: peers may still submit (waited for below, bounded)
    std::string missing;
    for (size_t q = 0; q < kv.second.called.size(); ++q)
      if (!kv.second.called[q]) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
    if (kv.second.called[r])
      throw Error(ErrorCode::InvalidArgument, "synchronize on rank " + std::to_string(r) + ": op " +
                                                  std::to_string(kv.first) + " (" + kv.second.sched->what +
                                                  ") has not been submitted by rank(s) " + missing +
                                                  " yet, so it can never complete");
  }
  const uint32_t want = ctx_.ranks[r].submitted;
  MK_LOG_AT(Debug, rankName(r),
            "synchronize: waiting for " + std::to_string(want) + " op(s), " + std::to_string(ctx_.completed(r)) +
                " complete");
  const bool ok = hostPoll(ctx_.config.hostBudgetMs, [&] {
    progress_.pumpLocked();
    if (!poison_.empty() || loadHost(&ctx_.status->abort) != 0) return true;
    if (seqGeq(ctx_.completed(r), want)) return true;
    return cudaStreamQuery(ctx_.ranks[r].kernelStream) != cudaErrorNotReady;
  });
  throwIfFailedLocked(true);
  if (!ok && ctx_.link && !pending.empty()) {
    const auto& kv = *pending.begin();
    poisonAndThrow(ErrorCode::Timeout, "synchronize on rank " + std::to_string(r) + ": op " + std::to_string(kv.first) +
                                           " (" + kv.second.sched->what + ") was not submitted by rank(s) " +
                                           progress_.unpostedRanks(kv.first) + " within " +
                                           fmtMs(ctx_.config.hostBudgetMs));
  }
  if (!ok)
    poisonAndThrow(ErrorCode::Timeout, "synchronize on rank " + std::to_string(r) + ": " +
                                           std::to_string(ctx_.completed(r)) + " of " + std::to_string(want) +
                                           " ops completed after " + fmtMs(ctx_.config.hostBudgetMs) +
                                           " (is a stream blocked?)");
}

}  // namespace runtime

void groupStart() { ++runtime::tGroup.depth; }

void groupEnd() {
  auto& g = runtime::tGroup;
  if (g.depth == 0) throw Error(ErrorCode::InvalidArgument, "groupEnd without groupStart");
  if (--g.depth > 0) return;
  std::vector<runtime::GroupWait> waits;
  waits.swap(g.waits);
  // The last op per (engine, rank, stream, capture): ops of one rank complete in order, so one wait covers all.
  for (size_t i = 0; i < waits.size(); ++i) {
    bool later = false;
    for (size_t j = i + 1; j < waits.size(); ++j)
      if (waits[j].engine == waits[i].engine && waits[j].rank == waits[i].rank && waits[j].stream == waits[i].stream &&
          waits[j].rec == waits[i].rec)
        later = true;
    if (later) continue;
    if (waits[i].rec)
      waits[i].engine->enqueueCapturedWait(*waits[i].rec, waits[i].seq, waits[i].stream);
    else
      waits[i].engine->enqueueWait(waits[i].rank, waits[i].stream, waits[i].seq);
  }
}

}  // namespace mk
