// mkernel — the proxy: one consumer thread per command FIFO turns each command into a put through a Transport.
//
//   pusher (a GPU lane, or a CPU executor lane) --FIFO--> consumer thread --resolver--> PutRequest
//     --Sender (staging, copies)--> Transport --> remote receiver thread --sink--> destination bytes, then flag
//
// The engine plugs in three interfaces: ProxyResolver (command -> what to send), ProxySink (transport.hpp: where
// arrivals go, failures) and MemoryCopier (memory.hpp: copies between engine memory and staging). The CPU
// executor's implementations are in exec_port.hpp; docs/inter-node.md has the GPU engine's contract.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "mk/device/fifo_device.hpp"
#include "mk/proxy/fifo.hpp"
#include "mk/proxy/transport.hpp"

namespace mk {
class Bootstrap;
}

namespace mk::proxy {

/// Turns a command into what to send. Called by every consumer thread (one per FIFO) concurrently: thread-safe.
class ProxyResolver {
 public:
  virtual ~ProxyResolver() = default;
  /// The put that the command at `position` of rank `rank`'s FIFO names (a Put, PutSignal or Signal command; the
  /// proxy handles Flush itself). Throw mk::Error for a command that names no ProxyPut step (the proxy adds rank
  /// and position to the message and fails).
  virtual PutRequest resolve(uint32_t rank, const device::ProxyCommand& command, uint64_t position) = 0;
};

/// Options of a Proxy.
struct ProxyOptions {
  /// Most commands taken from a FIFO at once. `done` passes them together once the batch is handled (and the Sender
  /// flushed), except around a put that streams (over 64 KiB): what precedes it is released before it starts, it is
  /// released once its source has been read.
  uint32_t maxBatch = 32;
  /// CPUs to pin the consumer threads to: thread i (addFifo order) on cpus[i % size]. Empty: not pinned. A CPU the
  /// process may not use is logged and skipped.
  std::vector<int> cpus;
  /// How long a consumer spins on an empty FIFO before it sleeps (on the FIFO's bell when it has one, else in
  /// slices up to maxIdleSleep). A GPU engine that wants the lowest latency spins longer.
  std::chrono::microseconds idleSpin{50};
  /// Longest sleep between two polls of a FIFO without a bell (a GPU's FIFO): the latency an idle proxy adds.
  std::chrono::microseconds maxIdleSleep{100};
  /// How long a claimed position may stay empty while a later one holds a command (a pusher that died between its
  /// claim and its write, or wrote out of order) before the proxy fails with an error naming rank and position.
  std::chrono::milliseconds commandBudget{10000};
  /// Where events worth a line go (pinning failures). Empty: stderr, prefixed "mkernel: ".
  std::function<void(const std::string&)> log;
  /// Host work that belongs beside the FIFO (a GPU engine's relay of its op counters), run on the consumer thread
  /// so that it needs no polling thread of its own: after every command handled and on every round of an idle
  /// FIFO. True: more is due soon, so the consumer keeps spinning instead of sleeping. A throw fails the consumer
  /// like a send's. For a Proxy with one FIFO (every consumer thread would call it).
  std::function<bool()> poll;
};

/// The consumer threads of the FIFOs of this process's ranks. Construct, setPlacement, addFifo for each local
/// rank, start(); stop() before the transport is closed. Not copyable or movable (threads point into it).
class Proxy {
 public:
  /// The referenced objects must outlive the Proxy.
  Proxy(Transport& transport, ProxyResolver& resolver, ProxySink& sink, MemoryCopier& copier,
        ProxyOptions options = {});
  /// stop().
  ~Proxy();
  Proxy(const Proxy&) = delete;
  Proxy& operator=(const Proxy&) = delete;

  /// processOfRank[r]: the transport process that runs rank r (exchangePlacement() builds it). Before start().
  void setPlacement(std::vector<int> processOfRank);
  /// The FIFO of local rank `rank`: one consumer thread serves it from start() on. Before start().
  void addFifo(uint32_t rank, FifoConsumer consumer);
  /// Start the transport's receivers (with the sink and copier) and the consumer threads. Once.
  void start();
  /// Stop the consumer threads (a command being handled finishes first; commands not yet taken stay in their
  /// FIFO). Idempotent; never throws. The transport stays open: close it after.
  void stop() noexcept;
  /// Tell every other process this one failed with `error` (Transport::abortAll).
  void abort(const Error& error) noexcept;
  /// Send `message` to the process of rank `message.dstRank`.
  void sendControl(const ControlMessage& message);
  /// Wake a consumer that sleeps on an idle FIFO without a bell (new work for the poll hook is due). Never blocks.
  void wake() noexcept;
  /// Commands the consumer of `rank`'s FIFO has handled so far (0 for a rank without a FIFO).
  uint64_t handled(uint32_t rank) const noexcept;
  /// The transport process of `rank` (Error(InvalidArgument) for a rank outside the placement).
  int processOf(uint32_t rank) const;

 private:
  struct Consumer;
  void consumerMain(Consumer& c) noexcept;
  std::optional<PutRequest> resolve(Consumer& c, const PoppedCommand& popped);
  void idle(Consumer& c, uint32_t& idleRounds);
  /// Throws Error(Timeout) once next() stayed empty for commandBudget while a later position holds a command.
  void checkGap(Consumer& c, std::chrono::steady_clock::time_point& gapSince);
  void log(const std::string& line) const;

  Transport& transport_;
  ProxyResolver& resolver_;
  ProxySink& sink_;
  MemoryCopier& copier_;
  ProxyOptions opt_;
  std::vector<int> processOfRank_;
  std::vector<std::unique_ptr<Consumer>> consumers_;
  std::atomic<bool> stopping_{false};
  bool started_ = false;
  std::mutex wakeMu_;  ///< with wakeCv_: the idle sleep that wake() cuts short
  std::condition_variable wakeCv_;
  std::atomic<uint64_t> wakes_{0};
};

/// Which process runs which rank, collectively over `bootstrap`: every process passes the ranks it runs; returns
/// processOfRank for ranks 0..nRanks-1 (the process index is the bootstrap rank). Throws Error(InvalidArgument)
/// naming a rank run by two processes, by none, or outside 0..nRanks-1, or processes that disagree on nRanks.
std::vector<int> exchangePlacement(Bootstrap& bootstrap, const std::vector<uint32_t>& myRanks, uint32_t nRanks);

}  // namespace mk::proxy
