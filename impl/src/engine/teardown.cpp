// mkernel — engine teardown: drain or stop the resident kernels (bounded), then free what no kernel can touch
// any more; what a kernel that never stopped may still touch is leaked, never freed under it.
#include <cuda_runtime_api.h>

#include <cstdio>
#include <mutex>

#include "engine/engine.hpp"
#include "engine/host_log.hpp"
#include "engine/host_sync.hpp"
#include "engine/internode.hpp"
#include "gemm/gemm_lane.hpp"

namespace mk::runtime {

void Engine::shutdown() noexcept {
  bool any = false;
  for (const auto& rr : ctx_.ranks) any = any || rr.launched;
  if (!any) return;
  // Let submitted ops finish (bounded), then ask the kernels to leave; abort them if they do not.
  const bool failed = !poison_.empty() || (ctx_.status && loadHost(&ctx_.status->abort) != 0);
  MK_LOG_AT(Info, "shutdown", failed ? "after a failure: stopping the resident kernels" : "draining submitted ops");
  // Multi-process: ops posted here wait for peers' posts (bounded) before they can drain.
  if (!failed && ctx_.link)
    hostPoll(ctx_.config.hostBudgetMs, [&] {
      progress_.pumpLocked();
      return submission_.pendingOps().empty() || loadHost(&ctx_.status->abort) != 0;
    });
  bool drained = failed ? false : submission_.pendingOps().empty();
  if (drained)
    for (uint32_t r = 0; r < ctx_.ranks.size(); ++r)
      if (ctx_.ranks[r].launched && !hostPoll(ctx_.config.hostBudgetMs, [&] {
            return seqGeq(ctx_.completed(static_cast<int>(r)), ctx_.ranks[r].submitted) ||
                   loadHost(&ctx_.status->abort) != 0;
          }))
        drained = false;
  for (uint32_t r = 0; r < ctx_.ranks.size(); ++r) storeHost(&ctx_.mailboxes[r].shutdown, 1);
  if (!drained && ctx_.status && loadHost(&ctx_.status->abort) == 0) {
    // Ops that can never finish (a rank never submitted its part, or a failure): stop the kernels.
    ctx_.status->code = static_cast<uint32_t>(device::Status::HostAbort);
    storeHost(&ctx_.status->abort, 1);
  }
  for (auto& rr : ctx_.ranks) {
    if (!rr.launched) continue;
    cudaSetDevice(rr.device);
    const bool exited =
        hostPoll(ctx_.config.hostBudgetMs, [&] { return cudaStreamQuery(rr.kernelStream) != cudaErrorNotReady; });
    if (!exited) {
      storeHost(&ctx_.status->abort, 1);
      if (!hostPoll(ctx_.config.hostBudgetMs, [&] { return cudaStreamQuery(rr.kernelStream) != cudaErrorNotReady; })) {
        std::fprintf(stderr, "mkernel: the resident kernel on GPU %d did not stop; its memory is leaked\n", rr.device);
        continue;
      }
    }
    cudaGetLastError();
    rr.launched = false;
    MK_LOG_AT(Info, "shutdown", "the resident kernel on GPU " + std::to_string(rr.device) + " left");
  }
  // The kernels have stopped pushing and nothing more is delivered to them: stop the proxy (goodbyes, bounded).
  if (interNode_) {
    if (failed) interNode_->fail(Error(poisonCode_, poison_.empty() ? describeDeviceFailure() : poison_));
    interNode_->stop();
  }
  if (ctx_.link && !ctx_.ranks[static_cast<size_t>(ctx_.me)].launched) {
    // Peers' kernels may still write into this rank's memory (done / abort words) until they stopped:
    // free nothing before every peer's kernel left (bounded; a peer whose process died is not waited for).
    storeHost(&ctx_.link->header().stopped[ctx_.me], 1);
    hostPoll(ctx_.config.hostBudgetMs, [&] {
      for (int q = 0; q < size(); ++q)  // the node's ranks: only they share this segment and map this memory
        if (sameNode(q, ctx_.me) && loadHost(&ctx_.link->header().stopped[q]) == 0 && !ctx_.link->gone(q)) return false;
      return true;
    });
  }
}

void Engine::releaseMemory() noexcept {
  bool stillRunning = false;
  for (const auto& rr : ctx_.ranks) stillRunning = stillRunning || rr.launched;
  if (ctx_.link && !stillRunning) ctx_.link->closeImports();
  bool anyRunning = false;
  for (const auto& rr : ctx_.ranks) anyRunning = anyRunning || rr.launched;
  // Compute lanes: the per-op GemmParams blocks, freed only once no kernel can read them (before the
  // arenas they may be carved from).
  releaseGemmLaneBinders(this, !anyRunning);
  submission_.releasePrograms();
  for (auto& rr : ctx_.ranks) {
    if (rr.device < 0) continue;
    if (rr.launched) continue;  // a kernel that never stopped may still touch it: leak rather than corrupt
    cudaSetDevice(rr.device);
    if (rr.arena) {
      for (void* p : rr.retired) rr.arena->release(p);
      for (void* p : rr.scratch) rr.arena->release(p);
      for (void* p : rr.staging) rr.arena->release(p);
      rr.arena->destroy();
    }
    cudaFree(rr.doorbell);
    cudaFree(rr.stamps);
    cudaFree(rr.graphBase);
    cudaFree(rr.fifoDeviceWords);
    if (rr.fifoRing) cudaFreeHost(rr.fifoRing);
    if (rr.fifoDone) cudaFreeHost(rr.fifoDone);
    if (rr.inbox) cudaFreeHost(rr.inbox);
    if (rr.fifoStaging) cudaFreeHost(rr.fifoStaging);
    if (rr.inboxStaging) cudaFreeHost(rr.inboxStaging);
    cudaFree(rr.state);
    if (rr.kernelStream) cudaStreamDestroy(rr.kernelStream);
    if (rr.copyStream) cudaStreamDestroy(rr.copyStream);
    rr = RankResources{};
  }
  if (!anyRunning) {
    if (!ctx_.link) cudaFreeHost(ctx_.status);
    cudaFreeHost(ctx_.ring);
    cudaFreeHost(ctx_.mailboxes);
    timing_.release();
    submission_.releaseHostBlocks();
    ctx_.status = nullptr;
    ctx_.link.reset();
  }
  cudaGetLastError();
}

Engine::~Engine() {
  progress_.stop();
  try {
    std::lock_guard<std::mutex> lock(ctx_.mu);
    shutdown();
    releaseMemory();
  } catch (...) {
    std::fprintf(stderr, "mkernel: error while destroying a communicator (ignored)\n");
  }
}

}  // namespace mk::runtime
