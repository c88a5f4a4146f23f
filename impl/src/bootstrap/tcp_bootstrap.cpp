// mkernel — the TCP bootstrap (mk/bootstrap.hpp): options, the collective calls over the rendezvous's connections.
// The rendezvous and its handshake are in tcp_rendezvous.cpp, the launch variables it starts from in launch.cpp.
#include "mk/bootstrap.hpp"

#include <poll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <set>

#include "mk/error.hpp"
#include "net/socket_util.hpp"

namespace mk {
namespace {

using net::deadlineAfter;
using net::msLeft;
using net::sysError;

const std::string kContext = "bootstrap";

constexpr uint32_t kCallMagic = 0x4d4b4243u;  // "MKBC"

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
  if (!(opt_.handshakeMs > 0)) throw Error(ErrorCode::InvalidArgument, "TcpBootstrap: handshakeMs must be > 0");
  if (opt_.size > 1 && opt_.key.empty())
    throw Error(ErrorCode::InvalidArgument, "TcpBootstrap: " + missingJobKeyText(opt_.size));
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
  o.key = env.jobKey;
  return std::make_unique<TcpBootstrap>(o);
}

TcpBootstrap::~TcpBootstrap() {
  for (int fd : peers_)
    if (fd >= 0) ::close(fd);
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
