// The CPU executor across processes when something goes wrong: a process killed mid-op, a rank that fails, a
// process that stops mid-op. Every surviving process ends in an mk::Error that names the process or rank at fault,
// within its budget; none hangs.
#include <doctest/doctest.h>
#include <signal.h>

#include <atomic>
#include <thread>

#include "mk/algorithms/algorithms.hpp"
#include "mk/exec/verify.hpp"
#include "mk/proxy/exec_port.hpp"
#include "proxy_test_util.hpp"

namespace {

using mkt::contains;

double secondsSince(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

mk::proxy::ExecPortOptions portOptions(int budgetMs) {
  mk::proxy::ExecPortOptions po;
  po.transport = mkt::socketOptions(nullptr, budgetMs);
  po.budget = std::chrono::milliseconds(budgetMs);
  return po;
}

/// Once the proxy of one of `ranks` has handled a command, run `act` (on a thread of its own).
std::thread whenProxyBusy(mk::proxy::ExecProxyPort& port, std::vector<uint32_t> ranks, std::function<void()> act) {
  return std::thread([&port, ranks, act] {
    for (;;) {
      for (uint32_t r : ranks)
        if (port.proxy().handled(r) > 0) return act();
      std::this_thread::sleep_for(std::chrono::microseconds(100));
    }
  });
}

/// Many proxy puts per process (8 chunks), so that a process stopped or killed once its proxy has handled the
/// first one still owes most of its sends: with 1 chunk a loaded machine could let it finish them all before the
/// watcher thread ran, and the op then succeeded.
mk::GenOptions bigOptions() {
  mk::GenOptions g;
  g.chunks = 8;
  return g;
}

mk::CollectiveSpec bigAllReduce() {
  mk::CollectiveSpec spec;
  spec.op = mk::CollOp::AllReduce;
  spec.algo = mk::Algorithm::Hierarchical;
  spec.count = 1u << 20;
  return spec;
}

}  // namespace

TEST_CASE("multinode faults: a process killed mid-op is named by every surviving process") {
  const std::vector<uint32_t> nodeOf = {0, 0, 1, 1, 2, 2};
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      3,
      [&](int node) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(node, 3, port));
        const std::vector<uint32_t> mine = mkt::ranksOf(nodeOf, node);
        mk::proxy::ExecProxyPort proxyPort(boot, 6, mine, portOptions(1000));
        std::thread killer;
        if (node == 1) killer = whenProxyBusy(proxyPort, mine, [] { ::kill(::getpid(), SIGKILL); });
        mk::ExecOptions opt;
        opt.localRanks = mine;
        opt.proxy = &proxyPort;
        opt.stallTimeout = std::chrono::milliseconds(3000);
        const mk::CollectiveSpec spec = bigAllReduce();
        const auto t0 = std::chrono::steady_clock::now();
        try {
          mk::verifyCollective(mk::generate(spec, nodeOf, bigOptions()), spec, 5, mk::InputKind::Uniform, opt);
          return 2;  // a run that lost a process cannot succeed
        } catch (const mk::Error& e) {
          std::fprintf(stderr, "node %d (%.2f s): %s\n", node, secondsSince(t0), e.what());
          if (!contains(e.message(), "process 1 (127.0.0.1:")) return 3;
          if (secondsSince(t0) > 3) return 4;
        }
        if (killer.joinable()) killer.join();
        return 0;
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 128 + SIGKILL);
  CHECK(codes[2] == 0);
}

TEST_CASE("multinode faults: a rank that fails tells the other processes, which name it") {
  // Rank 1's first step is a reduction with an unknown operator: its process fails, tells process 0, whose rank
  // waits for a signal from rank 1 that will never come.
  mk::Schedule s;
  s.nRanks = 2;
  s.nodeOf = {0, 1};
  s.nFlags = 1;
  s.buffers.push_back(mk::BufferDecl{"buf", mk::DType::Float32, mk::BufferKind::InOut, {16, 16}});
  s.lanes.resize(2);
  for (uint32_t r = 0; r < 2; ++r) {
    mk::Lane lane;
    lane.role = mk::LaneRole::InterSend;
    if (r == 1) {
      mk::Step bad;
      bad.kind = mk::StepKind::Reduce;
      bad.op = static_cast<mk::RedOp>(99);
      bad.count = 16;
      bad.dst = bad.a = bad.b = mk::bufRef(1, 0, 0);
      lane.steps.push_back(bad);
    }
    mk::Step put;
    put.kind = mk::StepKind::ProxyPut;
    put.count = 16;
    put.a = mk::bufRef(r, 0, 0);
    put.dst = mk::bufRef(1 - r, 0, 0);
    put.flags = mk::kStepSignal;
    put.flag = mk::FlagRef{1 - r, 0};
    put.value = 1;
    lane.steps.push_back(put);
    mk::Step wait;
    wait.kind = mk::StepKind::Wait;
    wait.flag = mk::FlagRef{r, 0};
    wait.value = 1;
    lane.steps.push_back(wait);
    s.lanes[r].push_back(lane);
  }
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      2,
      [&](int node) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(node, 2, port));
        const std::vector<uint32_t> mine = {static_cast<uint32_t>(node)};
        mk::proxy::ExecProxyPort proxyPort(boot, 2, mine, portOptions(2000));
        mk::HostMemory mem = mk::HostMemory::allocate(s, mine);
        mk::ExecOptions opt;
        opt.localRanks = mine;
        opt.proxy = &proxyPort;
        opt.stallTimeout = std::chrono::milliseconds(5000);
        const auto t0 = std::chrono::steady_clock::now();
        try {
          mk::execute(s, mem, opt);
          return 2;
        } catch (const mk::Error& e) {
          std::fprintf(stderr, "node %d (%.2f s): %s\n", node, secondsSince(t0), e.what());
          // The failing rank's own error, and on the other process the same error, named as process 1's.
          if (e.code() != mk::ErrorCode::InvalidSchedule) return 3;
          if (!contains(e.message(), "rank 1 lane 0 (inter-send) step 0 (reduce): unknown reduction op 99")) return 4;
          if (node == 0 && !contains(e.message(), "process 1 (127.0.0.1:")) return 5;
          if (secondsSince(t0) > 2) return 6;  // told at once, not found by a timeout
        }
        // The port is spent: the next run says why at once.
        try {
          mk::execute(s, mem, opt);
          return 7;
        } catch (const mk::Error& e) {
          return contains(e.message(), "failed in an earlier run") || contains(e.message(), "process 1") ? 0 : 8;
        }
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 0);
}

TEST_CASE("multinode faults: a process that stops mid-op is named when the budget ends") {
  const std::vector<uint32_t> nodeOf = {0, 0, 1, 1};
  const uint16_t port = mkt::freePort();
  const auto codes = mkt::forkRanks(
      2,
      [&](int node) -> int {
        mk::TcpBootstrap boot(mkt::bootOptions(node, 2, port));
        const pid_t me = ::getpid();
        const std::vector<uint8_t> pids = boot.allGather(&me, sizeof me);
        pid_t other = 0;
        std::memcpy(&other, pids.data() + (1 - node) * sizeof(pid_t), sizeof(pid_t));
        const std::vector<uint32_t> mine = mkt::ranksOf(nodeOf, node);
        mk::proxy::ExecProxyPort proxyPort(boot, 4, mine, portOptions(500));
        std::thread stopper;
        if (node == 1) stopper = whenProxyBusy(proxyPort, mine, [] { ::raise(SIGSTOP); });
        mk::ExecOptions opt;
        opt.localRanks = mine;
        opt.proxy = &proxyPort;
        opt.stallTimeout = std::chrono::milliseconds(500);
        const mk::CollectiveSpec spec = bigAllReduce();
        const auto t0 = std::chrono::steady_clock::now();
        int rc = 2;
        try {
          mk::verifyCollective(mk::generate(spec, nodeOf, bigOptions()), spec, 5, mk::InputKind::Uniform, opt);
        } catch (const mk::Error& e) {
          std::fprintf(stderr, "node %d (%.2f s): %s\n", node, secondsSince(t0), e.what());
          // Either its lanes stall waiting for rank 2 or 3's proxyputs, or a send to process 1 stalls.
          const bool named = contains(e.message(), "raised through the proxy by rank(s) 2") ||
                             contains(e.message(), "raised through the proxy by rank(s) 3") ||
                             contains(e.message(), "process 1 (127.0.0.1:");
          // Detection takes the stall budget plus, when the local proxy is the one blocked, its send budget:
          // about a second, far below the fork's 30 s (a hang), with room for a loaded or sanitized build.
          rc = named ? (secondsSince(t0) < 6 ? 0 : 4) : 3;
        }
        ::kill(other, SIGKILL);  // the stopped process
        if (stopper.joinable()) stopper.join();
        return rc;
      },
      30);
  CHECK(codes[0] == 0);
  CHECK(codes[1] == 128 + SIGKILL);
}
