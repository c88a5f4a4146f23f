// mkernel — one process per GPU: the post board (each rank posts where its buffers of op k are) and the
// progress thread that writes op k's descriptor once every rank posted it, so a submit never waits for a peer.
#include <cuda_runtime_api.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine.hpp"
#include "engine/host_sync.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

void Engine::postLocked(uint32_t seq, PendingOp& op) {
  const size_t me = static_cast<size_t>(me_);
  OpPost& p = link_->post(seq, me_);
  p.keyHash = op.key.digest();
  std::snprintf(p.what, sizeof p.what, "%s", op.sched->what.c_str());
  p.input = link_->exportPointer(op.input[me], "input");
  p.output = link_->exportPointer(op.output[me], "output");
  op.postedScratch = ranks_[me].scratch[seq % device::kSlots];
  p.scratch = link_->exportPointer(op.postedScratch, "scratch arena");
  p.fence = touchesPreviousLocked(op) ? 1u : 0u;
  storeHost(&p.seq, seq + 1);  // last, with release: peers acquire it first
  op.posted = true;
  progressCv_.notify_all();
}

void Engine::progressLocked() {
  if (!link_ || !poison_.empty()) return;
  const size_t n = ranks_.size();
  const size_t me = static_cast<size_t>(me_);
  try {
    while (!pending_.empty()) {
      auto it = pending_.begin();
      const uint32_t seq = it->first;
      PendingOp& op = it->second;
      if (!op.posted) return;
      // The ranks of this node post on this node's board; ranks of other nodes bind nothing here (the proxy
      // resolves their side with their own bindings), so their entries of the descriptor stay 0.
      std::vector<const OpPost*> posts(n, nullptr);
      for (size_t q = 0; q < n; ++q) {
        if (!sameNode(static_cast<int>(q), me_)) continue;
        const OpPost& p = link_->post(seq, static_cast<int>(q));
        if (loadHost(&p.seq) != seq + 1) return;  // rank q has not submitted op seq yet: never wait for it
        posts[q] = &p;
      }
      bool fence = false;
      std::vector<uint64_t> in(n), out(n), scratch(n);
      MK_CUDA_CHECK(cudaSetDevice(ranks_[me].device));
      for (size_t q = 0; q < n; ++q) {
        if (!posts[q]) continue;
        const OpPost& p = *posts[q];
        if (p.keyHash != posts[me]->keyHash) {
          poisonLocked(
              ErrorCode::InvalidArgument,
              "op " + std::to_string(seq) + " differs between ranks: rank " + std::to_string(me_) + " submitted " +
                  op.sched->what + ", rank " + std::to_string(q) + " submitted " +
                  std::string(p.what, strnlen(p.what, sizeof p.what)) +
                  " (every rank must submit the same collective with the same count, dtype, op and algorithm)");
          return;
        }
        fence = fence || p.fence != 0;
        const int qi = static_cast<int>(q);
        if (q == me) {
          in[q] = reinterpret_cast<uint64_t>(op.input[q]);
          out[q] = reinterpret_cast<uint64_t>(op.output[q]);
          scratch[q] = reinterpret_cast<uint64_t>(op.postedScratch);  // what the peers were told
        } else {
          in[q] = reinterpret_cast<uint64_t>(link_->importPointer(qi, p.input));
          out[q] = reinterpret_cast<uint64_t>(link_->importPointer(qi, p.output));
          scratch[q] = reinterpret_cast<uint64_t>(link_->importPointer(qi, p.scratch));
        }
      }
      // Per-buffer bindings (fused ops) are known for this rank only: the post board carries one input and one
      // output per rank, which is all a peer's steps may reach (the fused schedules never touch a peer's a or b).
      finalizeLocked(seq, *op.sched, in, out, scratch, fence, op.bind);
      pending_.erase(it);
    }
  } catch (const Error& e) {
    poisonLocked(e.code(), e.message());
  }
}

void Engine::pumpLocked() {
  if (!link_) return;
  progressLocked();
  // A host wait (synchronize, a full ring) holds the lock the progress thread's watch needs: watch from here too.
  if (peerWatchDueLocked()) peersGoneLocked(link_->goneRanks());
}

bool Engine::peerWatchDueLocked() {
  if (!link_ || !poison_.empty() || loadHost(&status_->abort) != 0) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now - lastPeerWatch_ < std::chrono::milliseconds(kPeerWatchMs)) return false;
  lastPeerWatch_ = now;
  return true;
}

void Engine::peersGoneLocked(const std::string& gone) {
  // A peer of this node that died (killed, crashed) without stopping its engine can never finish an op, and its
  // memory, which this rank's kernel writes, goes with its process: stop the communicator as soon as it is seen going,
  // naming it, instead of letting every rank's kernel wait out its poll budget.
  if (!gone.empty() && poison_.empty())
    poisonLocked(ErrorCode::IoError, "rank " + std::to_string(me_) + ": the process of " + gone +
                                         " exited without destroying its communicator (killed or crashed?); the "
                                         "ops in flight cannot complete");
}

void Engine::progressThread() {
  std::unique_lock<std::mutex> lock(mu_);
  while (!stopProgress_.load()) {
    if (peerWatchDueLocked()) {  // /proc is read without the lock: a submit never waits for it
      lock.unlock();
      const std::string gone = link_->goneRanks();
      lock.lock();
      peersGoneLocked(gone);
    }
    progressLocked();
    bool waiting = false;
    for (const auto& kv : pending_) waiting = waiting || kv.second.posted;
    if (waiting && poison_.empty()) {
      // A peer's post is due any moment (it is what this rank's kernel waits for): poll, lock released.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      progressCv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
}

void Engine::stopProgressThread() noexcept {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopProgress_ = true;
  }
  progressCv_.notify_all();
  if (progress_.joinable()) progress_.join();
}

std::string Engine::unpostedRanks(uint32_t seq) const {
  std::string missing;
  if (!link_) return missing;
  for (int q = 0; q < size(); ++q)
    if (sameNode(q, me_) && loadHost(&link_->post(seq, q).seq) != seq + 1)
      missing += (missing.empty() ? "" : ", ") + std::to_string(q);
  return missing;
}

}  // namespace mk::runtime
