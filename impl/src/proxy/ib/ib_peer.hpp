// mkernel — internal: one reliable connection of the ibverbs transport and the slot protocol over it
// (docs/inter-node.md, "ibverbs transport"). This is the state machine the transport drives for each peer, written
// against VerbsApi only, so its unit test runs it over an in-memory double.
//
// Each end registers a receive window of `slots` slots of (64 + chunk + 16) bytes, one per frame in flight, and a
// send staging area of the same shape. A frame is the socket transport's frame (wire.hpp: header, payload, trailer)
// laid out in one slot. Frame k goes from send slot k % slots by RDMA WRITE_WITH_IMM (imm = slot) into the remote
// window's slot k % slots; the receiver checks and delivers it in order, posts its receive again and returns the
// slot with a zero-byte SEND_WITH_IMM (imm = slot): a credit. The sender never has more than `slots` frames whose
// credits have not returned, so a slot is never overwritten before it was consumed. A put larger than a chunk
// travels as consecutive Put frames of consecutive byte ranges; only the last carries the signal (RC delivers in
// order, and the receiver finishes each frame's copy before it returns the slot, so the flag follows every byte).
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "mk/error.hpp"
#include "mk/proxy/memory.hpp"
#include "mk/proxy/transport.hpp"
#include "proxy/ib/verbs_api.hpp"
#include "proxy/wire.hpp"

namespace mk::proxy::ib {

inline constexpr uint32_t kEndpointMagic = 0x42494b4du;  ///< "MKIB"

/// What one end tells the other about its side of their connection, all-gathered through the bootstrap: 64 bytes,
/// little-endian (wire.hpp), one per (process, peer).
struct EndpointRecord {
  uint32_t magic;       ///< kEndpointMagic
  uint16_t version;     ///< wire::kProtocolVersion
  uint16_t lid;         ///< port LID (InfiniBand)
  uint32_t process;     ///< the process that sends this record
  uint32_t peer;        ///< the process this end connects to
  uint32_t qpn;         ///< its queue pair number
  uint32_t psn;         ///< its initial send packet sequence number (24 bits)
  uint32_t mtuBytes;    ///< its port's active MTU
  uint32_t slots;       ///< receive window slots
  uint32_t slotBytes;   ///< bytes per slot (64 + chunk + 16)
  uint32_t rkey;        ///< the receive window's remote key
  uint64_t windowAddr;  ///< the receive window's address
  uint8_t gid[16];      ///< port GID (RoCE, global routing)
};
static_assert(sizeof(EndpointRecord) == 64);
static_assert(std::is_trivially_copyable_v<EndpointRecord>);

/// What is wrong with `r` as the record process `from` sent for its connection to `to`, or "".
std::string endpointProblem(const EndpointRecord& r, uint32_t from, uint32_t to);

/// Where a connection is.
enum class PeerState : uint8_t {
  Idle,         ///< nothing created yet
  Created,      ///< queue pair (RESET), window and staging registered, receives posted
  ReadyToSend,  ///< INIT -> RTR -> RTS done: frames flow both ways
  Failed,       ///< a verb, a completion or a frame failed: nothing more is sent
};
const char* toString(PeerState s) noexcept;

/// Options of a connection.
struct PeerOptions {
  uint32_t slots = 16;
  uint32_t chunkBytes = 1u << 20;
  uint8_t port = 1;
  std::chrono::milliseconds budget{10000};  ///< waiting for a free slot or for a write to complete
  bool payloadChecksum = false;
};

/// One connection to process `peer` (may be this process itself).
class IbPeer {
 public:
  IbPeer(VerbsApi& api, int me, int peer, std::string name, PeerOptions options);
  /// Destroys the queue pair and the registrations. Never throws.
  ~IbPeer();
  IbPeer(const IbPeer&) = delete;
  IbPeer& operator=(const IbPeer&) = delete;

  /// Create the queue pair, allocate (from `memory`, so a GPU engine's copies from the window are asynchronous) and
  /// register the receive window and send staging, post the receives. Idle -> Created. Returns this end's record.
  EndpointRecord open(const PortInfo& port, MemoryCopier& memory);
  /// INIT -> RTR (towards `remote`) -> RTS. Created -> ReadyToSend; a failing transition -> Failed and an
  /// Error(IoError) naming the peer and the transition.
  void connect(const EndpointRecord& remote, const PortInfo& port);

  PeerState state() const noexcept;
  uint32_t qpn() const noexcept { return qp_.qpn; }
  const std::string& name() const noexcept { return name_; }
  /// The peer said goodbye / aborted.
  bool goodbyeSeen() const noexcept;
  bool abortSeen() const noexcept;

  // ---- sending (thread-safe; one frame sequence at a time) -------------------------------------------------
  /// Send a put as frames of at most a chunk. Through `stream` into send staging, or, when `srcRegion` is set (the
  /// source lies in that registered region: zero copy; not with payload checksums), gathered straight from the
  /// source. Returns once the source has been read (copied, or its writes completed). Throws Error(Timeout) when no
  /// slot frees within the budget, the error that failed the connection otherwise.
  void sendPut(const PutRequest& put, CopyStream& stream, const MemoryRegion* srcRegion);
  void sendControl(const ControlMessage& message);
  /// Best effort within `wait`; never throws.
  void sendAbort(int fromProcess, const Error& error, std::chrono::milliseconds wait) noexcept;
  void sendGoodbye();

  // ---- progress (one thread) -----------------------------------------------------------------------------------
  /// Handle one completion of this connection's queue pair: a frame landed (checked, delivered to `sink` through
  /// `stream`, its slot returned), a credit came back, a write or send finished. Throws Error for a failed
  /// completion or a bad frame (state Failed); the transport reports it.
  void onCompletion(const Completion& c, ProxySink& sink, CopyStream& stream);
  /// Fail the connection (wakes senders waiting for a slot).
  void fail(const Error& e) noexcept;

 private:
  uint32_t slotBytes() const noexcept { return 64 + opt_.chunkBytes + 16; }
  std::byte* sendSlot(uint32_t slot) const noexcept;
  std::byte* windowSlot(uint32_t slot) const noexcept;
  /// Wait for the next send slot (under sendMu_); returns its index.
  uint32_t takeSlot(std::unique_lock<std::mutex>& sendLock, std::chrono::milliseconds wait);
  /// Take the next send slot (waiting up to `wait`), seal `h` with its frame number (*frame) and lay it in the slot.
  uint32_t beginFrame(wire::FrameHeader& h, std::chrono::milliseconds wait, uint64_t* frame);
  /// Send a frame whose payload (`bytes` of `body`) is copied into its slot, with a checksummed trailer when its type
  /// has one (sequence lock held).
  void sendCopied(wire::FrameHeader h, const void* body, std::size_t bytes, std::chrono::milliseconds wait);
  /// Write the frame laid out in send slot `slot` (header, payload, trailer) or gathered (`payload` set).
  void post(uint32_t slot, uint32_t frameBytes, const Sge* payload);
  void handle(const Completion& c, ProxySink& sink, CopyStream& stream);
  void deliver(uint32_t slot, ProxySink& sink, CopyStream& stream);
  void throwIfFailed();

  VerbsApi& api_;
  int me_, peer_;
  std::string name_;
  PeerOptions opt_;
  MemoryCopier* memory_ = nullptr;
  StagingBuffer window_, staging_;
  MemoryRegion windowMr_{}, stagingMr_{};
  QueuePair qp_{};
  uint32_t psn_ = 0;
  EndpointRecord remote_{};

  mutable std::mutex mu_;  ///< guards everything below
  std::condition_variable cv_;
  PeerState state_ = PeerState::Idle;
  std::string failure_;
  ErrorCode failureCode_ = ErrorCode::IoError;
  uint64_t framesSent_ = 0;      ///< frames posted (slot = framesSent_ % slots)
  uint64_t creditsBack_ = 0;     ///< slots the peer returned
  uint64_t writesDone_ = 0;      ///< write completions seen
  uint64_t framesReceived_ = 0;  ///< frames delivered
  bool goodbyeSeen_ = false, abortSeen_ = false;
  std::mutex sendMu_;  ///< one frame sequence at a time (a put's chunks stay consecutive)
};

}  // namespace mk::proxy::ib
