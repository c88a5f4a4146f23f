// Test helpers for the inter-node path: a sink over host buffers that records what arrives (a real ProxySink for
// host memory, as the CPU executor's port is), transport options for tests, and a hand-made peer that speaks the
// wire protocol byte by byte (to send what a correct process never sends: another version, a wrong token, a
// corrupted or truncated frame).
#pragma once

#include <doctest/doctest.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <condition_variable>
#include <cstring>
#include <functional>
#include <map>
#include <mutex>
#include <string>
#include <vector>

#include "mk/bootstrap.hpp"
#include "mk/error.hpp"
#include "mk/proxy/transport.hpp"
#include "mk/util/range.hpp"
#include "multiprocess_launch.hpp"
#include "net/socket_util.hpp"
#include "proxy/wire.hpp"

namespace mkt {

inline bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

/// The byte a test put writes at offset i: depends on the sender, the put and the offset, so a byte from the wrong
/// put, a shifted or a missing byte is caught.
inline std::byte patternByte(uint32_t srcRank, uint32_t put, uint64_t i) {
  return static_cast<std::byte>((srcRank * 131u + put * 17u + i * 7u + (i >> 8)) & 0xffu);
}

/// A ProxySink over host buffers, recording what arrives. Thread-safe.
class HostSink final : public mk::proxy::ProxySink {
 public:
  void addBuffer(uint32_t rank, uint16_t buffer, std::size_t bytes) {
    std::lock_guard<std::mutex> lock(mu_);
    buffers_[{rank, buffer}].assign(bytes, std::byte{0});
  }
  std::vector<std::byte>& buffer(uint32_t rank, uint16_t buffer) {
    std::lock_guard<std::mutex> lock(mu_);
    return buffers_.at({rank, buffer});
  }

  void* putDestination(const mk::proxy::PutArrival& a) override {
    if (beforeDestination) beforeDestination(a);
    std::lock_guard<std::mutex> lock(mu_);
    const auto it = buffers_.find({a.info.dstRank, a.info.dstBuffer});
    if (it == buffers_.end())
      throw mk::Error(mk::ErrorCode::InvalidArgument,
                      "no buffer " + std::to_string(a.info.dstBuffer) + " on rank " + std::to_string(a.info.dstRank));
    if (!mk::rangeInside(a.info.dstOffset, a.info.bytes, it->second.size()))
      throw mk::Error(mk::ErrorCode::InvalidArgument, "bytes " + mk::rangeText(a.info.dstOffset, a.info.bytes) +
                                                          " outside the buffer of " +
                                                          std::to_string(it->second.size()) + " bytes");
    return it->second.data() + a.info.dstOffset;
  }
  void putLanded(const mk::proxy::PutArrival& a) override {
    std::string problem;
    if (onLanded) problem = onLanded(a);
    std::lock_guard<std::mutex> lock(mu_);
    if (!problem.empty()) problems.push_back(problem);
    arrivals.push_back(a);
    cv_.notify_all();
  }
  void control(const mk::proxy::ControlMessage& m) override {
    std::lock_guard<std::mutex> lock(mu_);
    controls.push_back(m);
    cv_.notify_all();
  }
  void failed(const mk::Error& e) noexcept override {
    std::lock_guard<std::mutex> lock(mu_);
    failures.push_back(e);
    cv_.notify_all();
  }
  /// Wait until `done()` (evaluated under the lock) or `seconds` pass; true when done.
  bool waitFor(const std::function<bool()>& done, double seconds) {
    std::unique_lock<std::mutex> lock(mu_);
    return cv_.wait_for(lock, std::chrono::duration<double>(seconds), done);
  }

  /// Runs first in putDestination (outside the lock): a test makes the receiver slow here.
  std::function<void(const mk::proxy::PutArrival&)> beforeDestination;
  /// Checks a landed put against what it should carry; returns "" or the problem (recorded in `problems`).
  std::function<std::string(const mk::proxy::PutArrival&)> onLanded;
  std::vector<mk::proxy::PutArrival> arrivals;
  std::vector<mk::proxy::ControlMessage> controls;
  std::vector<mk::Error> failures;
  std::vector<std::string> problems;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  std::map<std::pair<uint32_t, uint16_t>, std::vector<std::byte>> buffers_;
};

/// 0 when `sink` hears a failure within `seconds` whose message holds every one of `parts` and no put was reported
/// landed (printed under `who`); else 2 (no failure), 3 (another message) or 4 (something landed).
inline int expectFailure(HostSink& sink, const std::string& who, std::initializer_list<std::string> parts,
                         double seconds = 5) {
  const auto t0 = std::chrono::steady_clock::now();
  if (!sink.waitFor([&] { return !sink.failures.empty(); }, seconds)) {
    std::fprintf(stderr, "%s: no failure within %.1f s\n", who.c_str(), seconds);
    return 2;
  }
  const mk::Error& e = sink.failures.front();
  std::fprintf(stderr, "%s (%.2f s): %s\n", who.c_str(),
               std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), e.what());
  for (const std::string& part : parts)
    if (!contains(e.message(), part)) return 3;
  return sink.arrivals.empty() ? 0 : 4;
}

/// Transport options for tests: socket, a short budget, log lines collected in `log` (and echoed to stderr).
/// The ranks of `node` in `nodeOf` (node of each rank), in rank order: what one process of a multi-node test runs.
inline std::vector<uint32_t> ranksOf(const std::vector<uint32_t>& nodeOf, int node) {
  std::vector<uint32_t> mine;
  for (uint32_t r = 0; r < nodeOf.size(); ++r)
    if (nodeOf[r] == static_cast<uint32_t>(node)) mine.push_back(r);
  return mine;
}

inline mk::proxy::TransportOptions socketOptions(std::vector<std::string>* log, int budgetMs = 2000) {
  mk::proxy::TransportOptions o;
  o.kind = mk::proxy::TransportKind::Socket;
  o.budget = std::chrono::milliseconds(budgetMs);
  o.address = "127.0.0.1";
  o.chunkBytes = 64 * 1024;
  auto mu = std::make_shared<std::mutex>();
  o.log = [log, mu](const std::string& line) {
    std::fprintf(stderr, "log: %s\n", line.c_str());
    std::lock_guard<std::mutex> lock(*mu);
    if (log) log->push_back(line);
  };
  return o;
}

/// A process that joins the bootstrap like a socket transport would (the kind exchange, host names, its address
/// record) and then speaks the wire protocol by hand.
class FakePeer {
 public:
  /// Join: `record` may be edited (a wrong version) before it is shared.
  FakePeer(mk::Bootstrap& boot, const std::function<void(mk::proxy::wire::AddressRecord&)>& edit = {}) : boot_(boot) {
    const uint8_t kind[2] = {static_cast<uint8_t>(mk::proxy::TransportKind::Socket), 0};
    boot.allGather(kind, sizeof kind);
    char host[64] = {};
    ::gethostname(host, sizeof host - 1);
    boot.allGather(host, sizeof host);
    listener_ = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = mk::net::resolveIPv4("127.0.0.1", 0, "fake", "address");
    ::bind(listener_, reinterpret_cast<sockaddr*>(&a), sizeof a);
    ::listen(listener_, 4);
    socklen_t len = sizeof a;
    ::getsockname(listener_, reinterpret_cast<sockaddr*>(&a), &len);
    mk::proxy::wire::AddressRecord mine{};
    mine.magic = mk::proxy::wire::kAddressMagic;
    mine.version = mk::proxy::wire::kProtocolVersion;
    mine.port = ntohs(a.sin_port);
    mine.ipv4 = a.sin_addr.s_addr;
    mine.process = static_cast<uint32_t>(boot.rank());
    if (edit) edit(mine);
    const std::vector<uint8_t> all = boot.allGather(&mine, sizeof mine);
    records_.resize(static_cast<std::size_t>(boot.size()));
    std::memcpy(records_.data(), all.data(), all.size());
  }
  /// Another connection of the same hand-made process: shares its records, joins nothing, owns no socket yet.
  FakePeer(const FakePeer& same) : boot_(same.boot_), records_(same.records_) {}
  FakePeer& operator=(const FakePeer&) = delete;
  ~FakePeer() {
    if (fd_ >= 0) ::close(fd_);
    if (listener_ >= 0) ::close(listener_);
  }

  const uint64_t* token() const { return records_[0].token; }
  /// Connect to process `p` and send a handshake (edited by `edit`); returns the answer.
  mk::proxy::wire::Hello connect(int p, const std::function<void(mk::proxy::wire::Hello&)>& edit = {}) {
    fd_ = connectTo(records_[static_cast<std::size_t>(p)]);
    mk::proxy::wire::Hello h =
        mk::proxy::wire::makeHello(mk::proxy::wire::HelloKind::Hello, static_cast<uint32_t>(boot_.rank()),
                                   static_cast<uint32_t>(p), static_cast<uint32_t>(boot_.size()), token());
    if (edit) {
      edit(h);
      h.crc = 0;
      h.crc = mk::proxy::wire::crc32c(&h, sizeof h);
    }
    sendRaw(&h, sizeof h);
    mk::proxy::wire::Hello answer{};
    recvRaw(&answer, sizeof answer);
    return answer;
  }
  /// Connect to process `p` without a handshake.
  void connectRaw(int p) { fd_ = connectTo(records_[static_cast<std::size_t>(p)]); }
  /// Send a goodbye with sequence `seq`, wait for the peer's end of stream, close.
  void goodbye(uint32_t seq) {
    const mk::proxy::wire::FrameHeader bye = frame(mk::proxy::wire::FrameType::Goodbye, seq);
    sendRaw(&bye, sizeof bye);
    closedWithin(5);
    closeConnection();
  }
  /// A sealed frame header with sequence `seq`.
  static mk::proxy::wire::FrameHeader frame(mk::proxy::wire::FrameType type, uint32_t seq,
                                            const std::function<void(mk::proxy::wire::FrameHeader&)>& edit = {}) {
    mk::proxy::wire::FrameHeader h{};
    h.type = static_cast<uint8_t>(type);
    if (edit) edit(h);
    mk::proxy::wire::sealFrame(h, seq);
    return h;
  }
  void sendRaw(const void* data, std::size_t n) {
    const auto deadline = mk::net::deadlineAfter(5000);
    mk::net::sendAll(fd_, data, n, deadline, "fake peer", "its peer");
  }
  void recvRaw(void* data, std::size_t n) {
    const auto deadline = mk::net::deadlineAfter(5000);
    mk::net::recvAll(fd_, data, n, deadline, "fake peer", "its peer");
  }
  /// True when the peer closed the connection within `seconds` (reads and drops whatever else arrives).
  bool closedWithin(double seconds) {
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(seconds);
    char buf[4096];
    while (std::chrono::steady_clock::now() < deadline) {
      pollfd p{fd_, POLLIN, 0};
      if (::poll(&p, 1, 50) > 0) {
        const ssize_t r = ::recv(fd_, buf, sizeof buf, 0);
        if (r <= 0) return true;
      }
    }
    return false;
  }
  void closeConnection() {
    ::close(fd_);
    fd_ = -1;
  }

  static int connectTo(const mk::proxy::wire::AddressRecord& r) {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = r.ipv4;
    a.sin_port = htons(r.port);
    REQUIRE(::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
    mk::net::setNonBlocking(fd, "fake peer");
    return fd;
  }

 private:
  mk::Bootstrap& boot_;
  int listener_ = -1;
  int fd_ = -1;
  std::vector<mk::proxy::wire::AddressRecord> records_;
};

}  // namespace mkt
