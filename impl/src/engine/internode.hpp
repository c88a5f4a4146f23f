// mkernel — internal: the engine's side of the inter-node path. The proxy (impl/src/proxy, CUDA-free) moves bytes
// between processes; this is what it asks of a GPU engine:
//  * resolve: a command the rank's kernel pushed (op tag, lane, step, chunk) -> the ProxyPut step of that op's
//    schedule, the chunk's bytes (already staged by the kernel in host memory: fifo_device.hpp) and where they go
//    (rank, buffer, byte offset, flag);
//  * sink: where an arriving put's bytes go (a slot of the rank's receive staging, or a parking buffer while the rank
//    has not submitted the op yet), and the inbox records that make the kernel copy them into place and then raise
//    the flag; the done / entered counts of ranks on other nodes (inbox records too); failures;
//  * the relay, which sends this rank's own done and entered counts (mirrored by the kernel into its mailbox) to the
//    ranks of other nodes, which no store of this GPU can reach; it runs on the proxy's consumer thread
//    (ProxyOptions::poll), so a rank's host side polls with one thread, not two.
// None of it makes a CUDA call while ops run (a caller's thread may hold a driver lock while it waits for the op
// the proxy serves), and none of it takes the engine's mutex (a submitting thread may wait for such an op too).
#pragma once

#include <atomic>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

#include "engine/resources.hpp"
#include "mk/bootstrap.hpp"
#include "mk/communicator.hpp"
#include "mk/proxy/memory.hpp"  // HostCopier: the engine's side of the proxy only touches host memory
#include "mk/proxy/proxy.hpp"
#include "mk/proxy/transport.hpp"

namespace mk::runtime {

struct EngineContext;

/// What the inter-node path keeps of an op of a local rank once its descriptor was written: the schedule and
/// this rank's address and size of every buffer of it.
struct OpBinding {
  uint32_t seq = 0;
  const CachedSchedule* sched = nullptr;
  std::vector<uint64_t> address;  ///< per buffer of the schedule
  std::vector<uint64_t> bytes;    ///< per buffer: its size on this rank
};

/// Control codes between engines (proxy::ControlMessage::code).
enum class RelayCode : uint16_t {
  Done = 1,     ///< value: the sending rank's done count (ops it finished)
  Entered = 2,  ///< value: the sending rank's entered count
};

/// The inter-node path of one engine (one process, one rank in multi-process mode).
class InterNode final : public proxy::ProxyResolver, public proxy::ProxySink {
 public:
  /// Connect the transport (collective over `boot`, like every creation step) and prepare the proxy for the local
  /// ranks' FIFOs. Nothing runs until start(). `ctx`: the engine's ranks and host-mapped blocks (read, never under
  /// its mutex); `describeDeviceFailure`: the engine's words for a failure its kernel reported (the relay's).
  InterNode(EngineContext& ctx, std::function<std::string()> describeDeviceFailure, Bootstrap& boot);
  ~InterNode() override;
  InterNode(const InterNode&) = delete;
  InterNode& operator=(const InterNode&) = delete;

  /// Start the transport's receivers and the proxy's consumer (which runs the relay).
  void start();
  /// Stop the proxy (and with it the relay), then close the transport (goodbyes, bounded). Never throws.
  void stop() noexcept;
  /// Op `seq` of local rank `rank` was bound (its descriptor written) with `table` (the descriptor's bindings of
  /// every rank, nRanks x nBuffers): record this rank's addresses, then apply what arrived for it early.
  void bind(uint32_t rank, uint32_t seq, const CachedSchedule& cs, const uint64_t* table);
  /// A local rank submitted an op: the relay watches its done count closely until it is done.
  void noteSubmitted();
  /// This process failed: tell every other process (once). Never throws.
  void fail(const Error& error) noexcept;
  /// The first failure reported by the transport, a peer or a proxy thread (empty: none).
  std::string failure(ErrorCode* code) const;
  /// The transport's name for the report ("socket", "ibverbs").
  const char* transportName() const noexcept;

  // proxy::ProxyResolver
  proxy::PutRequest resolve(uint32_t rank, const device::ProxyCommand& command, uint64_t position) override;
  // proxy::ProxySink
  void* putDestination(const proxy::PutArrival& put) override;
  void putLanded(const proxy::PutArrival& put) override;
  void control(const proxy::ControlMessage& message) override;
  void failed(const Error& error) noexcept override;

 private:
  /// A put that arrived before its op was bound on this rank: its bytes wait here (host memory).
  struct Parked {
    proxy::PutInfo info;
    int fromProcess = -1;
    std::vector<std::byte> data;
    bool landed = false;  ///< every byte arrived (applied in order once its op is bound)
  };
  /// A put whose bytes are being received into the receive staging (between putDestination and putLanded).
  struct Receiving {
    proxy::PutInfo info;
    int fromProcess = -1;
    uint64_t dst = 0;      ///< device address
    uint64_t offset = 0;   ///< in the receive staging
    uint64_t ringEnd = 0;  ///< the allocation's end (absolute position in the ring)
  };
  /// The rank's receive staging, used as a ring in allocation order: a slot is free again once the kernel took the
  /// Copy record naming it (RankMailbox::inboxTaken passed the record).
  struct ReceiveRing {
    uint64_t head = 0;                               ///< absolute end of the allocations
    uint64_t tail = 0;                               ///< absolute start of what is still in use
    std::deque<std::pair<uint64_t, uint64_t>> used;  ///< (its Copy record's position, UINT64_MAX before; end)
  };
  /// Per local rank.
  struct Local {
    std::map<uint32_t, OpBinding> ops;              ///< bound ops still live (by sequence number)
    std::map<uint32_t, std::deque<Parked>> parked;  ///< by sequence number
    uint64_t parkedBytes = 0;
    std::deque<Receiving> receiving;
    ReceiveRing ring;
    std::mutex inboxMu;  ///< one writer at a time (receivers, the relay, bind())
  };

  /// The binding of op `seq` of local rank `rank`, or null. Caller holds mu_.
  const OpBinding* findOp(uint32_t rank, uint32_t seq) const;
  /// Apply the landed puts parked for op `seq` of `rank` from the front, once the op is bound. Caller holds mu_.
  void applyParkedLocked(uint32_t rank, uint32_t seq);
  /// Write one inbox record for local rank `rank` (bounded wait while the kernel has not taken enough); returns its
  /// position.
  uint64_t pushInbox(uint32_t rank, device::InboxKind kind, uint32_t opTag, uint32_t index, uint64_t value,
                     uint64_t dst = 0, uint64_t src = 0);
  /// `bytes` of the receive staging of local rank `rank` (bounded wait for the kernel to free some). Caller holds
  /// mu_; returns the offset, records the allocation (its record position set by the Copy record).
  uint64_t allocateReceive(uint32_t rank, uint64_t bytes, uint64_t* end);
  /// The Copy record of `bytes` at receive offset `offset` into device address `dst`, then the put's flag. Caller
  /// holds mu_.
  void deliverLocked(uint32_t rank, const proxy::PutInfo& info, uint64_t dst, uint64_t offset, uint64_t bytes,
                     uint64_t ringEnd);
  /// Raise the flag of an arrived (and landed) put on this GPU.
  void raiseFlag(const proxy::PutInfo& info);
  /// The relay, run by the proxy's consumer thread (ProxyOptions::poll): send this rank's done and entered counts
  /// to the ranks of other nodes when they changed, turn a failure of this rank's kernel into the job's. True
  /// while an op this rank submitted is not done (the proxy keeps spinning).
  bool relayOnce();
  Local& local(uint32_t rank);

  EngineContext& ctx_;
  std::function<std::string()> describeDeviceFailure_;
  std::unique_ptr<proxy::MemoryCopier> copier_;
  std::unique_ptr<proxy::Transport> transport_;
  std::unique_ptr<proxy::Proxy> proxy_;
  std::vector<std::unique_ptr<Local>> locals_;  ///< by rank (null for ranks of other processes)
  mutable std::mutex mu_;                       ///< bindings and parked puts of every local rank
  mutable std::mutex failMu_;
  std::string failure_;
  ErrorCode failureCode_ = ErrorCode::Internal;
  std::atomic<uint32_t> submitted_{0};       ///< ops this process's rank submitted (the relay's reason to spin)
  uint32_t sentDone_ = 0, sentEntered_ = 0;  ///< what the relay sent last (the proxy's thread only)
  std::atomic<bool> failedSent_{false};
  bool started_ = false;
};

}  // namespace mk::runtime
