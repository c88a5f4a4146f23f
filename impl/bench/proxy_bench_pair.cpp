// mkernel — two processes for mk-proxy-bench (proxy_bench_pair.hpp).
#include "proxy_bench_pair.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <new>
#include <thread>

#include "mk/error.hpp"
#include "net/socket_util.hpp"

namespace mk::bench {
namespace {

/// Process 1's exit status for std::bad_alloc (the tools' "out of memory", mk/util/cli.hpp).
constexpr int kOutOfMemory = 5;

/// The pair's job key: drawn by runPair before it forks, so that both processes hold it and no other does.
JobKey& pairKey() {
  static JobKey key;
  return key;
}

}  // namespace

uint16_t freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a = net::resolveIPv4("127.0.0.1", 0, "mk-proxy-bench", "address");
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0)
    throw Error(ErrorCode::IoError, "mk-proxy-bench: cannot bind a port on 127.0.0.1: " + net::sysError(errno));
  socklen_t len = sizeof a;
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

TcpBootstrapOptions bootOptions(int me, uint16_t port) {
  TcpBootstrapOptions o;
  o.rank = me;
  o.size = 2;
  o.addr = "127.0.0.1";
  o.port = port;
  o.timeoutMs = 120000;  // a 256 MiB batch of a slow path takes seconds between two barriers
  o.key = pairKey();
  return o;
}

void runPair(const std::function<int(int, uint16_t, std::vector<MeasurementRecord>*)>& body,
             std::vector<MeasurementRecord>* records, double timeoutS) {
  const uint16_t port = freePort();
  pairKey() = JobKey::generate();
  std::fflush(stdout);
  std::fflush(stderr);
  const pid_t child = ::fork();
  if (child < 0) throw Error(ErrorCode::IoError, "mk-proxy-bench: fork failed: " + net::sysError(errno));
  if (child == 0) {
    ::prctl(PR_SET_PDEATHSIG, SIGKILL);
    int code = 1;
    try {
      std::vector<MeasurementRecord> dropped;
      code = body(1, port, &dropped);
    } catch (const std::bad_alloc&) {
      code = kOutOfMemory;  // process 0 says it, once
    } catch (const std::exception& e) {
      std::fprintf(stderr, "mk-proxy-bench: process 1: %s\n", e.what());
    }
    std::fflush(stdout);
    std::fflush(stderr);
    ::_exit(code);
  }
  int code = 1;
  std::string error;
  bool outOfMemory = false;
  try {
    code = body(0, port, records);
  } catch (const std::bad_alloc&) {
    outOfMemory = true;
  } catch (const std::exception& e) {
    error = e.what();
  }
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS);
  int status = 0;
  while (::waitpid(child, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      ::kill(child, SIGKILL);
      ::waitpid(child, &status, 0);
      throw Error(ErrorCode::Timeout, "mk-proxy-bench: process 1 did not finish within " +
                                          std::to_string(static_cast<int>(timeoutS)) + " s");
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  // Out of memory in either process is std::bad_alloc for the tool (exit 5), not a failed measurement.
  if (outOfMemory || (WIFEXITED(status) && WEXITSTATUS(status) == kOutOfMemory)) throw std::bad_alloc();
  if (!error.empty()) throw Error(ErrorCode::IoError, "mk-proxy-bench: process 0: " + error);
  if (code != 0 || !WIFEXITED(status) || WEXITSTATUS(status) != 0)
    throw Error(ErrorCode::IoError, "mk-proxy-bench: the measurement failed (process 0 code " + std::to_string(code) +
                                        ", process 1 status " + std::to_string(status) + ")");
}

int connectProbe(Bootstrap& boot) {
  int fd = -1;
  uint16_t port = 0;
  int listener = -1;
  if (boot.rank() == 1) {
    listener = ::socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in a = net::resolveIPv4("127.0.0.1", 0, "tcp probe", "address");
    if (::bind(listener, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 || ::listen(listener, 1) != 0)
      throw Error(ErrorCode::IoError, "tcp probe: cannot listen: " + net::sysError(errno));
    socklen_t len = sizeof a;
    ::getsockname(listener, reinterpret_cast<sockaddr*>(&a), &len);
    port = ntohs(a.sin_port);
  }
  const std::vector<uint8_t> ports = boot.allGather(&port, sizeof port);
  if (boot.rank() == 1) {
    fd = ::accept(listener, nullptr, nullptr);
    ::close(listener);
  } else {
    uint16_t theirs = 0;
    std::memcpy(&theirs, ports.data() + sizeof port, sizeof theirs);
    fd = ::socket(AF_INET, SOCK_STREAM, 0);
    const sockaddr_in a = net::resolveIPv4("127.0.0.1", theirs, "tcp probe", "address");
    if (::connect(fd, reinterpret_cast<const sockaddr*>(&a), sizeof a) != 0)
      throw Error(ErrorCode::IoError, "tcp probe: cannot connect: " + net::sysError(errno));
  }
  if (fd < 0) throw Error(ErrorCode::IoError, "tcp probe: accept failed: " + net::sysError(errno));
  net::noDelay(fd);
  return fd;
}

std::string cpuModel() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) {
      const auto colon = line.find(':');
      if (colon != std::string::npos) return line.substr(line.find_first_not_of(" \t", colon + 1));
    }
  return "unknown";
}

}  // namespace mk::bench
