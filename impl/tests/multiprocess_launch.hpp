// Test helpers for the multi-process mode: a free TCP port, N forked ranks running a function, and the
// test binary re-launched as N ranks (fork + exec with RANK WORLD_SIZE LOCAL_RANK MASTER_ADDR MASTER_PORT).
// Every child is waited for under a deadline and killed (by its pid) when it overruns: no orphans.
#pragma once

#include <doctest/doctest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "mk/bootstrap.hpp"

extern char** environ;

namespace mkt {

/// Exit code reported for a child killed at the deadline.
inline constexpr int kChildTimedOut = 124;

/// A TCP port on 127.0.0.1 that was free a moment ago (bind to port 0, read it back, release it).
inline uint16_t freePort() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  REQUIRE(fd >= 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  REQUIRE(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) == 0);
  socklen_t len = sizeof a;
  REQUIRE(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) == 0);
  ::close(fd);
  return ntohs(a.sin_port);
}

/// The job key of the test job meeting on `port`: the same in every process that knows the port (a forked rank
/// computes it for itself), another for another port. A test key, not a secret.
inline mk::JobKey testJobKey(uint16_t port) {
  char hex[64];
  std::snprintf(hex, sizeof hex, "6d6b65726e656c2d746573742d6b6579%08x", static_cast<unsigned>(port));
  return mk::JobKey::fromHex(hex, "the test key");
}

/// Options of a TCP bootstrap of `size` processes meeting at 127.0.0.1:port, with the port's test job key.
inline mk::TcpBootstrapOptions bootOptions(int rank, int size, uint16_t port, double timeoutMs = 5000) {
  mk::TcpBootstrapOptions o;
  o.key = testJobKey(port);
  o.rank = rank;
  o.size = size;
  o.addr = "127.0.0.1";
  o.port = port;
  o.timeoutMs = timeoutMs;
  return o;
}

/// Wait for every pid until `timeoutS`; kill the ones still running. Exit codes in pid order
/// (128 + signal for a child killed by a signal, kChildTimedOut for one killed at the deadline).
inline std::vector<int> waitChildren(const std::vector<pid_t>& pids, double timeoutS) {
  std::vector<int> codes(pids.size(), -1);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(timeoutS);
  size_t left = pids.size();
  while (left > 0) {
    for (size_t i = 0; i < pids.size(); ++i) {
      if (codes[i] != -1) continue;
      int st = 0;
      const pid_t r = ::waitpid(pids[i], &st, WNOHANG);
      if (r == pids[i]) {
        codes[i] = WIFEXITED(st) ? WEXITSTATUS(st) : 128 + (WIFSIGNALED(st) ? WTERMSIG(st) : 0);
        --left;
      }
    }
    if (left == 0) break;
    if (std::chrono::steady_clock::now() > deadline) {
      for (size_t i = 0; i < pids.size(); ++i)
        if (codes[i] == -1) {
          ::kill(pids[i], SIGKILL);
          int st = 0;
          ::waitpid(pids[i], &st, 0);
          codes[i] = kChildTimedOut;
        }
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  return codes;
}

/// Fork `n` children; child r runs body(r) and exits with its return value (1 if it throws). For tests
/// that do not touch CUDA in the parent (a forked CUDA context is unusable).
inline std::vector<int> forkRanks(int n, const std::function<int(int)>& body, double timeoutS) {
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);
      int code = 1;
      try {
        code = body(r);
      } catch (const std::exception& e) {
        std::fprintf(stderr, "rank %d: uncaught: %s\n", r, e.what());
      }
      std::fflush(stdout);
      std::fflush(stderr);
      ::_exit(code);
    }
    pids.push_back(pid);
  }
  return waitChildren(pids, timeoutS);
}

/// Re-run this test binary's test case `testName` as `n` ranks (exec, so each child starts CUDA fresh),
/// with RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR=127.0.0.1 / MASTER_PORT (a free port) set, plus
/// MK_JOB_KEY (the port's test key) and `extraEnv` ("NAME=value"). LOCAL_RANK is the rank, or the rank modulo `gpus`
/// when it is > 0 (ranks sharing the GPUs, CommConfig::shareGpus). Returns the exit codes.
inline std::vector<int> execRanks(int n, const std::string& testName, double timeoutS,
                                  const std::vector<std::string>& extraEnv = {}, int gpus = 0) {
  const uint16_t port = freePort();
  char exe[4096] = {};
  const ssize_t len = ::readlink("/proc/self/exe", exe, sizeof exe - 1);
  REQUIRE(len > 0);
  std::fflush(stdout);
  std::fflush(stderr);
  std::vector<pid_t> pids;
  for (int r = 0; r < n; ++r) {
    // Everything the child needs is built before fork: after fork only execve runs.
    std::vector<std::string> env;
    for (char** e = environ; *e; ++e) {
      const std::string kv = *e;
      bool ours = false;
      for (const char* k :
           {"RANK=", "WORLD_SIZE=", "LOCAL_RANK=", "MASTER_ADDR=", "MASTER_PORT=", "MK_JOB_KEY=", "MK_JOB_KEY_FILE="})
        ours = ours || kv.rfind(k, 0) == 0;
      if (!ours) env.push_back(kv);
    }
    env.push_back("RANK=" + std::to_string(r));
    env.push_back("WORLD_SIZE=" + std::to_string(n));
    env.push_back("LOCAL_RANK=" + std::to_string(gpus > 0 ? r % gpus : r));
    env.push_back("MASTER_ADDR=127.0.0.1");
    env.push_back("MASTER_PORT=" + std::to_string(port));
    env.push_back("MK_JOB_KEY=" + testJobKey(port).hex());
    for (const auto& kv : extraEnv) env.push_back(kv);
    std::vector<char*> envp;
    for (auto& kv : env) envp.push_back(kv.data());
    envp.push_back(nullptr);
    // doctest splits a filter at ',': escaped, a name that holds one still selects its own case (and only it).
    std::string tc = "-tc=";
    for (char ch : testName) {
      if (ch == ',') tc += '\\';
      tc += ch;
    }
    std::string noIntro = "--no-intro";
    std::vector<char*> argv{exe, tc.data(), noIntro.data(), nullptr};
    const pid_t pid = ::fork();
    REQUIRE(pid >= 0);
    if (pid == 0) {
      ::prctl(PR_SET_PDEATHSIG, SIGKILL);  // a launcher killed by an outer timeout takes its ranks along
      ::execve(exe, argv.data(), envp.data());
      ::_exit(127);
    }
    pids.push_back(pid);
  }
  return waitChildren(pids, timeoutS);
}

/// True in a process started by execRanks, or by an MPI launcher (`mpirun -np 2 <test> -tc=<case>`, where
/// Communicator::createFromEnvironment bootstraps through MPI): the test body runs as one rank.
inline bool isRankProcess() {
  if (std::getenv("RANK") != nullptr && std::getenv("MASTER_PORT") != nullptr) return true;
  const bool mpiLaunched = std::getenv("OMPI_COMM_WORLD_SIZE") != nullptr || std::getenv("PMI_SIZE") != nullptr;
  return mpiLaunched && std::getenv("MASTER_ADDR") == nullptr;
}

}  // namespace mkt
