// mkernel — one Transport interface between the proxies of the processes of a job, and its two implementations:
// `socket` (TCP, any hosts, processes of one host too) and `ibverbs` (RC queue pairs, where rdma-core and an RDMA
// device exist). docs/inter-node.md describes the wire protocol, the threads and the failure handling.
//
// What crosses: puts (bytes for a destination rank's buffer at a byte offset, then optionally a flag increment once
// every byte landed), signals (a flag increment alone), small typed control messages, and aborts. No addresses
// cross: the receiving side resolves (rank, op tag, buffer, offset) through its sink and checks the range.
#pragma once

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "mk/error.hpp"
#include "mk/proxy/memory.hpp"

namespace mk {
class Bootstrap;
}

namespace mk::proxy {

/// Which transport joins the processes.
enum class TransportKind : uint8_t {
  Auto,     ///< ibverbs when this build has it and every process has an RDMA device, else socket
  Socket,   ///< TCP
  Ibverbs,  ///< rdma-core RC queue pairs
};
/// "auto", "socket", "ibverbs".
const char* toString(TransportKind kind) noexcept;
/// The kind named `s` ("auto", "socket", "ibverbs"), or nullopt.
std::optional<TransportKind> parseTransportKind(std::string_view s) noexcept;
/// parseTransportKind, or Error(InvalidArgument) "unknown <what> '<s>' (expected auto, socket or ibverbs)".
TransportKind requireTransportKind(std::string_view s, std::string_view what = "transport");

/// True when this build has the ibverbs transport (libibverbs found by pkg-config at configure time).
bool ibverbsBuilt() noexcept;
/// Number of RDMA devices this process sees; 0 with `why` filled when the build has no ibverbs, or
/// ibv_get_device_list finds none. Never throws.
int rdmaDeviceCount(std::string* why = nullptr) noexcept;

/// A put (bytes then an optional flag increment) as it crosses between processes: everything but addresses.
struct PutInfo {
  uint32_t srcRank = 0;  ///< the pushing rank
  uint32_t dstRank = 0;  ///< the rank whose buffer receives the bytes and whose flag is raised
  uint32_t opTag = 0;    ///< the op's tag on the pushing rank (the receiver finds the op's bindings by it)
  uint32_t lane = 0;     ///< the pushing lane and step (diagnostics)
  uint32_t step = 0;
  uint16_t dstBuffer = 0;  ///< destination buffer index in the op's schedule
  uint64_t dstOffset = 0;  ///< destination byte offset in that buffer
  uint64_t bytes = 0;      ///< 0: a signal alone
  bool signal = false;     ///< raise flag (dstRank, flagId) by flagValue once every byte landed
  uint32_t flagId = 0;
  uint64_t flagValue = 0;
};

/// A put as the proxy hands it to a transport: where the bytes are read from.
struct PutRequest {
  PutInfo info;
  const void* src = nullptr;  ///< engine memory (host or device: the MemoryCopier knows); null when bytes is 0
};

/// A put arriving at this process.
struct PutArrival {
  PutInfo info;
  int fromProcess = -1;  ///< the sending process (transport index = bootstrap rank)
};

/// A small typed message between the engines of two processes (an op's entered / done notice, ...). The code,
/// values and body are the engine's; the transport carries them in order with the puts of the same sending
/// thread.
struct ControlMessage {
  uint16_t code = 0;     ///< what it is (the engine's numbering)
  uint32_t srcRank = 0;  ///< the engine's; Proxy::sendControl routes by dstRank
  uint32_t dstRank = 0;
  uint32_t opTag = 0;  ///< the op it is about
  uint64_t value = 0;  ///< two values of the engine's
  uint64_t aux = 0;
  std::vector<uint8_t> body;  ///< at most kMaxControlBody bytes
  int fromProcess = -1;       ///< set on arrival
};
/// Largest ControlMessage::body.
inline constexpr std::size_t kMaxControlBody = 64 * 1024;

/// The receiving side of an engine: where arriving puts go and what a failure does. Called from the transport's
/// receiver threads (one per connection) and from the proxy's consumer threads (failed()), concurrently: every
/// method must be thread-safe and must not block on sends of this transport (a receiver that waits for its own
/// connection deadlocks it). A method may block for a bounded time (e.g. until the op a put names is bound); the
/// connection is not read meanwhile, so TCP back-pressure reaches the sender.
class ProxySink {
 public:
  virtual ~ProxySink() = default;
  /// Where the `put.info.bytes` bytes of an arriving put go: resolve (dstRank, opTag, dstBuffer) and check that
  /// [dstOffset, dstOffset + bytes) lies inside. Returns engine memory (written directly when the copier has
  /// directAccess(), else through its copyIn). Throw mk::Error to refuse the put: nothing is written, the
  /// connection is failed and the error reported through failed().
  virtual void* putDestination(const PutArrival& put) = 0;
  /// Every byte of `put` has landed in engine memory (copies complete) — or it had none: raise its flag when
  /// put.info.signal. Called once per put, in arrival order per connection.
  virtual void putLanded(const PutArrival& put) = 0;
  /// A control message from another process (or this one).
  virtual void control(const ControlMessage& message) = 0;
  /// Something failed: a peer aborted or died, a connection broke or stalled, a frame was refused or corrupted, a
  /// proxy thread failed. The engine fails its ops with `error` (the first one matters). Must not throw.
  virtual void failed(const Error& error) noexcept = 0;
};

/// Options of a transport. Every process of a job passes the same kind.
struct TransportOptions {
  TransportKind kind = TransportKind::Auto;
  /// Budget of every bounded wait: connection setup and handshakes, a send that makes no progress (a stalled
  /// peer), a frame that stops arriving half-way, an orderly close.
  std::chrono::milliseconds budget{10000};
  /// socket: the IPv4 address (or host name) this process listens on and tells its peers. Empty: 127.0.0.1 when
  /// every process runs on this host, else the address of this host's name (refused if that is a loopback
  /// address: set it then).
  std::string address;
  /// socket: the TCP port to listen on; 0 = any free port.
  uint16_t port = 0;
  /// Chunk of a put's payload copied through staging (two staging buffers per thread; socket) or one receive
  /// slot (ibverbs). 1 MiB keeps a copy engine and the network both busy (docs/inter-node.md, "Pipelining").
  uint32_t chunkBytes = 1u << 20;
  /// Add a CRC32C of every payload to its trailer and check it on arrival (TCP checksums the bytes in flight;
  /// this also catches a corrupted staging copy). Costs a pass over the data on both sides.
  bool payloadChecksum = false;
  /// The job token every connection must present. Zero: rank 0 draws a random one and the bootstrap shares it.
  std::array<uint64_t, 2> token{};
  /// ibverbs: the device to use ("" = the first one), its port, the receive slots per peer (frames in flight per
  /// connection and direction; each slot holds a chunk).
  std::string ibDevice;
  uint8_t ibPort = 1;     ///< ibverbs: the device's port (1-based)
  uint32_t ibSlots = 16;  ///< ibverbs: receive slots per peer
  /// ibverbs: where the transport's registered host buffers (receive windows, send staging) come from. A GPU engine
  /// passes its MemoryCopier, so those buffers are pinned and its copies from and into them asynchronous. Null: plain
  /// page-aligned host memory.
  MemoryCopier* stagingMemory = nullptr;
  /// Where refused connections and other events worth a line go. Empty: stderr, prefixed "mkernel: ".
  std::function<void(const std::string&)> log;
};

/// One thread's sending side of a transport (its staging buffers and copy stream). Made by Transport::openSender;
/// used by that thread only.
class Sender {
 public:
  virtual ~Sender() = default;
  /// Send `put` to `process` (the destination rank's process; may be this one). Returns once the source has been
  /// read entirely (the FIFO's `done` may pass the command); the bytes land, then the flag is raised, later. Puts
  /// from one Sender to one process land in the order sent. Small ones may wait in this Sender until flush().
  /// Throws mk::Error naming the process when its connection is broken or stalls beyond the budget.
  virtual void put(int process, const PutRequest& put) = 0;
  /// Send what put() left waiting (the proxy calls it after each batch of commands).
  virtual void flush() = 0;
};

/// The connections of one process to every process of the job (itself included: a process may hold several
/// nodes), made by connectTransport().
class Transport {
 public:
  /// close() if it was not called.
  virtual ~Transport() = default;
  /// Socket or Ibverbs (never Auto).
  virtual TransportKind kind() const noexcept = 0;
  /// This process's index (its bootstrap rank).
  virtual int process() const noexcept = 0;
  /// The job's process count.
  virtual int processes() const noexcept = 0;
  /// "process 2 (10.0.0.7:41234)": how errors name a process.
  virtual std::string describeProcess(int process) const = 0;
  /// Start the receivers: arrivals go to `sink`, their bytes through `copier`. Once, before anything is sent.
  virtual void start(ProxySink& sink, MemoryCopier& copier) = 0;
  /// A sending side for the calling thread.
  virtual std::unique_ptr<Sender> openSender(MemoryCopier& copier) = 0;
  /// Engine memory [base, base + bytes) that puts may be sent from without staging copies: host memory (dmabufFd < 0)
  /// or device memory exported as a dma-buf (fd and offset from cuMemGetHandleForAddressRange). Returns true when the
  /// transport will read puts from that range directly (ibverbs: registered with the NIC, ibv_reg_mr or
  /// ibv_reg_dmabuf_mr), false when it keeps staging them (socket: always; ibverbs: the registration failed, logged).
  /// The range must stay valid until close(). Thread-safe.
  virtual bool registerMemory(const void* base, std::size_t bytes, int dmabufFd, uint64_t dmabufOffset) = 0;
  /// Send a control message to `process`. Thread-safe; throws like Sender::put.
  virtual void sendControl(int process, const ControlMessage& message) = 0;
  /// Tell every other process this one failed with `error` (they raise an mk::Error with its code naming this
  /// process). Best effort and bounded; never throws; only the first call sends.
  virtual void abortAll(const Error& error) noexcept = 0;
  /// Orderly close: a goodbye to every process, their goodbyes awaited (bounded), receivers stopped. The sink may
  /// still be called until close() returns. Idempotent; never throws.
  virtual void close() noexcept = 0;
};

/// Build and connect the transport `options.kind` names, collectively over `bootstrap` (every process calls it, in
/// the same order as its other bootstrap calls). Auto is decided together: ibverbs only when every process can.
/// Throws Error(Unsupported) for ibverbs in a build without it or on a machine without an RDMA device ("no RDMA
/// device found; use transport socket"), Error(InvalidArgument) when processes asked for different kinds or bad
/// options, Error(Timeout) naming the processes that never connected (and the connections refused meanwhile),
/// Error(IoError) for socket failures.
std::unique_ptr<Transport> connectTransport(Bootstrap& bootstrap, const TransportOptions& options);

}  // namespace mk::proxy
