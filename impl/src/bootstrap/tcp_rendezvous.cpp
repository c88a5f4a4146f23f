// mkernel — the TCP rendezvous's handshake (mk/bootstrap.hpp): rank 0 admits a connection only after it proved that
// it holds the job key, and proves the same back; everything else is logged, closed and forgotten.
//
// The exchange, per connection (all integers little-endian, the layouts static_asserted below):
//   rank 0 -> peer   Challenge  {magic "MKBC"+2, version, challenge nonce (32 random bytes)}
//   peer -> rank 0   Claim      {magic, version, rank, size, peer nonce (32 random bytes),
//                                HMAC(key, "claim" label | challenge nonce | peer nonce | version | rank | size)}
//   rank 0 -> peer   Verdict    {magic, status, HMAC(key, "welcome" label | the same transcript) when admitted}
// A fresh challenge per connection makes a recorded claim useless on another connection; the two labels keep a
// claim from being reflected as a welcome; the key itself never crosses the network. Rank 0 serves every pending
// connection from one poll loop, each with its own handshake budget, so a silent, slow or half-open connection
// delays nobody and is dropped when its budget ends.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <thread>
#include <vector>

#include "mk/bootstrap.hpp"
#include "mk/error.hpp"
#include "net/socket_util.hpp"

namespace mk {
namespace {

using net::Clock;
using net::deadlineAfter;
using net::msLeft;
using net::sysError;

const std::string kContext = "bootstrap";

constexpr uint32_t kProtocol = 2;                  // 1: the unauthenticated hello of earlier builds
constexpr uint32_t kChallengeMagic = 0x4d4b4241u;  // "MKBA"
constexpr uint32_t kClaimMagic = 0x4d4b4250u;      // "MKBP"
constexpr uint32_t kVerdictMagic = 0x4d4b4256u;    // "MKBV"
constexpr uint32_t kOldHelloMagic = 0x4d4b4248u;   // "MKBH": protocol 1's hello, no key
constexpr std::size_t kNonce = 32;
constexpr std::size_t kMaxPending = 64;   // connections in their handshake at once; more are refused at accept
constexpr std::size_t kLoggedLines = 16;  // refusals printed before they are only counted

struct Challenge {
  uint32_t magic;
  uint32_t version;
  uint8_t nonce[kNonce];
  uint64_t reserved;
};
static_assert(sizeof(Challenge) == 48, "bootstrap wire format");

struct Claim {
  uint32_t magic;
  uint32_t version;
  uint32_t rank;
  uint32_t size;
  uint8_t nonce[kNonce];
  uint8_t mac[JobKey::kMacBytes];
};
static_assert(sizeof(Claim) == 80, "bootstrap wire format");

enum class Status : uint32_t { Admitted = 0, BadKey = 1, WrongSize = 2, BadRank = 3, RankTaken = 4 };

struct Verdict {
  uint32_t magic;
  uint32_t status;
  uint8_t mac[JobKey::kMacBytes];
  uint64_t reserved;
};
static_assert(sizeof(Verdict) == 48, "bootstrap wire format");

/// The tag of one direction of one connection's handshake: what both sides saw, under the job key.
JobKey::Mac transcriptMac(const JobKey& key, const char* label, const uint8_t* challenge, const Claim& c) {
  std::vector<uint8_t> t(label, label + std::strlen(label) + 1);
  t.insert(t.end(), challenge, challenge + kNonce);
  t.insert(t.end(), c.nonce, c.nonce + kNonce);
  for (uint32_t v : {c.version, c.rank, c.size})
    for (int b = 0; b < 4; ++b) t.push_back(static_cast<uint8_t>(v >> (8 * b)));
  return key.mac(t.data(), t.size());
}
constexpr const char* kClaimLabel = "mkernel bootstrap claim";
constexpr const char* kWelcomeLabel = "mkernel bootstrap welcome";

JobKey::Mac toMac(const uint8_t* p) {
  JobKey::Mac m{};
  std::memcpy(m.data(), p, m.size());
  return m;
}

std::string peerAddress(int fd) {
  sockaddr_in a{};
  socklen_t len = sizeof a;
  if (::getpeername(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) return "an unknown address";
  return net::formatAddress(a);
}

/// One accepted connection in its handshake (rank 0's side).
struct Pending {
  int fd = -1;
  std::string from;
  uint8_t challenge[kNonce] = {};
  Clock::time_point deadline;
  Claim claim{};
  std::size_t got = 0;
};

}  // namespace

void TcpBootstrap::rendezvousRoot() {
  const auto deadline = deadlineAfter(opt_.timeoutMs);
  const std::string where = opt_.addr + ":" + std::to_string(opt_.port);
  const sockaddr_in a = net::resolveIPv4(opt_.addr, opt_.port, kContext, "MASTER_ADDR");
  const int ls = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (ls < 0) throw Error(ErrorCode::IoError, "bootstrap: socket() failed: " + sysError(errno));
  std::vector<Pending> pending;
  struct Closer {
    int fd;
    std::vector<Pending>& pending;
    ~Closer() {
      ::close(fd);
      for (const Pending& p : pending) ::close(p.fd);
    }
  } closer{ls, pending};
  const int one = 1;
  setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(ls, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
    throw Error(ErrorCode::IoError, "bootstrap: rank 0 cannot listen on " + where + ": " + sysError(errno) +
                                        " (MASTER_PORT in use, or MASTER_ADDR not an address of this host?)");
  if (::listen(ls, opt_.size + 16) != 0)
    throw Error(ErrorCode::IoError, "bootstrap: listen on " + where + " failed: " + sysError(errno));
  net::setNonBlocking(ls, kContext);

  std::vector<std::string> refusals;  // the first few, for the timeout's message
  const auto refuse = [&](const std::string& from, const std::string& why) {
    ++refused_;
    const std::string line = "bootstrap: rank 0 refused a connection from " + from + ": " + why;
    if (refusals.size() < 4) refusals.push_back(from + ": " + why);
    if (refused_ <= kLoggedLines) {
      const std::string shown = refused_ == kLoggedLines ? line + " (further refusals are counted, not printed)" : line;
      if (opt_.log)
        opt_.log(shown);
      else
        std::fprintf(stderr, "mkernel: %s\n", shown.c_str());
    }
  };
  const auto drop = [&](std::size_t i, const std::string& why) {
    refuse(pending[i].from, why);
    ::close(pending[i].fd);
    pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
  };
  const auto answer = [&](int fd, Status status, const JobKey::Mac* mac) {
    Verdict v{};
    v.magic = kVerdictMagic;
    v.status = static_cast<uint32_t>(status);
    if (mac) std::memcpy(v.mac, mac->data(), mac->size());
    // 48 bytes into a fresh socket's empty send buffer: a send that does not take them all is a peer to drop.
    return ::send(fd, &v, sizeof v, MSG_NOSIGNAL | MSG_DONTWAIT) == static_cast<ssize_t>(sizeof v);
  };

  int connected = 0;
  while (connected < opt_.size - 1) {
    if (msLeft(deadline) <= 0) {
      std::string missing;
      for (int q = 1; q < opt_.size; ++q)
        if (peers_[static_cast<size_t>(q)] < 0) missing += (missing.empty() ? "" : ", ") + std::to_string(q);
      std::string meanwhile;
      if (refused_ > 0) {
        meanwhile = "; refused meanwhile: " + std::to_string(refused_) + " connection(s) [";
        for (std::size_t i = 0; i < refusals.size(); ++i) meanwhile += (i ? "; " : "") + refusals[i];
        meanwhile += refused_ > refusals.size() ? "; ...]" : "]";
      }
      throw Error(ErrorCode::Timeout, "bootstrap: rank(s) " + missing + " never connected to rank 0 at " + where +
                                          " within " + std::to_string(static_cast<long>(opt_.timeoutMs)) +
                                          " ms (WORLD_SIZE " + std::to_string(opt_.size) +
                                          "; were they started, with the same MASTER_ADDR / MASTER_PORT and job key?)" +
                                          meanwhile);
    }
    // Expire handshakes that ran out of their budget (silent, slow or half-open connections).
    for (std::size_t i = pending.size(); i-- > 0;)
      if (Clock::now() >= pending[i].deadline)
        drop(i, pending[i].got == 0
                    ? "sent nothing within " + std::to_string(static_cast<long>(opt_.handshakeMs)) +
                          " ms (silent or half-open)"
                    : "sent " + std::to_string(pending[i].got) + " of " + std::to_string(sizeof(Claim)) +
                          " handshake bytes within " + std::to_string(static_cast<long>(opt_.handshakeMs)) + " ms");
    std::vector<pollfd> fds{pollfd{ls, POLLIN, 0}};
    double wait = std::min(msLeft(deadline), 1000.0);
    for (const Pending& p : pending) {
      fds.push_back(pollfd{p.fd, POLLIN, 0});
      wait = std::min(wait, msLeft(p.deadline));
    }
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::max(wait, 0.0)) + 1);
    if (r < 0 && errno != EINTR) throw Error(ErrorCode::IoError, "bootstrap: poll failed: " + sysError(errno));
    if (r <= 0) continue;

    // Read what pending connections sent (back to front: a finished or failed one leaves the vector).
    for (std::size_t i = pending.size(); i-- > 0;) {
      if (!(fds[i + 1].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      Pending& p = pending[i];
      const ssize_t n = ::recv(p.fd, reinterpret_cast<uint8_t*>(&p.claim) + p.got, sizeof(Claim) - p.got, 0);
      if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR)) continue;
      if (n <= 0) {
        drop(i, n == 0 ? "closed the connection after " + std::to_string(p.got) + " handshake bytes"
                       : "failed during the handshake: " + sysError(errno));
        continue;
      }
      p.got += static_cast<std::size_t>(n);
      if (p.got >= 8 && p.claim.magic != kClaimMagic) {
        drop(i, p.claim.magic == kOldHelloMagic
                    ? "an mkernel of bootstrap protocol 1 (no job key): every rank must run the same build"
                    : "not an mkernel bootstrap (unknown greeting)");
        continue;
      }
      if (p.got >= 8 && p.claim.version != kProtocol) {
        drop(i, "speaks bootstrap protocol " + std::to_string(p.claim.version) + ", rank 0 protocol " +
                    std::to_string(kProtocol) + " (every rank must run the same build)");
        continue;
      }
      if (p.got < sizeof(Claim)) continue;
      const Claim& c = p.claim;
      if (!macEqual(toMac(c.mac), transcriptMac(opt_.key, kClaimLabel, p.challenge, c))) {
        answer(p.fd, Status::BadKey, nullptr);
        drop(i, "failed authentication (claims rank " + std::to_string(c.rank) +
                    " but does not hold the job's key: a stranger, or a rank given another MK_JOB_KEY)");
        continue;
      }
      // Authenticated: a process of this job. A disagreement now is the job's misconfiguration, not an attack.
      const bool badSize = static_cast<int>(c.size) != opt_.size;
      const bool badRank = c.rank == 0 || c.rank >= static_cast<uint32_t>(opt_.size);
      const bool taken = !badSize && !badRank && peers_[c.rank] >= 0;
      if (badSize || badRank || taken) {
        answer(p.fd, badSize ? Status::WrongSize : badRank ? Status::BadRank : Status::RankTaken, nullptr);
        throw Error(
            ErrorCode::InvalidArgument,
            "bootstrap: a process at " + where + " (from " + p.from + ", holding the job key) says it is rank " +
                std::to_string(c.rank) + " of " + std::to_string(c.size) + ", but rank 0 expects WORLD_SIZE " +
                std::to_string(opt_.size) +
                (taken ? " and rank " + std::to_string(c.rank) + " already connected (two processes with one RANK?)"
                       : std::string(" and ranks 1..") + std::to_string(opt_.size - 1)));
      }
      const JobKey::Mac welcome = transcriptMac(opt_.key, kWelcomeLabel, p.challenge, c);
      if (!answer(p.fd, Status::Admitted, &welcome)) {
        drop(i, "authenticated as rank " + std::to_string(c.rank) + " but could not be answered: " + sysError(errno));
        continue;
      }
      peers_[c.rank] = p.fd;
      ++connected;
      pending.erase(pending.begin() + static_cast<std::ptrdiff_t>(i));
    }

    // New connections: challenge each at once.
    if (fds[0].revents & POLLIN) {
      for (;;) {
        const int fd = ::accept4(ls, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
          if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) break;
          if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) break;  // retried next poll
          throw Error(ErrorCode::IoError, "bootstrap: accept on " + where + " failed: " + sysError(errno));
        }
        Pending p;
        p.fd = fd;
        p.from = peerAddress(fd);
        if (pending.size() >= kMaxPending) {
          refuse(p.from, std::to_string(kMaxPending) + " connections are already in their handshake (a flood?)");
          ::close(fd);
          continue;
        }
        net::noDelay(fd);
        randomBytes(p.challenge, kNonce);
        p.deadline = deadlineAfter(std::min(opt_.handshakeMs, std::max(msLeft(deadline), 1.0)));
        Challenge ch{};
        ch.magic = kChallengeMagic;
        ch.version = kProtocol;
        std::memcpy(ch.nonce, p.challenge, kNonce);
        if (::send(fd, &ch, sizeof ch, MSG_NOSIGNAL | MSG_DONTWAIT) != static_cast<ssize_t>(sizeof ch)) {
          refuse(p.from, "could not be sent the challenge: " + sysError(errno));
          ::close(fd);
          continue;
        }
        pending.push_back(p);
      }
    }
  }
  // Every rank joined: whatever is still in its handshake is a stranger (each rank connects once).
  for (std::size_t i = pending.size(); i-- > 0;) drop(i, "still in its handshake when every rank had joined");
}

void TcpBootstrap::rendezvousPeer() {
  const auto deadline = deadlineAfter(opt_.timeoutMs);
  const std::string where = opt_.addr + ":" + std::to_string(opt_.port);
  const sockaddr_in a = net::resolveIPv4(opt_.addr, opt_.port, kContext, "MASTER_ADDR");
  std::string last = "no attempt";
  for (;; std::this_thread::sleep_for(std::chrono::milliseconds(20))) {  // rank 0 may not listen yet
    if (msLeft(deadline) <= 0)
      throw Error(ErrorCode::Timeout, "bootstrap: rank " + std::to_string(opt_.rank) + " could not reach rank 0 at " +
                                          where + " within " + std::to_string(static_cast<long>(opt_.timeoutMs)) +
                                          " ms (last error: " + last + "; is rank 0 running?)");
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd < 0) throw Error(ErrorCode::IoError, "bootstrap: socket() failed: " + sysError(errno));
    struct Closer {
      int fd;
      bool keep = false;
      ~Closer() {
        if (!keep) ::close(fd);
      }
    } closer{fd};
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
    if (err != 0) {
      last = sysError(err);
      continue;
    }
    net::noDelay(fd);
    // The handshake: bounded by the handshake budget, so a stale listener that never speaks is left for a retry.
    const auto hsDeadline = std::min(deadline, deadlineAfter(opt_.handshakeMs));
    Challenge ch{};
    try {
      net::recvAll(fd, &ch, sizeof ch, hsDeadline, kContext, "the process at " + where);
    } catch (const Error& e) {
      last = e.message() + " (waiting for rank 0's challenge)";
      continue;
    }
    if (ch.magic != kChallengeMagic) {
      last = "the process at " + where + " is not an mkernel bootstrap of this protocol (an older build?)";
      continue;
    }
    if (ch.version != kProtocol)
      throw Error(ErrorCode::Unsupported, "bootstrap: rank 0 at " + where + " speaks bootstrap protocol " +
                                              std::to_string(ch.version) + ", rank " + std::to_string(opt_.rank) +
                                              " protocol " + std::to_string(kProtocol) +
                                              " (every rank must run the same mkernel build)");
    Claim c{};
    c.magic = kClaimMagic;
    c.version = kProtocol;
    c.rank = static_cast<uint32_t>(opt_.rank);
    c.size = static_cast<uint32_t>(opt_.size);
    randomBytes(c.nonce, kNonce);
    const JobKey::Mac tag = transcriptMac(opt_.key, kClaimLabel, ch.nonce, c);
    std::memcpy(c.mac, tag.data(), tag.size());
    Verdict v{};
    try {
      net::sendAll(fd, &c, sizeof c, hsDeadline, kContext, "rank 0 at " + where);
      net::recvAll(fd, &v, sizeof v, hsDeadline, kContext, "rank 0 at " + where);
    } catch (const Error& e) {
      last = e.message() + " (during the handshake)";
      continue;
    }
    const std::string me = "rank " + std::to_string(opt_.rank) + " of " + std::to_string(opt_.size);
    if (v.magic != kVerdictMagic) {
      last = "the process at " + where + " answered the handshake with an unknown message";
      continue;
    }
    switch (static_cast<Status>(v.status)) {
      case Status::Admitted: break;
      case Status::BadKey:
        throw Error(ErrorCode::InvalidArgument,
                    "bootstrap: rank 0 at " + where + " refused " + me +
                        ": not the job's key (MK_JOB_KEY or MK_JOB_KEY_FILE must hold the same key on every rank)");
      case Status::WrongSize:
      case Status::BadRank:
      case Status::RankTaken:
        throw Error(ErrorCode::InvalidArgument,
                    "bootstrap: rank 0 at " + where + " refused " + me +
                        (static_cast<Status>(v.status) == Status::WrongSize ? ": it expects another WORLD_SIZE"
                         : static_cast<Status>(v.status) == Status::BadRank ? ": that rank is outside its WORLD_SIZE"
                                                                            : ": another process holds that rank "
                                                                              "(two processes with one RANK?)"));
      default: last = "the process at " + where + " answered with unknown status " + std::to_string(v.status); continue;
    }
    // Admitted: rank 0 must prove it holds the key too, or whatever listens there could feed this rank the job's
    // addresses.
    if (!macEqual(toMac(v.mac), transcriptMac(opt_.key, kWelcomeLabel, ch.nonce, c))) {
      last = "the process at " + where + " admitted " + me + " but could not prove that it holds the job's key";
      continue;
    }
    closer.keep = true;
    peers_[0] = fd;
    return;
  }
}

}  // namespace mk
