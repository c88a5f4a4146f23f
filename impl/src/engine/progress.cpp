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

#include "engine/host_sync.hpp"
#include "engine/progress.hpp"
#include "mk/cuda_check.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

void EngineProgress::postLocked(uint32_t seq, PendingOp& op) {
  const size_t me = static_cast<size_t>(ctx_.me);
  OpPost& p = ctx_.link->post(seq, ctx_.me);
  p.keyHash = op.key.digest();
  std::snprintf(p.what, sizeof p.what, "%s", op.sched->what.c_str());
  p.input = ctx_.link->exportPointer(op.input[me], "input");
  p.output = ctx_.link->exportPointer(op.output[me], "output");
  op.postedScratch = ctx_.ranks[me].scratch[seq % device::kSlots];
  p.scratch = ctx_.link->exportPointer(op.postedScratch, "scratch arena");
  p.fence = host_.touchesPrevious(op) ? 1u : 0u;
  storeHost(&p.seq, seq + 1);  // last, with release: peers acquire it first
  op.posted = true;
  cv_.notify_all();
}

void EngineProgress::progressLocked() {
  if (!ctx_.link || host_.poisoned()) return;
  std::map<uint32_t, PendingOp>& pending = host_.pendingOps();
  const size_t n = ctx_.ranks.size();
  const size_t me = static_cast<size_t>(ctx_.me);
  try {
    while (!pending.empty()) {
      auto it = pending.begin();
      const uint32_t seq = it->first;
      PendingOp& op = it->second;
      if (!op.posted) return;
      // The ranks of this node post on this node's board; ranks of other nodes bind nothing here (the proxy
      // resolves their side with their own bindings), so their entries of the descriptor stay 0.
      std::vector<const OpPost*> posts(n, nullptr);
      for (size_t q = 0; q < n; ++q) {
        if (!ctx_.sameNode(static_cast<int>(q), ctx_.me)) continue;
        const OpPost& p = ctx_.link->post(seq, static_cast<int>(q));
        if (loadHost(&p.seq) != seq + 1) return;  // rank q has not submitted op seq yet: never wait for it
        posts[q] = &p;
      }
      bool fence = false;
      std::vector<uint64_t> in(n), out(n), scratch(n);
      MK_CUDA_CHECK(cudaSetDevice(ctx_.ranks[me].device));
      for (size_t q = 0; q < n; ++q) {
        if (!posts[q]) continue;
        const OpPost& p = *posts[q];
        if (p.keyHash != posts[me]->keyHash) {
          host_.poison(
              ErrorCode::InvalidArgument,
              "op " + std::to_string(seq) + " differs between ranks: rank " + std::to_string(ctx_.me) + " submitted " +
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
          in[q] = reinterpret_cast<uint64_t>(ctx_.link->importPointer(qi, p.input));
          out[q] = reinterpret_cast<uint64_t>(ctx_.link->importPointer(qi, p.output));
          scratch[q] = reinterpret_cast<uint64_t>(ctx_.link->importPointer(qi, p.scratch));
        }
      }
      // Per-buffer bindings (fused ops) are known for this rank only: the post board carries one input and one
      // output per rank, which is all a peer's steps may reach (the fused schedules never touch a peer's a or b).
      host_.finalize(seq, *op.sched, in, out, scratch, fence, op.bind);
      pending.erase(it);
    }
  } catch (const Error& e) {
    host_.poison(e.code(), e.message());
  }
}

void EngineProgress::pumpLocked() {
  if (!ctx_.link) return;
  progressLocked();
  // A host wait (synchronize, a full ring) holds the lock the progress thread's watch needs: watch from here too.
  if (peerWatchDueLocked()) peersGoneLocked(ctx_.link->goneRanks());
}

bool EngineProgress::peerWatchDueLocked() {
  if (!ctx_.link || host_.poisoned() || loadHost(&ctx_.status->abort) != 0) return false;
  const auto now = std::chrono::steady_clock::now();
  if (now - lastPeerWatch_ < std::chrono::milliseconds(kPeerWatchMs)) return false;
  lastPeerWatch_ = now;
  return true;
}

void EngineProgress::peersGoneLocked(const std::string& gone) {
  // A peer of this node that died (killed, crashed) without stopping its engine can never finish an op, and its
  // memory, which this rank's kernel writes, goes with its process: stop the communicator as soon as it is seen going,
  // naming it, instead of letting every rank's kernel wait out its poll budget.
  if (!gone.empty() && !host_.poisoned())
    host_.poison(ErrorCode::IoError, "rank " + std::to_string(ctx_.me) + ": the process of " + gone +
                                         " exited without destroying its communicator (killed or crashed?); the "
                                         "ops in flight cannot complete");
}

void EngineProgress::start() {
  thread_ = std::thread([this] { run(); });
}

void EngineProgress::run() {
  std::unique_lock<std::mutex> lock(ctx_.mu);
  while (!stop_.load()) {
    if (peerWatchDueLocked()) {  // /proc is read without the lock: a submit never waits for it
      lock.unlock();
      const std::string gone = ctx_.link->goneRanks();
      lock.lock();
      peersGoneLocked(gone);
    }
    progressLocked();
    bool waiting = false;
    for (const auto& kv : host_.pendingOps()) waiting = waiting || kv.second.posted;
    if (waiting && !host_.poisoned()) {
      // A peer's post is due any moment (it is what this rank's kernel waits for): poll, lock released.
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
    } else {
      cv_.wait_for(lock, std::chrono::milliseconds(5));
    }
  }
}

void EngineProgress::stop() noexcept {
  {
    std::lock_guard<std::mutex> lock(ctx_.mu);
    stop_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

std::string EngineProgress::unpostedRanks(uint32_t seq) const {
  std::string missing;
  if (!ctx_.link) return missing;
  for (int q = 0; q < ctx_.size(); ++q)
    if (ctx_.sameNode(q, ctx_.me) && loadHost(&ctx_.link->post(seq, q).seq) != seq + 1)
      missing += (missing.empty() ? "" : ", ") + std::to_string(q);
  return missing;
}

}  // namespace mk::runtime
