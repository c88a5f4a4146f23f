// mkernel — the TCP rendezvous (mk/bootstrap.hpp); the launch variables it starts from are read in launch.cpp.
#include "mk/bootstrap.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <set>
#include <thread>

#include "mk/error.hpp"
#include "net/socket_util.hpp"

namespace mk {
namespace {

using net::Clock;
using net::deadlineAfter;
using net::msLeft;
using net::sysError;

const std::string kContext = "bootstrap";

constexpr uint32_t kHelloMagic = 0x4d4b4248u;  // "MKBH"
constexpr uint32_t kCallMagic = 0x4d4b4243u;   // "MKBC"

struct Hello {
  uint32_t magic, rank, size, reserved;
};
struct CallHeader {
  uint32_t magic, call;
  uint64_t bytes;
};

std::string rankName(int q) { return "rank " + std::to_string(q); }

}  // namespace

// ---- TcpBootstrap -------------------------------------------------------------------------------------

TcpBootstrap::TcpBootstrap(const TcpBootstrapOptions& options) : opt_(options) {
  if (opt_.size < 1 || opt_.rank < 0 || opt_.rank >= opt_.size)
    throw Error(ErrorCode::InvalidArgument,
                "TcpBootstrap: rank " + std::to_string(opt_.rank) + " is outside 0.." + std::to_string(opt_.size - 1));
  if (opt_.port == 0) throw Error(ErrorCode::InvalidArgument, "TcpBootstrap: port must be 1..65535 (got 0)");
  if (!(opt_.timeoutMs > 0)) throw Error(ErrorCode::InvalidArgument, "TcpBootstrap: timeoutMs must be > 0");
  peers_.assign(static_cast<size_t>(opt_.rank == 0 ? opt_.size : 1), -1);
  try {
    if (opt_.size == 1) return;
    if (opt_.rank == 0)
      rendezvousRoot();
    else
      rendezvousPeer();
  } catch (...) {
    for (int fd : peers_)
      if (fd >= 0) ::close(fd);
    throw;
  }
}

std::unique_ptr<TcpBootstrap> TcpBootstrap::fromEnvironment(double timeoutMs) {
  const LaunchEnvironment env = readLaunchEnvironment();
  TcpBootstrapOptions o;
  o.rank = env.rank;
  o.size = env.size;
  o.addr = env.masterAddr;
  o.port = env.masterPort;
  o.timeoutMs = timeoutMs;
  return std::make_unique<TcpBootstrap>(o);
}

TcpBootstrap::~TcpBootstrap() {
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
}

void TcpBootstrap::rendezvousRoot() {
  const auto deadline = deadlineAfter(opt_.timeoutMs);
  const std::string where = opt_.addr + ":" + std::to_string(opt_.port);
  const sockaddr_in a = net::resolveIPv4(opt_.addr, opt_.port, kContext, "MASTER_ADDR");
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) throw Error(ErrorCode::IoError, "bootstrap: socket() failed: " + sysError(errno));
  struct Closer {
    int fd;
    ~Closer() { ::close(fd); }
  } closer{ls};
  const int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(ls, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw Error(ErrorCode::IoError, "bootstrap: rank 0 cannot listen on " + where + ": " + sysError(errno) +
                                        " (MASTER_PORT in use, or MASTER_ADDR not an address of this host?)");
  if (::listen(ls, opt_.size) != 0)
    throw Error(ErrorCode::IoError, "bootstrap: listen on " + where + " failed: " + sysError(errno));
  net::setNonBlocking(ls, kContext);
  int connected = 0;
  while (connected < opt_.size - 1) {
    if (!net::waitFd(ls, POLLIN, deadline, kContext)) {
      std::string missing;
      for (int q = 1; q < opt_.size; ++q)
        if (peers_[static_cast<size_t>(q)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      throw Error(ErrorCode::Timeout, "bootstrap: rank(s) " + missing + " never connected to rank 0 at " + where +
                                          " within " + std::to_string(static_cast<long>(opt_.timeoutMs)) +
                                          " ms (WORLD_SIZE " + std::to_string(opt_.size) +
                                          "; were they started, with the same MASTER_ADDR / MASTER_PORT?)");
    }
    const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) continue;
      throw Error(ErrorCode::IoError, "bootstrap: accept on " + where + " failed: " + sysError(errno));
    }
    net::noDelay(fd);
    Hello h{};
    try {
      net::recvAll(fd, &h, sizeof h, deadline, kContext, "a connecting process");
    } catch (...) {
      ::close(fd);
      throw;
    }
    if (h.magic != kHelloMagic) {
      ::close(fd);  // not one of ours (a port scanner, a stale client): ignore it
      continue;
    }
    if (static_cast<int>(h.size) != opt_.size || h.rank == 0 || static_cast<int>(h.rank) >= opt_.size ||
        peers_[h.rank] >= 0) {
      ::close(fd);
      throw Error(ErrorCode::InvalidArgument,
                  "bootstrap: a process at " + where + " says it is rank " + std::to_string(h.rank) + " of " +
                      std::to_string(h.size) + ", but rank 0 expects WORLD_SIZE " + std::to_string(opt_.size) +
                      (h.rank != 0 && static_cast<int>(h.rank) < opt_.size && peers_[h.rank] >= 0
                           ? " and rank " + std::to_string(h.rank) + " already connected (two processes with one RANK?)"
                           : std::string(" and ranks 1..") + std::to_string(opt_.size - 1)));
    }
    peers_[h.rank] = fd;
    ++connected;
  }
}

void TcpBootstrap::rendezvousPeer() {
  const auto deadline = deadlineAfter(opt_.timeoutMs);
  const std::string where = opt_.addr + ":" + std::to_string(opt_.port);
  const sockaddr_in a = net::resolveIPv4(opt_.addr, opt_.port, kContext, "MASTER_ADDR");
  std::string last = "no attempt";
  for (;;) {
    if (msLeft(deadline) <= 0)
      throw Error(ErrorCode::Timeout, "bootstrap: rank " + std::to_string(opt_.rank) + " could not reach rank 0 at " +
                                          where + " within " + std::to_string(static_cast<long>(opt_.timeoutMs)) +
                                          " ms (last error: " + last + "; is rank 0 running?)");
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw Error(ErrorCode::IoError, "bootstrap: socket() failed: " + sysError(errno));
    int err = 0;
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0) {
      err = errno;
      if (err == EINPROGRESS) {
        if (net::waitFd(fd, POLLOUT, deadline, kContext)) {
          socklen_t len = sizeof err;
          getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len);
        } else {
          err = ETIMEDOUT;
        }
      }
    }
    if (err == 0) {
      net::noDelay(fd);
      peers_[0] = fd;
      break;
    }
    ::close(fd);
    last = sysError(err);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));  // rank 0 may not listen yet
  }
  const Hello h{kHelloMagic, static_cast<uint32_t>(opt_.rank), static_cast<uint32_t>(opt_.size), 0};
  net::sendAll(peers_[0], &h, sizeof h, deadline, kContext, "rank 0 at " + where);
}

std::vector<uint8_t> TcpBootstrap::allGather(const void* mine, size_t bytes) {
  const auto deadline = deadlineAfter(opt_.timeoutMs);
  const uint32_t call = calls_++;
  const size_t n = static_cast<size_t>(opt_.size);
  std::vector<uint8_t> all(n * bytes);
  if (bytes) std::memcpy(all.data() + static_cast<size_t>(opt_.rank) * bytes, mine, bytes);
  if (n == 1) return all;
  if (opt_.rank == 0) {
    // Collect every rank's part (any order), then answer everyone with the whole.
    std::set<int> waiting;
    for (int q = 1; q < opt_.size; ++q) waiting.insert(q);
    while (!waiting.empty()) {
      std::vector<pollfd> fds;
      for (int q : waiting) fds.push_back(pollfd{peers_[static_cast<size_t>(q)], POLLIN, 0});
      const double left = msLeft(deadline);
      const int r = left > 0 ? ::poll(fds.data(), fds.size(), static_cast<int>(std::min(left + 1, 1000.0))) : 0;
      if (r < 0 && errno != EINTR) throw Error(ErrorCode::IoError, "bootstrap: poll failed: " + sysError(errno));
      if (r <= 0 && msLeft(deadline) <= 0) {
        std::string missing;
        for (int q : waiting) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
        throw Error(ErrorCode::Timeout, "bootstrap: rank(s) " + missing + " did not join collective call " +
                                            std::to_string(call) + " within " +
                                            std::to_string(static_cast<long>(opt_.timeoutMs)) + " ms");
      }
      for (const pollfd& p : fds) {
        if (!(p.revents & (POLLIN | POLLHUP | POLLERR))) continue;
        int q = 0;
        for (int c : waiting)
          if (peers_[static_cast<size_t>(c)] == p.fd) q = c;
        CallHeader hdr{};
        net::recvAll(p.fd, &hdr, sizeof hdr, deadline, kContext, rankName(q));
        if (hdr.magic != kCallMagic || hdr.call != call || hdr.bytes != bytes)
          throw Error(ErrorCode::InvalidArgument, "bootstrap: rank " + std::to_string(q) + " is at collective call " +
                                                      std::to_string(hdr.call) + " with " + std::to_string(hdr.bytes) +
                                                      " bytes, rank 0 at call " + std::to_string(call) + " with " +
                                                      std::to_string(bytes) + " bytes (mismatched calls)");
        if (bytes)
          net::recvAll(p.fd, all.data() + static_cast<size_t>(q) * bytes, bytes, deadline, kContext, rankName(q));
        waiting.erase(q);
      }
    }
    const CallHeader out{kCallMagic, call, all.size()};
    for (int q = 1; q < opt_.size; ++q) {
      net::sendAll(peers_[static_cast<size_t>(q)], &out, sizeof out, deadline, kContext, rankName(q));
      if (!all.empty())
        net::sendAll(peers_[static_cast<size_t>(q)], all.data(), all.size(), deadline, kContext, rankName(q));
    }
    return all;
  }
  const CallHeader hdr{kCallMagic, call, bytes};
  net::sendAll(peers_[0], &hdr, sizeof hdr, deadline, kContext, "rank 0");
  if (bytes) net::sendAll(peers_[0], mine, bytes, deadline, kContext, "rank 0");
  CallHeader back{};
  net::recvAll(peers_[0], &back, sizeof back, deadline, kContext, "rank 0");
  if (back.magic != kCallMagic || back.call != call || back.bytes != all.size())
    throw Error(ErrorCode::InvalidArgument, "bootstrap: rank 0 answered collective call " + std::to_string(back.call) +
                                                " with " + std::to_string(back.bytes) + " bytes, rank " +
                                                std::to_string(opt_.rank) + " expected call " + std::to_string(call) +
                                                " with " + std::to_string(all.size()));
  if (!all.empty()) net::recvAll(peers_[0], all.data(), all.size(), deadline, kContext, "rank 0");
  return all;
}

void TcpBootstrap::barrier() { allGather(nullptr, 0); }

}  // namespace mk
