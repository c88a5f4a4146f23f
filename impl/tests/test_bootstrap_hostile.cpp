// A two-process CPU-executor job with a hostile process beside it on the rendezvous port: every way a stranger can
// talk to rank 0 (connect and close, stay silent, send half a handshake, speak the old unauthenticated protocol,
// claim rank 1 without the key) is refused and logged, none of it takes a rank or stops the job, and the job's
// collectives then run through the proxy and the socket transport and match the reference element by element.
//
// The stranger restates the handshake's wire layout on its own (48-byte challenge, 80-byte claim, 48-byte verdict):
// a change of the protocol must show up here as a test to update, not pass unnoticed.
#include <doctest/doctest.h>

#include <fcntl.h>
#include <poll.h>

#include <cstring>
#include <mutex>

#include "mk/algorithms/algorithms.hpp"
#include "mk/exec/verify.hpp"
#include "mk/job_key.hpp"
#include "mk/proxy/exec_port.hpp"
#include "proxy_test_util.hpp"

namespace {

constexpr uint32_t kChallengeMagic = 0x4d4b4241u;
constexpr uint32_t kClaimMagic = 0x4d4b4250u;
constexpr uint32_t kVerdictMagic = 0x4d4b4256u;
constexpr double kHandshakeMs = 300;

/// A plain blocking connection to 127.0.0.1:port, retried until rank 0 listens (-1 after 10 s).
int dial(uint16_t port) {
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = htons(port);
  for (int attempt = 0; attempt < 1000; ++attempt) {
    const int fd = ::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0) {
      timeval tv{5, 0};  // no read of the stranger's may hang the test
      setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
      return fd;
    }
    ::close(fd);
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  return -1;
}

bool readAll(int fd, void* p, size_t n) {
  auto* c = static_cast<uint8_t*>(p);
  while (n > 0) {
    const ssize_t r = ::recv(fd, c, n, 0);
    if (r <= 0) return false;
    c += r;
    n -= static_cast<size_t>(r);
  }
  return true;
}

/// Whether rank 0 closes `fd` within `ms` (reads return end of file or a reset), draining what it sends first.
bool closedWithin(int fd, int ms) {
  const auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(ms);
  uint8_t sink[256];
  while (std::chrono::steady_clock::now() < end) {
    pollfd p{fd, POLLIN, 0};
    if (::poll(&p, 1, 50) > 0) {
      const ssize_t r = ::recv(fd, sink, sizeof sink, MSG_DONTWAIT);
      if (r == 0 || (r < 0 && errno == ECONNRESET)) return true;
    }
  }
  return false;
}

/// The stranger: returns 0 when every attempt was refused the way the protocol says, else the number of the attempt
/// that got further. Signals `go` (a pipe) once rank 0 has dropped its silent connection, so that the real rank 1
/// arrives after the stranger claimed its rank and while a half-sent handshake still hangs.
int stranger(uint16_t port, int go) {
  // 1. connect and close at once.
  int fd = dial(port);
  if (fd < 0) return 100;
  ::close(fd);
  // 2. the unauthenticated hello of protocol 1: "I am rank 1 of 2".
  fd = dial(port);
  uint8_t challenge[48];
  if (!readAll(fd, challenge, sizeof challenge)) return 2;
  uint32_t magic = 0;
  std::memcpy(&magic, challenge, 4);
  if (magic != kChallengeMagic) return 3;
  const uint32_t oldHello[4] = {0x4d4b4248u, 1, 2, 0};
  ::send(fd, oldHello, sizeof oldHello, MSG_NOSIGNAL);
  if (!closedWithin(fd, 3000)) return 4;
  ::close(fd);
  // 3. a claim to rank 1 signed with another key: refused as "not the job's key", never admitted.
  fd = dial(port);
  if (!readAll(fd, challenge, sizeof challenge)) return 5;
  uint8_t claim[80] = {};
  const uint32_t head[4] = {kClaimMagic, 2, 1, 2};
  std::memcpy(claim, head, sizeof head);
  mk::randomBytes(claim + 16, 32);
  const mk::JobKey other = mk::JobKey::generate();
  const mk::JobKey::Mac forged = other.mac(claim, 48);
  std::memcpy(claim + 48, forged.data(), forged.size());
  ::send(fd, claim, sizeof claim, MSG_NOSIGNAL);
  uint8_t verdict[48] = {};
  if (!readAll(fd, verdict, sizeof verdict)) return 6;
  uint32_t status = 99;
  std::memcpy(&magic, verdict, 4);
  std::memcpy(&status, verdict + 4, 4);
  if (magic != kVerdictMagic || status != 1) return 7;  // 1: not the job's key (0 would be "admitted")
  if (!closedWithin(fd, 3000)) return 8;
  ::close(fd);
  // 4. garbage of the wrong size, then close.
  fd = dial(port);
  if (!readAll(fd, challenge, sizeof challenge)) return 9;
  ::send(fd, "hello", 5, MSG_NOSIGNAL);
  ::close(fd);
  // 5. a silent connection: dropped when its handshake budget ends, the rendezvous still waiting for rank 1.
  const int silent = dial(port);
  if (!readAll(silent, challenge, sizeof challenge)) return 10;
  if (!closedWithin(silent, static_cast<int>(kHandshakeMs) + 3000)) return 11;
  ::close(silent);
  // 6. half a claim, left hanging while the real rank 1 joins.
  const int half = dial(port);
  if (!readAll(half, challenge, sizeof challenge)) return 12;
  ::send(half, claim, 40, MSG_NOSIGNAL);
  if (::write(go, "x", 1) != 1) return 13;
  if (!closedWithin(half, static_cast<int>(kHandshakeMs) + 3000)) return 14;
  ::close(half);
  return 0;
}

/// One node of the job: {0, 0, 1, 1}, node 0 = ranks 0 and 1. Node 1 waits for `go` (at most 10 s).
int node(int me, uint16_t port, int go, std::vector<std::string>* refusals) {
  if (me == 1) {
    pollfd p{go, POLLIN, 0};
    if (::poll(&p, 1, 10000) != 1) return 20;
  }
  const std::vector<uint32_t> nodeOf = {0, 0, 1, 1};
  mk::TcpBootstrapOptions bo = mkt::bootOptions(me, 2, port, 15000);
  bo.handshakeMs = kHandshakeMs;
  std::mutex mu;
  bo.log = [&](const std::string& line) {
    std::fprintf(stderr, "log: %s\n", line.c_str());
    std::lock_guard<std::mutex> lock(mu);
    refusals->push_back(line);
  };
  mk::TcpBootstrap boot(bo);
  if (me == 0 && boot.refusedConnections() != 6) {
    std::fprintf(stderr, "rank 0 refused %zu connections, expected 6\n", boot.refusedConnections());
    return 21;
  }
  const std::vector<uint32_t> mine = mkt::ranksOf(nodeOf, me);
  mk::proxy::ExecPortOptions po;
  po.transport = mkt::socketOptions(nullptr, 5000);
  mk::proxy::ExecProxyPort proxyPort(boot, static_cast<uint32_t>(nodeOf.size()), mine, po);
  mk::ExecOptions opt;
  opt.localRanks = mine;
  opt.proxy = &proxyPort;
  opt.stallTimeout = std::chrono::milliseconds(5000);
  uint64_t seed = 7;
  for (const mk::CollOp op : {mk::CollOp::AllReduce, mk::CollOp::AllGather, mk::CollOp::ReduceScatter})
    for (const uint64_t count : {uint64_t{1}, uint64_t{4099}}) {
      mk::CollectiveSpec spec;
      spec.op = op;
      spec.algo = mk::Algorithm::Hierarchical;
      spec.dtype = mk::DType::Float32;
      spec.count = count;
      const mk::Schedule s = mk::generate(spec, nodeOf, mk::GenOptions{});
      const mk::VerifyResult v = mk::verifyCollective(s, spec, seed++, mk::InputKind::Uniform, opt);
      if (!v.ok) {
        std::fprintf(stderr, "node %d: %s count %llu: %s\n", me, mk::toString(op),
                     static_cast<unsigned long long>(count), v.detail.c_str());
        return 22;
      }
    }
  uint64_t handled = 0;
  for (uint32_t r : mine) handled += proxyPort.proxy().handled(r);
  return handled > 0 ? 0 : 23;
}

bool anyContains(const std::vector<std::string>& lines, const std::string& part) {
  for (const auto& l : lines)
    if (l.find(part) != std::string::npos) return true;
  return false;
}

}  // namespace

TEST_CASE("bootstrap: a stranger on the rendezvous port learns nothing, writes nothing and cannot stop the job") {
  const uint16_t port = mkt::freePort();
  int go[2];
  REQUIRE(::pipe(go) == 0);
  // Each child reports its refusal lines through its exit code's checks; rank 0 also writes them to stderr.
  const auto codes = mkt::forkRanks(
      3,
      [&](int who) {
        if (who == 2) return stranger(port, go[1]);
        std::vector<std::string> refusals;
        const int code = node(who, port, go[0], &refusals);
        if (code != 0 || who != 0) return code;
        // What rank 0 logged names each kind of refusal (and never a rank taken by the stranger).
        // The first, a connection closed at once, reads as closed or reset depending on timing: counted only. The
        // half claim is dropped when rank 1 completes the rendezvous, or by its budget on a slow machine.
        for (const char* reason : {"bootstrap protocol 1", "does not hold the job's key", "sent nothing within 300 ms",
                                   "closed the connection after 5 handshake bytes"})
          if (!anyContains(refusals, reason)) {
            std::fprintf(stderr, "rank 0 logged no refusal with '%s'\n", reason);
            return 24;
          }
        if (!anyContains(refusals, "still in its handshake when every rank had joined") &&
            !anyContains(refusals, "sent 40 of 80 handshake bytes"))
          return 25;
        return 0;
      },
      60);
  ::close(go[0]);
  ::close(go[1]);
  CHECK(codes[0] == 0);  // rank 0: the refusals as expected, every collective verified
  CHECK(codes[1] == 0);  // rank 1: every collective verified
  CHECK(codes[2] == 0);  // the stranger: refused at every step, never admitted
}

TEST_CASE("bootstrap: a rank given another job key is refused at once, and the job's rank 0 names it at the end") {
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      2,
      [&](int r) {
        mk::TcpBootstrapOptions o = mkt::bootOptions(r, 2, port, r == 0 ? 1500 : 5000);
        if (r == 1) o.key = mk::JobKey::generate();
        try {
          mk::TcpBootstrap boot(o);
          return 10;
        } catch (const mk::Error& e) {
          std::fprintf(stderr, "rank %d: %s\n", r, e.what());
          const std::string m = e.message();
          if (r == 1)  // told at once, not after its budget
            return e.code() == mk::ErrorCode::InvalidArgument && m.find("not the job's key") != std::string::npos ? 0
                                                                                                                  : 11;
          return e.code() == mk::ErrorCode::Timeout && m.find("rank(s) 1 never connected") != std::string::npos &&
                         m.find("refused meanwhile: 1 connection(s)") != std::string::npos &&
                         m.find("does not hold the job's key") != std::string::npos
                     ? 0
                     : 12;
        }
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}
