// mkernel — internal: the engine's progress (engine/engine.hpp maps the parts), one process per GPU only: the post
// board (each rank posts where its buffers of op k are), the progress thread that has op k's descriptor written once
// every rank of the node posted it, so a submit never waits for a peer, and the watch for peers that died.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "engine/engine_context.hpp"
#include "engine/resources.hpp"
#include "mk/error.hpp"

namespace mk::runtime {

/// What the progress part asks of the rest of the engine (the façade answers; every call under the engine's mutex).
class ProgressHost {
 public:
  /// Ops not yet submitted by every rank, by sequence number (the submission's).
  virtual std::map<uint32_t, PendingOp>& pendingOps() = 0;
  /// Write op `seq`'s descriptor (per rank: input, output, scratch; `bind` overrides per buffer).
  virtual void finalize(uint32_t seq, const CachedSchedule& cs, const std::vector<uint64_t>& input,
                        const std::vector<uint64_t>& output, const std::vector<uint64_t>& scratch, bool fence,
                        const std::vector<std::vector<uint64_t>>& bind) = 0;
  /// Whether `op` touches user memory the previous op touched (the fence rule; remembers op's ranges).
  virtual bool touchesPrevious(PendingOp& op) = 0;
  /// Whether the engine is poisoned, and poisoning it (first failure kept; kernels stopped; never throws).
  virtual bool poisoned() const = 0;
  virtual void poison(ErrorCode code, const std::string& message) noexcept = 0;

 protected:
  ~ProgressHost() = default;
};

/// The post board and the progress thread of one process per GPU; in one process every call does nothing.
class EngineProgress {
 public:
  EngineProgress(EngineContext& ctx, ProgressHost& host) : ctx_(ctx), host_(host) {}
  EngineProgress(const EngineProgress&) = delete;
  EngineProgress& operator=(const EngineProgress&) = delete;

  /// Start the progress thread (multi-process, once the kernels run).
  void start();
  /// Stop and join the progress thread (takes the engine's mutex: call it without).
  void stop() noexcept;
  /// Put this rank's part of op `seq` on the post board.
  void postLocked(uint32_t seq, PendingOp& op);
  /// Finalize every posted op every rank of the node has posted (in order). Never blocks on a peer.
  void progressLocked();
  /// Poll-loop hook of host waits: progressLocked() and the peer watch in multi-process mode, nothing otherwise.
  void pumpLocked();
  /// Ranks of this node that have not posted op `seq` yet ("1, 3"; "" in one process).
  std::string unpostedRanks(uint32_t seq) const;

  /// How often peers are looked for (a /proc read per peer of the node).
  static constexpr int kPeerWatchMs = 20;

 private:
  void run();
  /// Whether it is time to look for dead peer processes (every kPeerWatchMs; the progress thread and host waits
  /// look). peersGoneLocked poisons the engine, naming them, when ProcessLink::goneRanks found any.
  bool peerWatchDueLocked();
  void peersGoneLocked(const std::string& gone);

  EngineContext& ctx_;
  ProgressHost& host_;
  std::thread thread_;
  std::atomic<bool> stop_{false};
  std::condition_variable cv_;
  std::chrono::steady_clock::time_point lastPeerWatch_{};  ///< when peers were last looked for
};

}  // namespace mk::runtime
