// mkernel — the host side of the GPU -> CPU command FIFO (mk/device/fifo_device.hpp): the proxy's consumer, which
// works on any FIFO memory (host-mapped pinned memory for a GPU's FIFO), and a FIFO in plain host memory with a host
// pusher that follows the device pusher's protocol (the CPU executor's ProxyPut steps, benchmarks, tests).
//
// Protocol (the same words and orders as the device side):
//  * push: claim a position with a fetch-add on `head`; wait (bounded) while position - done >= capacity, reading
//    `done` only when the cached copy says full; write `arg`, then `header` LAST with release.
//  * pop (one consumer per FIFO): acquire-load the header at the next position's slot; Empty means nothing there
//    yet. Copy the command out, zero the header, handle the command, and only then publish `done` with release:
//    `done` passing a position means the command's source data has been read (the pusher may overwrite it) and
//    its slot is free.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>

#include "mk/device/fifo_device.hpp"

namespace mk::proxy {

/// One command taken from a FIFO, with its position.
struct PoppedCommand {
  uint64_t position = 0;           ///< its FIFO position
  device::ProxyCommand command{};  ///< the record as the pusher wrote it
};

/// Who pushes: named by every error of a bounded wait on the pusher's side.
struct PushSite {
  uint32_t rank = 0;  ///< the pushing rank (the FIFO's owner)
  uint32_t lane = 0;  ///< the pushing lane
  uint32_t step = 0;  ///< the ProxyPut step
};

/// Wakes a sleeping consumer when a host pusher writes a command, and sleeping pushers when the consumer publishes
/// `done`. Only FIFOs with host pushers have one (a GPU pusher cannot notify a condition variable: the proxy polls).
/// Notifying costs a fence and a load while nobody sleeps.
class FifoBell {
 public:
  /// After a command's header is written: wake the consumer if it sleeps.
  void pushed() noexcept;
  /// After `done` is published: wake pushers that sleep.
  void completed() noexcept;
  /// Sleep until pushed() or `timeout`, unless `ready()` holds. `ready` is evaluated after the sleep is announced,
  /// so a push that lands in between is never missed.
  void waitPushed(std::chrono::microseconds timeout, const std::function<bool()>& ready);
  /// Sleep until completed() or `timeout`, unless `ready()` holds (same announcement rule).
  void waitCompleted(std::chrono::microseconds timeout, const std::function<bool()>& ready);

 private:
  std::mutex mu_;
  std::condition_variable pushedCv_, completedCv_;
  std::atomic<int> consumerAsleep_{0}, pushersAsleep_{0};
  uint64_t pushes_ = 0, completions_ = 0;  ///< under mu_: a notification between the check and the wait is kept
};

/// The consumer (proxy) side of one rank's FIFO. It does not own the memory. One thread at a time.
class FifoConsumer {
 public:
  /// No FIFO (valid() is false): a placeholder to assign to.
  FifoConsumer() = default;
  /// `ring` (capacity slots, a power of two) and `done` (written by this consumer only) must outlive it; positions
  /// start at *done. `bell` (may be null) is notified on complete(). Throws Error(InvalidArgument) for a null ring
  /// or done, or a capacity that is not a power of two in [2, 2^24].
  FifoConsumer(device::ProxyCommand* ring, uint64_t* done, uint32_t capacity, FifoBell* bell = nullptr);

  /// Take the commands ready at the next positions, in position order, up to `maxBatch` (stops at the first empty
  /// slot): each taken slot's header is zeroed. Never blocks.
  std::size_t poll(PoppedCommand* out, std::size_t maxBatch) noexcept;
  /// True when a command is ready at next() (what poll() would take first). Never blocks.
  bool ready() const noexcept;
  /// The first position after next() (looking up to `lookahead` ahead) that holds a command while next() does not,
  /// or 0: a pusher claimed next() and has not written it, while a later pusher has. Never blocks.
  uint64_t readyBeyondGap(uint32_t lookahead) const noexcept;
  /// Every command before `endPosition` (<= next()) has been handled: publish done = endPosition (release).
  void complete(uint64_t endPosition) noexcept;
  /// The next position poll() looks at.
  uint64_t next() const noexcept { return next_; }
  /// What this consumer last published as done.
  uint64_t done() const noexcept;
  /// Slots in the ring.
  uint32_t capacity() const noexcept { return capacity_; }
  /// The bell a host pusher rings (null for a device FIFO).
  FifoBell* bell() const noexcept { return bell_; }
  /// False for a default-constructed consumer.
  bool valid() const noexcept { return ring_ != nullptr; }

 private:
  device::ProxyCommand* ring_ = nullptr;
  uint64_t* done_ = nullptr;
  uint32_t capacity_ = 0;
  uint64_t next_ = 0;
  FifoBell* bell_ = nullptr;
};

/// A command FIFO in host memory, with the device pusher's protocol on the host. Pushers may be many threads;
/// the consumer is one (consumer()). Not movable: the consumer and the handle point into it.
class HostFifo {
 public:
  /// `capacity` slots, a power of two in [2, 2^24]; throws Error(InvalidArgument) otherwise.
  explicit HostFifo(uint32_t capacity = 1024);
  /// Frees the ring (no consumer may still use it).
  ~HostFifo();
  HostFifo(const HostFifo&) = delete;
  HostFifo& operator=(const HostFifo&) = delete;

  /// Claim a position, wait while the ring is full, write the command (header last, release) and ring the bell.
  /// Returns the position, or nullopt when `cancelled` (polled while waiting; may be empty) turned true first.
  /// Throws Error(Timeout) after `budget` of a full ring: "rank R lane L step S: the proxy FIFO stayed full for
  /// B ms at position P (done D, capacity C): the proxy stopped answering".
  std::optional<uint64_t> push(const device::ProxyCommand& command, const PushSite& site,
                               std::chrono::milliseconds budget, const std::function<bool()>& cancelled = {});
  /// Wait until `done` passes `position` (the proxy handled that command). False when `cancelled` turned true first.
  /// Throws Error(Timeout) after `budget`: "rank R lane L step S: the proxy has not handled FIFO position P within
  /// B ms (done D): the proxy stopped answering".
  bool waitDone(uint64_t position, const PushSite& site, std::chrono::milliseconds budget,
                const std::function<bool()>& cancelled = {});

  /// The consumer side of this FIFO (one consumer at a time; it starts at the current `done`).
  FifoConsumer consumer();
  /// `done` as published by the consumer (acquire).
  uint64_t done() const noexcept;
  /// The next position a push claims.
  uint64_t head() const noexcept;
  /// Slots in the ring.
  uint32_t capacity() const noexcept { return capacity_; }
  /// The same memory as a device handle (host pointers: for tests and tools that drive it from the host).
  device::ProxyFifoDeviceHandle handle() noexcept;

 private:
  struct Memory;
  std::unique_ptr<Memory> mem_;
  uint32_t capacity_;
  FifoBell bell_;
};

}  // namespace mk::proxy
