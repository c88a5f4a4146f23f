// mkernel — the socket transport's connection setup and handshake (socket_setup.hpp).
#include "proxy/socket_setup.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <random>

#include "mk/bootstrap.hpp"
#include "net/socket_util.hpp"
#include "proxy/wire.hpp"

namespace mk::proxy {
namespace {

using net::Clock;
const std::string kContext = "socket transport";
/// How long an accepted connection may take to send its handshake before it is dropped: long enough for any
/// peer of the job (which sends it right after connect), short enough that a silent stranger cannot hold the
/// setup.
constexpr auto kHandshakeGrace = std::chrono::milliseconds(2000);
constexpr std::size_t kHostNameBytes = 64;

struct Fd {
  int fd = -1;
  Fd() = default;
  explicit Fd(int f) : fd(f) {}
  Fd(Fd&& o) noexcept : fd(o.fd) { o.fd = -1; }
  Fd& operator=(Fd&& o) noexcept {
    reset();
    fd = o.fd;
    o.fd = -1;
    return *this;
  }
  ~Fd() { reset(); }
  void reset() noexcept {
    if (fd >= 0) ::close(fd);
    fd = -1;
  }
  int release() noexcept {
    const int f = fd;
    fd = -1;
    return f;
  }
};

std::string processName(int p, const wire::AddressRecord& r) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = r.ipv4;
  a.sin_port = htons(r.port);
  return "process " + std::to_string(p) + " (" + net::formatAddress(a) + ")";
}

bool sameToken(const uint64_t a[2], const std::array<uint64_t, 2>& b) { return a[0] == b[0] && a[1] == b[1]; }

std::array<uint64_t, 2> randomToken() {
  std::random_device dev;  // the kernel's entropy source on Linux
  std::array<uint64_t, 2> t{};
  for (uint64_t& word : t)
    for (int i = 0; i < 2; ++i) word = (word << 32) | dev();
  if (t[0] == 0 && t[1] == 0) t[0] = 1;  // zero means "none"
  return t;
}

/// An outgoing connection to a process of lower or equal index, through its handshake.
struct Outbound {
  enum class Phase { Waiting, Connecting, SendHello, AwaitReply, Done } phase = Phase::Waiting;
  int process = -1;
  sockaddr_in addr{};
  Fd fd;
  wire::Hello hello{}, reply{};
  std::size_t sent = 0, got = 0;
  Clock::time_point retryAt{};
  std::string lastError = "no attempt yet";
};

/// An accepted connection, until it is matched to a process or refused.
struct Inbound {
  Fd fd;
  std::string from;  ///< the peer's address
  wire::Hello hello{}, reply{};
  std::size_t got = 0, sent = 0;
  bool replying = false, accept = false;
  int claimed = -1;
  Clock::time_point deadline{};
};

class Handshake {
 public:
  Handshake(const TransportOptions& options, int me, int n, std::vector<wire::AddressRecord> records,
            std::array<uint64_t, 2> token, Fd listener, const std::function<void(const std::string&)>& log)
      : opt_(options),
        me_(me),
        n_(n),
        records_(std::move(records)),
        token_(token),
        listener_(std::move(listener)),
        log_(log),
        outbound_(static_cast<std::size_t>(n)),
        inboundFd_(static_cast<std::size_t>(n)) {
    for (int p = 0; p < n; ++p) names_.push_back(processName(p, records_[static_cast<std::size_t>(p)]));
    for (int p = 0; p <= me; ++p) {
      Outbound& o = outbound_[static_cast<std::size_t>(p)];
      o.process = p;
      o.addr.sin_family = AF_INET;
      o.addr.sin_addr.s_addr = records_[static_cast<std::size_t>(p)].ipv4;
      o.addr.sin_port = htons(records_[static_cast<std::size_t>(p)].port);
      o.hello = wire::makeHello(wire::HelloKind::Hello, static_cast<uint32_t>(me), static_cast<uint32_t>(p),
                                static_cast<uint32_t>(n), token_.data());
    }
  }

  SocketLinks run() {
    const auto deadline = Clock::now() + opt_.budget;
    while (!finished()) {
      if (Clock::now() >= deadline) throw timeoutError();
      step(deadline);
    }
    SocketLinks links;
    links.process = me_;
    links.processes = n_;
    links.token = token_;
    links.names = names_;
    links.sendFd.assign(static_cast<std::size_t>(n_), -1);
    links.recvFd.assign(static_cast<std::size_t>(n_), -1);
    for (int p = 0; p < n_; ++p) {
      const auto i = static_cast<std::size_t>(p);
      if (p < me_) {
        links.sendFd[i] = links.recvFd[i] = outbound_[i].fd.release();
      } else if (p > me_) {
        links.sendFd[i] = links.recvFd[i] = inboundFd_[i].release();
      } else {
        links.sendFd[i] = outbound_[i].fd.release();
        links.recvFd[i] = inboundFd_[i].release();
      }
      net::noDelay(links.sendFd[i]);
      net::noDelay(links.recvFd[i]);
    }
    return links;
  }

 private:
  bool finished() const {
    for (int p = 0; p <= me_; ++p)
      if (outbound_[static_cast<std::size_t>(p)].phase != Outbound::Phase::Done) return false;
    for (int p = me_; p < n_; ++p)
      if (inboundFd_[static_cast<std::size_t>(p)].fd < 0) return false;
    return true;
  }

  Error timeoutError() const {
    std::string missingIn, missingOut;
    for (int p = me_; p < n_; ++p)
      if (inboundFd_[static_cast<std::size_t>(p)].fd < 0)
        missingIn += (missingIn.empty() ? "" : ", ") + std::to_string(p);
    for (int p = 0; p <= me_; ++p) {
      const Outbound& o = outbound_[static_cast<std::size_t>(p)];
      if (o.phase == Outbound::Phase::Done) continue;
      missingOut += (missingOut.empty() ? "" : "; ") + names_[static_cast<std::size_t>(p)] +
                    (o.phase == Outbound::Phase::AwaitReply ? ": connected, but no handshake answer"
                                                            : ": last error " + o.lastError);
    }
    std::string msg = kContext + ": " + names_[static_cast<std::size_t>(me_)] +
                      " could not connect every process within " + std::to_string(opt_.budget.count()) + " ms";
    if (!missingIn.empty()) msg += "; never connected to it: process(es) " + missingIn;
    if (!missingOut.empty()) msg += "; it could not reach: " + missingOut;
    if (!refused_.empty()) {
      msg += "; refused meanwhile:";
      for (const std::string& r : refused_) msg += " [" + r + "]";
    }
    msg += " (were those processes started, and do they reach this address?)";
    return Error(ErrorCode::Timeout, msg);
  }

  void step(Clock::time_point deadline) {
    std::vector<pollfd> fds;
    std::vector<std::pair<char, std::size_t>> owner;  // 'l' listener, 'o' outbound, 'i' inbound
    fds.push_back(pollfd{listener_.fd, POLLIN, 0});
    owner.emplace_back('l', 0);
    auto now = Clock::now();
    auto wake = std::min(deadline, now + std::chrono::milliseconds(100));
    for (std::size_t i = 0; i < outbound_.size(); ++i) {
      Outbound& o = outbound_[i];
      if (o.process < 0 || o.phase == Outbound::Phase::Done) continue;
      if (o.phase == Outbound::Phase::Waiting) {
        if (now >= o.retryAt) startConnect(o);
        if (o.phase == Outbound::Phase::Waiting) {
          wake = std::min(wake, o.retryAt);
          continue;
        }
      }
      fds.push_back(pollfd{o.fd.fd, static_cast<short>(o.phase == Outbound::Phase::AwaitReply ? POLLIN : POLLOUT), 0});
      owner.emplace_back('o', i);
    }
    for (std::size_t i = 0; i < inbound_.size(); ++i) {
      fds.push_back(pollfd{inbound_[i].fd.fd, static_cast<short>(inbound_[i].replying ? POLLOUT : POLLIN), 0});
      owner.emplace_back('i', i);
      wake = std::min(wake, inbound_[i].deadline);
    }
    const auto waitMs = std::chrono::duration_cast<std::chrono::milliseconds>(wake - now).count();
    const int r = ::poll(fds.data(), fds.size(), static_cast<int>(std::max<long long>(0, waitMs) + 1));
    if (r < 0 && errno != EINTR) throw Error(ErrorCode::IoError, kContext + ": poll failed: " + net::sysError(errno));
    for (std::size_t k = 0; k < fds.size(); ++k) {
      if (!fds[k].revents) continue;
      if (owner[k].first == 'l') acceptAll();
      if (owner[k].first == 'o') advance(outbound_[owner[k].second]);
      if (owner[k].first == 'i') advance(inbound_[owner[k].second]);
    }
    // Drop what finished or timed out (the vector shrinks only here, after every index above was used).
    now = Clock::now();
    std::vector<Inbound> keep;
    for (Inbound& in : inbound_) {
      if (in.fd.fd < 0) continue;
      if (now >= in.deadline) {
        refuse(in, "sent no complete handshake within " +
                       std::to_string(std::chrono::duration_cast<std::chrono::milliseconds>(kHandshakeGrace).count()) +
                       " ms");
        continue;
      }
      keep.push_back(std::move(in));
    }
    inbound_ = std::move(keep);
  }

  void startConnect(Outbound& o) {
    Fd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
    if (fd.fd < 0) throw Error(ErrorCode::IoError, kContext + ": socket() failed: " + net::sysError(errno));
    if (::connect(fd.fd, reinterpret_cast<const sockaddr*>(&o.addr), sizeof o.addr) != 0 && errno != EINPROGRESS) {
      o.lastError = net::sysError(errno);
      o.retryAt = Clock::now() + std::chrono::milliseconds(20);
      return;
    }
    o.fd = std::move(fd);
    o.phase = Outbound::Phase::Connecting;
    o.sent = o.got = 0;
  }

  void retry(Outbound& o, const std::string& why) {
    o.lastError = why;
    o.fd.reset();
    o.phase = Outbound::Phase::Waiting;
    o.retryAt = Clock::now() + std::chrono::milliseconds(20);
  }

  void advance(Outbound& o) {
    const std::string& peer = names_[static_cast<std::size_t>(o.process)];
    if (o.phase == Outbound::Phase::Connecting) {
      int err = 0;
      socklen_t len = sizeof err;
      getsockopt(o.fd.fd, SOL_SOCKET, SO_ERROR, &err, &len);
      if (err != 0) return retry(o, net::sysError(err));
      o.phase = Outbound::Phase::SendHello;
    }
    if (o.phase == Outbound::Phase::SendHello) {
      const auto* p = reinterpret_cast<const char*>(&o.hello);
      const ssize_t w = ::send(o.fd.fd, p + o.sent, sizeof o.hello - o.sent, MSG_NOSIGNAL);
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) return retry(o, net::sysError(errno));
      if (w > 0) o.sent += static_cast<std::size_t>(w);
      if (o.sent == sizeof o.hello) o.phase = Outbound::Phase::AwaitReply;
      return;
    }
    if (o.phase != Outbound::Phase::AwaitReply) return;
    auto* p = reinterpret_cast<char*>(&o.reply);
    const ssize_t r = ::recv(o.fd.fd, p + o.got, sizeof o.reply - o.got, 0);
    if (r == 0)
      throw Error(ErrorCode::IoError, kContext + ": " + peer +
                                          " closed the connection during the handshake (is it an mkernel process of "
                                          "this job? did it die?)");
    if (r < 0) {
      if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR) return;
      throw Error(ErrorCode::IoError, kContext + ": receiving the handshake of " + peer +
                                          " failed: " + net::sysError(errno) + " (did that process die?)");
    }
    o.got += static_cast<std::size_t>(r);
    if (o.got < sizeof o.reply) return;
    const wire::Hello& h = o.reply;
    if (h.magic != wire::kHelloMagic)
      throw Error(ErrorCode::IoError, kContext + ": " + peer +
                                          " answered with something that is not an mkernel handshake (another "
                                          "program listens at that address?)");
    if (h.version != wire::kProtocolVersion)
      throw Error(ErrorCode::Unsupported, kContext + ": " + peer + " speaks inter-node protocol version " +
                                              std::to_string(h.version) + ", this process version " +
                                              std::to_string(wire::kProtocolVersion) +
                                              " (every process must run the same mkernel build)");
    if (!wire::helloCrcOk(h))
      throw Error(ErrorCode::ParseError, kContext + ": the handshake answer of " + peer + " is corrupted (CRC)");
    if (h.kind == static_cast<uint16_t>(wire::HelloKind::Reject))
      throw Error(ErrorCode::InvalidArgument,
                  kContext + ": " + peer + " refused the connection of process " + std::to_string(me_) + ": " +
                      wire::toString(static_cast<wire::RejectReason>(h.reason)) +
                      " (is every process of the job started with the same bootstrap and size?)");
    if (h.kind != static_cast<uint16_t>(wire::HelloKind::Accept) || !sameToken(h.token, token_) ||
        h.fromProcess != static_cast<uint32_t>(o.process) || h.toProcess != static_cast<uint32_t>(me_))
      throw Error(ErrorCode::InvalidArgument, kContext + ": " + peer + " answered the handshake as process " +
                                                  std::to_string(h.fromProcess) + " with " +
                                                  (sameToken(h.token, token_) ? "the job's token" : "another token") +
                                                  ": another job listens at that address?");
    o.phase = Outbound::Phase::Done;
  }

  void acceptAll() {
    for (;;) {
      sockaddr_in from{};
      socklen_t len = sizeof from;
      Fd fd(::accept4(listener_.fd, reinterpret_cast<sockaddr*>(&from), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
      if (fd.fd < 0) {
        if (errno == EAGAIN || errno == EWOULDBLOCK || errno == EINTR || errno == ECONNABORTED) return;
        throw Error(ErrorCode::IoError, kContext + ": accept failed: " + net::sysError(errno));
      }
      Inbound in;
      in.fd = std::move(fd);
      in.from = net::formatAddress(from);
      in.deadline = Clock::now() + std::min<Clock::duration>(kHandshakeGrace, opt_.budget);
      inbound_.push_back(std::move(in));
    }
  }

  void refuse(Inbound& in, const std::string& why) {
    const std::string line = "connection from " + in.from +
                             (in.claimed >= 0 ? " claiming process " + std::to_string(in.claimed) : std::string()) +
                             ": " + why;
    log_(kContext + ": " + names_[static_cast<std::size_t>(me_)] + " refused a " + line);
    refused_.push_back(line);
    in.fd.reset();
  }

  void advance(Inbound& in) {
    if (in.replying) {
      const auto* p = reinterpret_cast<const char*>(&in.reply);
      const ssize_t w = ::send(in.fd.fd, p + in.sent, sizeof in.reply - in.sent, MSG_NOSIGNAL);
      if (w < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        if (in.accept) refuse(in, "it went away before the accept was sent: " + net::sysError(errno));
        in.fd.reset();
        return;
      }
      if (w > 0) in.sent += static_cast<std::size_t>(w);
      if (in.sent < sizeof in.reply) return;
      if (in.accept)
        inboundFd_[static_cast<std::size_t>(in.claimed)] = std::move(in.fd);
      else
        in.fd.reset();  // a rejected connection is closed once it was told why
      return;
    }
    auto* p = reinterpret_cast<char*>(&in.hello);
    const ssize_t r = ::recv(in.fd.fd, p + in.got, sizeof in.hello - in.got, 0);
    if (r == 0 || (r < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR)) {
      refuse(in, r == 0 ? "it closed before its handshake was complete" : "receive failed: " + net::sysError(errno));
      return;
    }
    if (r < 0) return;
    in.got += static_cast<std::size_t>(r);
    if (in.got < sizeof in.hello) return;
    const wire::Hello& h = in.hello;
    if (h.magic != wire::kHelloMagic) return refuse(in, "not an mkernel handshake");
    in.claimed = static_cast<int>(h.fromProcess);
    wire::RejectReason reason = wire::RejectReason::None;
    std::string why;
    if (h.version != wire::kProtocolVersion) {
      reason = wire::RejectReason::Version;
      why = "inter-node protocol version " + std::to_string(h.version) + " (this process speaks " +
            std::to_string(wire::kProtocolVersion) + ")";
    } else if (!wire::helloCrcOk(h) || h.kind != static_cast<uint16_t>(wire::HelloKind::Hello)) {
      reason = wire::RejectReason::Malformed;
      why = "a malformed handshake (kind or CRC)";
    } else if (!sameToken(h.token, token_)) {
      reason = wire::RejectReason::Token;
      why = "not the job's token (a process of another job, or a stranger)";
    } else if (h.processes != static_cast<uint32_t>(n_) || h.toProcess != static_cast<uint32_t>(me_)) {
      reason = wire::RejectReason::WrongTarget;
      why = "it means process " + std::to_string(h.toProcess) + " of " + std::to_string(h.processes) +
            ", this is process " + std::to_string(me_) + " of " + std::to_string(n_);
    } else if (in.claimed < me_ || in.claimed >= n_) {
      reason = wire::RejectReason::UnknownProcess;
      why = "process " + std::to_string(in.claimed) + " is not one this process accepts (it accepts " +
            std::to_string(me_) + ".." + std::to_string(n_ - 1) + ")";
    } else if (inboundFd_[static_cast<std::size_t>(in.claimed)].fd >= 0 || claimedPending(in)) {
      reason = wire::RejectReason::DuplicateProcess;
      why = "process " + std::to_string(in.claimed) + " is already connected";
    }
    in.replying = true;
    in.sent = 0;
    if (reason != wire::RejectReason::None) {
      const std::string line =
          "connection from " + in.from + " claiming process " + std::to_string(in.claimed) + ": " + why;
      log_(kContext + ": " + names_[static_cast<std::size_t>(me_)] + " refused a " + line);
      refused_.push_back(line);
      in.accept = false;
      in.reply = wire::makeHello(wire::HelloKind::Reject, static_cast<uint32_t>(me_), h.fromProcess,
                                 static_cast<uint32_t>(n_), nullptr, reason);
    } else {
      in.accept = true;
      in.reply = wire::makeHello(wire::HelloKind::Accept, static_cast<uint32_t>(me_), h.fromProcess,
                                 static_cast<uint32_t>(n_), token_.data());
    }
    advance(in);  // usually sends the whole answer at once
  }

  /// True when another accepted connection already claimed the same process and is being answered.
  bool claimedPending(const Inbound& self) const {
    for (const Inbound& other : inbound_)
      if (&other != &self && other.fd.fd >= 0 && other.replying && other.accept && other.claimed == self.claimed)
        return true;
    return false;
  }

  const TransportOptions& opt_;
  int me_, n_;
  std::vector<wire::AddressRecord> records_;
  std::array<uint64_t, 2> token_;
  Fd listener_;
  const std::function<void(const std::string&)>& log_;
  std::vector<std::string> names_;
  std::vector<Outbound> outbound_;  ///< [process], used for processes 0..me
  std::vector<Fd> inboundFd_;       ///< [process], filled for processes me..n-1 once accepted
  std::vector<Inbound> inbound_;    ///< accepted, not yet matched or refused
  std::vector<std::string> refused_;
};

}  // namespace

std::string defaultListenAddress(const std::vector<std::string>& hostNames, int me) {
  const std::string& mine = hostNames[static_cast<std::size_t>(me)];
  bool oneHost = true;
  for (const std::string& h : hostNames) oneHost = oneHost && h == mine;
  if (oneHost) return "127.0.0.1";
  const sockaddr_in a = net::resolveIPv4(mine, 0, kContext, "this host's name");
  if ((ntohl(a.sin_addr.s_addr) >> 24) == 127) {
    std::string hosts;
    for (const std::string& h : hostNames)
      if (hosts.find("'" + h + "'") == std::string::npos) hosts += (hosts.empty() ? "'" : ", '") + h + "'";
    throw Error(ErrorCode::InvalidArgument, kContext + ": the processes run on several hosts (" + hosts +
                                                ") but this host's name '" + mine +
                                                "' resolves to the loopback address " +
                                                net::formatAddress(a).substr(0, net::formatAddress(a).find(':')) +
                                                ": set the transport address to one the other hosts reach");
  }
  char text[INET_ADDRSTRLEN] = {};
  inet_ntop(AF_INET, &a.sin_addr, text, sizeof text);
  return text;
}

SocketLinks connectSockets(Bootstrap& bootstrap, const TransportOptions& options,
                           const std::function<void(const std::string&)>& log) {
  const int me = bootstrap.rank();
  const int n = bootstrap.size();
  if (options.budget.count() <= 0)
    throw Error(ErrorCode::InvalidArgument,
                kContext + ": the budget must be > 0 ms (got " + std::to_string(options.budget.count()) + ")");

  // Where to listen: the option, or a default chosen from every process's host name.
  std::string address = options.address;
  {
    char host[kHostNameBytes] = {};
    if (::gethostname(host, sizeof host - 1) != 0) std::strcpy(host, "localhost");
    const std::vector<uint8_t> all = bootstrap.allGather(host, sizeof host);
    std::vector<std::string> hosts;
    for (int p = 0; p < n; ++p)
      hosts.emplace_back(reinterpret_cast<const char*>(all.data() + static_cast<std::size_t>(p) * kHostNameBytes));
    if (address.empty()) address = defaultListenAddress(hosts, me);
  }
  sockaddr_in bindAt = net::resolveIPv4(address, options.port, kContext, "transport address");
  Fd listener(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
  if (listener.fd < 0) throw Error(ErrorCode::IoError, kContext + ": socket() failed: " + net::sysError(errno));
  const int one = 1;
  setsockopt(listener.fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  if (::bind(listener.fd, reinterpret_cast<const sockaddr*>(&bindAt), sizeof bindAt) != 0)
    throw Error(ErrorCode::IoError, kContext + ": process " + std::to_string(me) + " cannot listen on " +
                                        net::formatAddress(bindAt) + ": " + net::sysError(errno) +
                                        " (port in use, or not an address of this host?)");
  if (::listen(listener.fd, n + 16) != 0)
    throw Error(ErrorCode::IoError, kContext + ": listen failed: " + net::sysError(errno));
  socklen_t len = sizeof bindAt;
  getsockname(listener.fd, reinterpret_cast<sockaddr*>(&bindAt), &len);

  // Every process's address; rank 0's record carries the job token.
  const bool given = options.token[0] != 0 || options.token[1] != 0;
  wire::AddressRecord mine{};
  mine.magic = wire::kAddressMagic;
  mine.version = wire::kProtocolVersion;
  mine.port = ntohs(bindAt.sin_port);
  mine.ipv4 = bindAt.sin_addr.s_addr;
  mine.process = static_cast<uint32_t>(me);
  if (me == 0) {
    const std::array<uint64_t, 2> t = given ? options.token : randomToken();
    mine.token[0] = t[0];
    mine.token[1] = t[1];
  }
  const std::vector<uint8_t> all = bootstrap.allGather(&mine, sizeof mine);
  std::vector<wire::AddressRecord> records(static_cast<std::size_t>(n));
  std::memcpy(records.data(), all.data(), all.size());
  for (int p = 0; p < n; ++p) {
    const wire::AddressRecord& r = records[static_cast<std::size_t>(p)];
    if (r.magic != wire::kAddressMagic)
      throw Error(ErrorCode::InvalidArgument, kContext + ": process " + std::to_string(p) +
                                                  " sent no socket transport address through the bootstrap (does "
                                                  "every process ask for the same transport?)");
    if (r.version != wire::kProtocolVersion)
      throw Error(ErrorCode::Unsupported,
                  kContext + ": process " + std::to_string(p) + " speaks inter-node protocol version " +
                      std::to_string(r.version) + ", process " + std::to_string(me) + " version " +
                      std::to_string(wire::kProtocolVersion) + " (every process must run the same mkernel build)");
    if (r.process != static_cast<uint32_t>(p))
      throw Error(ErrorCode::InvalidArgument, kContext + ": the bootstrap's slot " + std::to_string(p) +
                                                  " holds the address of process " + std::to_string(r.process));
  }
  std::array<uint64_t, 2> token{records[0].token[0], records[0].token[1]};
  if (token[0] == 0 && token[1] == 0)
    throw Error(ErrorCode::InvalidArgument, kContext + ": process 0 shared no job token");
  if (given && token != options.token)
    throw Error(ErrorCode::InvalidArgument,
                kContext + ": process " + std::to_string(me) + " was given another job token than process 0");
  Handshake hs(options, me, n, std::move(records), token, std::move(listener), log);
  return hs.run();
}

}  // namespace mk::proxy
