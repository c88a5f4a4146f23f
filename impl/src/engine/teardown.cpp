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
  for (const auto& rr : ranks_) any = any || rr.launched;
  if (!any) return;
  // Let submitted ops finish (bounded), then ask the kernels to leave; abort them if they do not.
  const bool failed = !poison_.empty() || (status_ && loadHost(&status_->abort) != 0);
  MK_LOG_AT(Info, "shutdown", failed ? "after a failure: stopping the resident kernels" : "draining submitted ops");
  // Multi-process: ops posted here wait for peers' posts (bounded) before they can drain.
  if (!failed && link_)
    hostPoll(config_.hostBudgetMs, [&] {
      pumpLocked();
      return pending_.empty() || loadHost(&status_->abort) != 0;
    });
  bool drained = failed ? false : pending_.empty();
  if (drained)
    for (uint32_t r = 0; r < ranks_.size(); ++r)
      if (ranks_[r].launched && !hostPoll(config_.hostBudgetMs, [&] {
            return seqGeq(completed(static_cast<int>(r)), ranks_[r].submitted) || loadHost(&status_->abort) != 0;
          }))
        drained = false;
  for (uint32_t r = 0; r < ranks_.size(); ++r) storeHost(&mailboxes_[r].shutdown, 1);
  if (!drained && status_ && loadHost(&status_->abort) == 0) {
    // Ops that can never finish (a rank never submitted its part, or a failure): stop the kernels.
    status_->code = static_cast<uint32_t>(device::Status::HostAbort);
    storeHost(&status_->abort, 1);
  }
  for (auto& rr : ranks_) {
    if (!rr.launched) continue;
    cudaSetDevice(rr.device);
    const bool exited =
        hostPoll(config_.hostBudgetMs, [&] { return cudaStreamQuery(rr.kernelStream) != cudaErrorNotReady; });
    if (!exited) {
      storeHost(&status_->abort, 1);
      if (!hostPoll(config_.hostBudgetMs, [&] { return cudaStreamQuery(rr.kernelStream) != cudaErrorNotReady; })) {
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
  if (link_ && !ranks_[static_cast<size_t>(me_)].launched) {
    // Peers' kernels may still write into this rank's memory (done / abort words) until they stopped:
    // free nothing before every peer's kernel left (bounded; a peer whose process died is not waited for).
    storeHost(&link_->header().stopped[me_], 1);
    hostPoll(config_.hostBudgetMs, [&] {
      for (int q = 0; q < size(); ++q)  // the node's ranks: only they share this segment and map this memory
        if (sameNode(q, me_) && loadHost(&link_->header().stopped[q]) == 0 && !link_->gone(q)) return false;
      return true;
    });
  }
}

void Engine::releaseMemory() noexcept {
  bool stillRunning = false;
  for (const auto& rr : ranks_) stillRunning = stillRunning || rr.launched;
  if (link_ && !stillRunning) link_->closeImports();
  bool anyRunning = false;
  for (const auto& rr : ranks_) anyRunning = anyRunning || rr.launched;
  // Compute lanes: the per-op GemmParams blocks, freed only once no kernel can read them (before the
  // arenas they may be carved from).
  releaseGemmLaneBinders(this, !anyRunning);
  for (auto& kv : cache_) {
    for (size_t r = 0; r < kv.second->devicePrograms.size(); ++r)
      if (r < ranks_.size() && !ranks_[r].launched && kv.second->devicePrograms[r] && ranks_[r].arena) {
        cudaSetDevice(ranks_[r].device >= 0 ? ranks_[r].device : 0);
        ranks_[r].arena->release(kv.second->devicePrograms[r]);
      }
  }
  cache_.clear();
  for (auto& rr : ranks_) {
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
    if (!link_) cudaFreeHost(status_);
    cudaFreeHost(ring_);
    cudaFreeHost(mailboxes_);
    if (trace_) cudaFreeHost(trace_);
    if (clockPing_) cudaFreeHost(clockPing_);
    if (clockPong_) cudaFreeHost(clockPong_);
    if (graphCells_) cudaFreeHost(graphCells_);
    graphCells_ = nullptr;
    status_ = nullptr;
    link_.reset();
  }
  cudaGetLastError();
}

Engine::~Engine() {
  stopProgressThread();
  try {
    std::lock_guard<std::mutex> lock(mu_);
    shutdown();
    releaseMemory();
  } catch (...) {
    std::fprintf(stderr, "mkernel: error while destroying a communicator (ignored)\n");
  }
}

}  // namespace mk::runtime
