// mkernel — the socket (TCP) transport (socket_transport.hpp).
//
// Threads: each Sender belongs to one proxy thread; one receiver thread per connection. A frame is written whole
// under its connection's send lock, so frames of several Senders interleave only at frame boundaries, and the
// receiver applies them in order: a put's bytes are all in the destination (copies complete) before its flag is
// raised, and a put whose frame breaks off (truncated, corrupted, stalled) is never reported as landed.
#include "proxy/socket_transport.hpp"

#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <cstring>
#include <mutex>
#include <optional>
#include <thread>

#include "mk/bootstrap.hpp"
#include "proxy/socket_setup.hpp"
#include "proxy/socket_stream.hpp"
#include "proxy/wire.hpp"

namespace mk::proxy {
namespace {

/// Puts up to this size wait in their Sender until flush(): many small frames go out in one write.
constexpr std::size_t kInlineBytes = 4096;
/// A Sender's waiting frames for one process are written once they reach this size.
constexpr std::size_t kPendingFlushBytes = 256 * 1024;
/// The receiver's read buffer: a burst of small frames arrives with one recv.
constexpr std::size_t kReadBufferBytes = 256 * 1024;
/// How long an abort waits for a connection's send lock before it shuts the connection down instead.
constexpr auto kAbortLockWait = std::chrono::milliseconds(200);

struct Connection {
  int process = 0;
  std::string name;
  int sendFd = -1, recvFd = -1;
  std::timed_mutex sendMu;              ///< a frame is written whole under it
  uint32_t sendSeq = 0;                 ///< under sendMu
  std::atomic<bool> broken{false};      ///< no more puts to it (a send or a receive failed)
  std::atomic<bool> sendFailed{false};  ///< a write failed or stalled: nothing more is written to it
  std::mutex errorMu;
  std::optional<Error> error;  ///< why it broke (under errorMu)
  std::atomic<bool> goodbyeSeen{false}, abortSeen{false};
  std::thread receiver;
  bool receiverDone = true;  ///< under SocketTransport::doneMu_
};

using wire::describePut;

class SocketTransport final : public Transport {
 public:
  SocketTransport(SocketLinks links, const TransportOptions& options)
      : opt_(options), me_(links.process), n_(links.processes) {
    for (int p = 0; p < n_; ++p) {
      auto c = std::make_unique<Connection>();
      c->process = p;
      c->name = links.names[static_cast<std::size_t>(p)];
      c->sendFd = links.sendFd[static_cast<std::size_t>(p)];
      c->recvFd = links.recvFd[static_cast<std::size_t>(p)];
      conns_.push_back(std::move(c));
    }
  }
  ~SocketTransport() override { close(); }

  TransportKind kind() const noexcept override { return TransportKind::Socket; }
  int process() const noexcept override { return me_; }
  int processes() const noexcept override { return n_; }
  std::string describeProcess(int process) const override {
    if (process < 0 || process >= n_) return "process " + std::to_string(process) + " (not in this job)";
    return conns_[static_cast<std::size_t>(process)]->name;
  }

  void start(ProxySink& sink, MemoryCopier& copier) override {
    if (sink_) throw Error(ErrorCode::InvalidArgument, "socket transport: start() called twice");
    sink_ = &sink;
    copier_ = &copier;
    for (auto& c : conns_) {
      Connection* raw = c.get();
      {
        std::lock_guard<std::mutex> lock(doneMu_);
        raw->receiverDone = false;
      }
      c->receiver = std::thread([this, raw] { receiverMain(*raw); });
    }
  }

  std::unique_ptr<Sender> openSender(MemoryCopier& copier) override;

  /// TCP reads the source itself (directly, or through the copier's staging): nothing to register.
  bool registerMemory(const void*, std::size_t, int, uint64_t) override { return false; }

  void sendControl(int process, const ControlMessage& m) override {
    if (m.body.size() > kMaxControlBody)
      throw Error(ErrorCode::InvalidArgument, "socket transport: a control message body of " +
                                                  std::to_string(m.body.size()) + " bytes (at most " +
                                                  std::to_string(kMaxControlBody) + ")");
    Connection& c = connection(process);
    const wire::FrameHeader h = wire::controlHeader(m);
    writeFrame(c, h, m.body.data(), m.body.size());
  }

  void abortAll(const Error& error) noexcept override {
    if (aborted_.exchange(true)) return;
    std::string text = error.message();
    if (text.size() > wire::kMaxAbortBytes) text.resize(wire::kMaxAbortBytes);
    for (auto& cp : conns_) {
      Connection& c = *cp;
      // A connection whose receiving side failed (a corrupted frame from that peer) still carries the abort: that
      // peer learns why it was dropped. One whose sending side failed is cut instead.
      if (c.process == me_) continue;
      if (c.sendFailed.load()) {
        ::shutdown(c.sendFd, SHUT_RDWR);
        continue;
      }
      std::unique_lock<std::timed_mutex> lock(c.sendMu, std::defer_lock);
      if (!lock.try_lock_for(kAbortLockWait)) {
        // A send to it is stuck (a stalled peer): cut the connection, which that process sees as a close without a
        // goodbye.
        ::shutdown(c.sendFd, SHUT_RDWR);
        continue;
      }
      try {
        const wire::FrameHeader h = wire::abortHeader(me_, error.code(), text.size());
        writeFrameLocked(c, h, text.data(), text.size(), std::min(opt_.budget, std::chrono::milliseconds(1000)));
      } catch (const Error&) {
        ::shutdown(c.sendFd, SHUT_RDWR);
      }
    }
  }

  void close() noexcept override;

  // ---- used by SocketSender --------------------------------------------------------------------------------------
  Connection& connection(int process) {
    if (process < 0 || process >= n_)
      throw Error(ErrorCode::InvalidArgument, "socket transport: process " + std::to_string(process) +
                                                  " is not in this job of " + std::to_string(n_) + " processes");
    Connection& c = *conns_[static_cast<std::size_t>(process)];
    throwIfBroken(c);
    return c;
  }
  void throwIfBroken(Connection& c) {
    if (closed_.load())
      throw Error(ErrorCode::InvalidArgument, "socket transport: sending to " + c.name + " after close()");
    if (!c.broken.load()) return;
    std::lock_guard<std::mutex> lock(c.errorMu);
    throw *c.error;
  }
  /// Record why `c` broke (the first reason stays) and return it.
  Error markBroken(Connection& c, const Error& e) {
    std::lock_guard<std::mutex> lock(c.errorMu);
    if (!c.error) c.error = e;
    c.broken.store(true);
    return *c.error;
  }
  /// Write one frame with an optional payload and its trailer, whole, under the connection's lock.
  void writeFrame(Connection& c, wire::FrameHeader h, const void* payload, std::size_t bytes) {
    std::lock_guard<std::timed_mutex> lock(c.sendMu);
    writeFrameLocked(c, h, payload, bytes, opt_.budget);
  }
  void writeFrameLocked(Connection& c, wire::FrameHeader h, const void* payload, std::size_t bytes,
                        std::chrono::milliseconds budget) {
    const uint32_t seq = c.sendSeq++;
    const bool checksum = (h.flags & wire::kFrameChecksum) != 0;
    wire::sealFrame(h, seq);
    wire::FrameTrailer t{wire::kTrailerMagic, seq, checksum ? wire::crc32c(payload, bytes) : 0, 0};
    iovec iov[3] = {{&h, sizeof h}, {const_cast<void*>(payload), bytes}, {&t, sizeof t}};
    const int count = wire::hasTrailer(static_cast<wire::FrameType>(h.type)) ? 3 : 1;
    sendOrBreak(c, iov, count, budget);
  }
  void sendOrBreak(Connection& c, iovec* iov, int count, std::chrono::milliseconds budget) {
    try {
      writeAll(c.sendFd, iov, count, budget, "socket transport: " + c.name);
    } catch (const Error& e) {
      c.sendFailed.store(true);
      throw markBroken(c, e);
    }
  }
  const TransportOptions& options() const noexcept { return opt_; }

 private:
  void receiverMain(Connection& c) noexcept;
  void receivePut(Connection& c, FrameReader& reader, const wire::FrameHeader& h, uint32_t seq, CopyStream& stream,
                  StagingBuffer* staging);
  void readTrailer(Connection& c, FrameReader& reader, const wire::FrameHeader& h, uint32_t seq, uint32_t crc);
  void receiverFailed(Connection& c, const Error& e) noexcept;
  void log(const std::string& line) const {
    if (opt_.log)
      opt_.log(line);
    else
      std::fprintf(stderr, "mkernel: %s\n", line.c_str());
  }

  TransportOptions opt_;
  int me_, n_;
  std::vector<std::unique_ptr<Connection>> conns_;
  ProxySink* sink_ = nullptr;
  MemoryCopier* copier_ = nullptr;
  std::atomic<bool> aborted_{false}, closing_{false}, closed_{false}, stopReceivers_{false};
  std::mutex doneMu_;
  std::condition_variable doneCv_;
};

// ---- sending ---------------------------------------------------------------------------------------------------

class SocketSender final : public Sender {
 public:
  SocketSender(SocketTransport& t, MemoryCopier& copier)
      : t_(t),
        copier_(copier),
        stream_(copier.openStream()),
        pending_(static_cast<std::size_t>(t.processes())),
        frames_(static_cast<std::size_t>(t.processes())) {}

  void put(int process, const PutRequest& req) override {
    Connection& c = t_.connection(process);
    const PutInfo& p = req.info;
    const bool checksum = t_.options().payloadChecksum;
    wire::FrameHeader h = wire::putHeader(p, checksum);
    if (p.bytes <= kInlineBytes) {
      appendSmall(c, h, req);
      return;
    }
    if (copier_.directAccess())
      putDirect(c, h, req, checksum);
    else
      putStaged(c, h, req, checksum);
  }

  void flush() override {
    for (int p = 0; p < static_cast<int>(pending_.size()); ++p)
      if (!pending_[static_cast<std::size_t>(p)].empty()) {
        Connection& c = t_.connection(p);
        std::lock_guard<std::timed_mutex> lock(c.sendMu);
        flushLocked(c);
      }
  }

 private:
  /// Frames waiting for `c`: sequence numbers and CRCs are filled when they are written (under the lock).
  void flushLocked(Connection& c) {
    auto& buf = pending_[static_cast<std::size_t>(c.process)];
    auto& frames = frames_[static_cast<std::size_t>(c.process)];
    if (buf.empty()) return;
    for (const auto& [headerAt, trailerAt] : frames) {
      wire::FrameHeader h;
      std::memcpy(&h, buf.data() + headerAt, sizeof h);
      const uint32_t seq = c.sendSeq++;
      wire::sealFrame(h, seq);
      std::memcpy(buf.data() + headerAt, &h, sizeof h);
      if (trailerAt != SIZE_MAX) {
        wire::FrameTrailer t;
        std::memcpy(&t, buf.data() + trailerAt, sizeof t);
        t.seq = seq;
        std::memcpy(buf.data() + trailerAt, &t, sizeof t);
      }
    }
    iovec iov{buf.data(), buf.size()};
    buf.clear();
    frames.clear();
    t_.sendOrBreak(c, &iov, 1, t_.options().budget);
  }

  std::byte* stagingBuffer(int i) {
    if (!staging_[i].data()) staging_[i] = StagingBuffer(copier_, t_.options().chunkBytes);
    return staging_[i].data();
  }

  void appendSmall(Connection& c, const wire::FrameHeader& h, const PutRequest& req) {
    auto& buf = pending_[static_cast<std::size_t>(c.process)];
    const std::size_t bytes = req.info.bytes;
    const std::size_t headerAt = buf.size();
    buf.resize(headerAt + sizeof h + (bytes ? bytes + sizeof(wire::FrameTrailer) : 0));
    std::memcpy(buf.data() + headerAt, &h, sizeof h);
    std::size_t trailerAt = SIZE_MAX;
    if (bytes) {
      uint8_t* payload = buf.data() + headerAt + sizeof h;
      if (copier_.directAccess()) {
        std::memcpy(payload, req.src, bytes);
      } else {
        std::byte* s = stagingBuffer(0);
        stream_->wait(stream_->copyOut(s, req.src, bytes), t_.options().budget);
        std::memcpy(payload, s, bytes);
      }
      trailerAt = headerAt + sizeof h + bytes;
      const bool checksum = (h.flags & wire::kFrameChecksum) != 0;
      const wire::FrameTrailer t{wire::kTrailerMagic, 0, checksum ? wire::crc32c(payload, bytes) : 0, 0};
      std::memcpy(buf.data() + trailerAt, &t, sizeof t);
    }
    frames_[static_cast<std::size_t>(c.process)].emplace_back(headerAt, trailerAt);
    if (buf.size() >= kPendingFlushBytes) {
      std::lock_guard<std::timed_mutex> lock(c.sendMu);
      flushLocked(c);
    }
  }

  void putDirect(Connection& c, wire::FrameHeader h, const PutRequest& req, bool checksum) {
    const auto* src = static_cast<const uint8_t*>(req.src);
    const std::size_t bytes = req.info.bytes;
    const uint32_t crc = checksum ? wire::crc32c(src, bytes) : 0;
    std::lock_guard<std::timed_mutex> lock(c.sendMu);
    flushLocked(c);  // frames this Sender queued earlier go first
    const uint32_t seq = c.sendSeq++;
    wire::sealFrame(h, seq);
    wire::FrameTrailer t{wire::kTrailerMagic, seq, crc, 0};
    iovec iov[3] = {{&h, sizeof h}, {const_cast<uint8_t*>(src), bytes}, {&t, sizeof t}};
    t_.sendOrBreak(c, iov, 3, t_.options().budget);
  }

  /// Double-buffered: the copy of chunk k+1 into staging runs while chunk k is on the wire.
  void putStaged(Connection& c, wire::FrameHeader h, const PutRequest& req, bool checksum) {
    const auto* src = static_cast<const std::byte*>(req.src);
    const uint64_t bytes = req.info.bytes;
    const uint64_t chunk = t_.options().chunkBytes;
    const uint64_t chunks = (bytes + chunk - 1) / chunk;
    auto chunkSize = [&](uint64_t k) { return std::min(chunk, bytes - k * chunk); };
    uint64_t ticket[2] = {0, 0};
    ticket[0] = stream_->copyOut(stagingBuffer(0), src, chunkSize(0));
    std::lock_guard<std::timed_mutex> lock(c.sendMu);
    flushLocked(c);
    const uint32_t seq = c.sendSeq++;
    wire::sealFrame(h, seq);
    iovec head{&h, sizeof h};
    t_.sendOrBreak(c, &head, 1, t_.options().budget);
    uint32_t crc = 0;
    for (uint64_t k = 0; k < chunks; ++k) {
      const int slot = static_cast<int>(k & 1);
      if (k + 1 < chunks)
        ticket[1 - slot] = stream_->copyOut(stagingBuffer(1 - slot), src + (k + 1) * chunk, chunkSize(k + 1));
      stream_->wait(ticket[slot], t_.options().budget);
      std::byte* s = stagingBuffer(slot);
      if (checksum) crc = wire::crc32c(s, chunkSize(k), crc);
      iovec body{s, chunkSize(k)};
      t_.sendOrBreak(c, &body, 1, t_.options().budget);
    }
    wire::FrameTrailer t{wire::kTrailerMagic, seq, crc, 0};
    iovec tail{&t, sizeof t};
    t_.sendOrBreak(c, &tail, 1, t_.options().budget);
  }

  SocketTransport& t_;
  MemoryCopier& copier_;
  std::unique_ptr<CopyStream> stream_;
  StagingBuffer staging_[2];
  std::vector<std::vector<uint8_t>> pending_;                             ///< per process
  std::vector<std::vector<std::pair<std::size_t, std::size_t>>> frames_;  ///< per process: (header, trailer) offsets
};

std::unique_ptr<Sender> SocketTransport::openSender(MemoryCopier& copier) {
  return std::make_unique<SocketSender>(*this, copier);
}

// ---- receiving -------------------------------------------------------------------------------------------------

void SocketTransport::readTrailer(Connection& c, FrameReader& reader, const wire::FrameHeader& h, uint32_t seq,
                                  uint32_t crc) {
  wire::FrameTrailer t{};
  reader.readExact(&t, sizeof t, "the trailer of frame " + std::to_string(seq));
  const std::string problem = wire::trailerProblem(t, seq, (h.flags & wire::kFrameChecksum) != 0, crc);
  if (!problem.empty())
    throw Error(ErrorCode::ParseError, "socket transport: frame " + std::to_string(seq) + " (" +
                                           wire::toString(static_cast<wire::FrameType>(h.type)) + ") from " + c.name +
                                           ": " + problem);
}

void SocketTransport::receivePut(Connection& c, FrameReader& reader, const wire::FrameHeader& h, uint32_t seq,
                                 CopyStream& stream, StagingBuffer* staging) {
  PutArrival a;
  a.info = wire::putInfo(h);
  a.fromProcess = c.process;
  void* dstVoid = nullptr;
  try {
    dstVoid = sink_->putDestination(a);
  } catch (const Error& e) {
    throw Error(e.code(), "socket transport: " + c.name + " sent a put this process refuses (" + describePut(a.info) +
                              "): " + e.message());
  }
  auto* dst = static_cast<std::byte*>(dstVoid);
  const bool checksum = (h.flags & wire::kFrameChecksum) != 0;
  const uint64_t bytes = h.bytes;
  const uint64_t chunk = opt_.chunkBytes;
  const std::string what = "the payload of frame " + std::to_string(seq) + " (" + describePut(a.info) + ")";
  uint32_t crc = 0;
  if (copier_->directAccess()) {
    for (uint64_t off = 0; off < bytes; off += chunk) {
      const uint64_t n = std::min(chunk, bytes - off);
      reader.readExact(dst + off, n, what, off, bytes);
      if (checksum) crc = wire::crc32c(dst + off, n, crc);
    }
  } else {
    uint64_t ticket[2] = {0, 0};
    uint64_t k = 0;
    for (uint64_t off = 0; off < bytes; off += chunk, ++k) {
      const int slot = static_cast<int>(k & 1);
      const uint64_t n = std::min(chunk, bytes - off);
      if (!staging[slot].data()) staging[slot] = StagingBuffer(*copier_, chunk);
      if (ticket[slot]) stream.wait(ticket[slot], opt_.budget);  // its previous chunk is in the destination
      reader.readExact(staging[slot].data(), n, what, off, bytes);
      if (checksum) crc = wire::crc32c(staging[slot].data(), n, crc);
      ticket[slot] = stream.copyIn(dst + off, staging[slot].data(), n);
    }
    const uint64_t last = std::max(ticket[0], ticket[1]);
    if (last) stream.wait(last, opt_.budget);
  }
  readTrailer(c, reader, h, seq, crc);
  sink_->putLanded(a);
}

void SocketTransport::receiverFailed(Connection& c, const Error& e) noexcept {
  const Error error = markBroken(c, e);
  if (closing_.load()) {
    log(error.message() + " (while closing)");
    return;
  }
  sink_->failed(error);
  abortAll(error);
}

void SocketTransport::receiverMain(Connection& c) noexcept {
  try {
    FrameReader reader(c.recvFd, kReadBufferBytes, opt_.budget, "socket transport: " + c.name);
    std::unique_ptr<CopyStream> stream = copier_->openStream();
    StagingBuffer staging[2];
    for (uint32_t seq = 0;; ++seq) {
      wire::FrameHeader h{};
      if (!reader.readFrameStart(&h, sizeof h, stopReceivers_)) {
        if (c.goodbyeSeen.load() || c.abortSeen.load() || closing_.load() || c.broken.load()) break;
        throw Error(ErrorCode::IoError,
                    "socket transport: " + c.name + " closed the connection without a goodbye (did that process die?)");
      }
      const std::string problem = wire::frameProblem(h, seq);
      if (!problem.empty())
        throw Error(ErrorCode::ParseError,
                    "socket transport: frame " + std::to_string(seq) + " from " + c.name + ": " + problem);
      const auto type = static_cast<wire::FrameType>(h.type);
      if (c.goodbyeSeen.load())
        throw Error(ErrorCode::ParseError, std::string("socket transport: ") + c.name + " sent a " +
                                               wire::toString(type) + " frame after its goodbye");
      switch (type) {
        case wire::FrameType::Put: receivePut(c, reader, h, seq, *stream, staging); break;
        case wire::FrameType::Signal: {
          PutArrival a;
          a.info = wire::putInfo(h);
          a.fromProcess = c.process;
          sink_->putLanded(a);
          break;
        }
        case wire::FrameType::Control: {
          ControlMessage m = wire::controlMessage(h, c.process);
          m.body.resize(h.bytes);
          reader.readExact(m.body.data(), m.body.size(), "the body of control frame " + std::to_string(seq));
          readTrailer(c, reader, h, seq, wire::crc32c(m.body.data(), m.body.size()));
          sink_->control(m);
          break;
        }
        case wire::FrameType::Abort: {
          std::string text(h.bytes, '\0');
          reader.readExact(text.data(), text.size(), "the text of abort frame " + std::to_string(seq));
          readTrailer(c, reader, h, seq, wire::crc32c(text.data(), text.size()));
          c.abortSeen.store(true);
          const Error e(wire::abortCode(h), "socket transport: " + c.name + " failed: " + text);
          markBroken(c, e);
          if (!closing_.load()) sink_->failed(e);
          break;
        }
        case wire::FrameType::Goodbye: c.goodbyeSeen.store(true); break;
      }
    }
  } catch (const Error& e) {
    receiverFailed(c, e);
  } catch (const std::exception& e) {
    receiverFailed(c, Error(ErrorCode::Internal, "socket transport: receiving from " + c.name + ": " + e.what()));
  }
  std::lock_guard<std::mutex> lock(doneMu_);
  c.receiverDone = true;
  doneCv_.notify_all();
}

// ---- closing ---------------------------------------------------------------------------------------------------

void SocketTransport::close() noexcept {
  if (closed_.exchange(true)) return;
  closing_.store(true);
  for (auto& cp : conns_) {
    Connection& c = *cp;
    if (!c.sendFailed.load()) {
      std::unique_lock<std::timed_mutex> lock(c.sendMu, std::defer_lock);
      if (lock.try_lock_for(opt_.budget)) {
        try {
          wire::FrameHeader h{};
          h.type = static_cast<uint8_t>(wire::FrameType::Goodbye);
          writeFrameLocked(c, h, nullptr, 0, opt_.budget);
        } catch (const Error& e) {
          log(e.message() + " (sending the goodbye)");
        }
      }
    }
    ::shutdown(c.sendFd, SHUT_WR);  // after the goodbye: the peer reads it, then the end of the stream
  }
  // Wait for every peer's goodbye and end of stream, so no connection is closed with unread bytes (which would
  // reset it under the peer's feet).
  {
    std::unique_lock<std::mutex> lock(doneMu_);
    const bool all = doneCv_.wait_for(lock, opt_.budget, [&] {
      for (auto& c : conns_)
        if (!c->receiverDone) return false;
      return true;
    });
    if (!all) {
      std::string late;
      for (auto& c : conns_)
        if (!c->receiverDone) late += (late.empty() ? "" : ", ") + c->name;
      log("socket transport: no goodbye from " + late + " within " + std::to_string(opt_.budget.count()) +
          " ms of close(); closing anyway");
    }
  }
  stopReceivers_.store(true);
  for (auto& c : conns_) {
    ::shutdown(c->recvFd, SHUT_RDWR);
    if (c->receiver.joinable()) c->receiver.join();
  }
  for (auto& c : conns_) {
    if (c->sendFd >= 0) ::close(c->sendFd);
    if (c->recvFd >= 0 && c->recvFd != c->sendFd) ::close(c->recvFd);
    c->sendFd = c->recvFd = -1;
  }
}

}  // namespace

std::unique_ptr<Transport> connectSocketTransport(Bootstrap& bootstrap, const TransportOptions& options) {
  if (options.chunkBytes < 4096)
    throw Error(ErrorCode::InvalidArgument,
                "socket transport: chunkBytes must be >= 4096 (got " + std::to_string(options.chunkBytes) + ")");
  std::function<void(const std::string&)> log = options.log;
  if (!log) log = [](const std::string& line) { std::fprintf(stderr, "mkernel: %s\n", line.c_str()); };
  SocketLinks links = connectSockets(bootstrap, options, log);
  return std::make_unique<SocketTransport>(std::move(links), options);
}

}  // namespace mk::proxy
